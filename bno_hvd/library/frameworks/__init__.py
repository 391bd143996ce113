"""THE FRAMEWORK ADAPTERS: bno-hvd where users train today, each a thin room over the DDP drop-in
(the Balancer as sampler, the weighting communication hook, ``bno.exact``), so that a framework's
version change touches one file. Each module imports its framework on import and says in one line
what to install when it is missing; ``bno_hvd`` loads them on first use (``bno.lightning``,
``bno.accelerate``, ``bno.hf``). May import what :mod:`bno_hvd.library` may, and the library.

- :mod:`.lightning` - PyTorch Lightning 2.x: a strategy named in one place (``bno.lightning``)
- :mod:`.lightning_sitout` - a rank given 0 samples sits the update out inside Lightning's loop
- :mod:`.accelerate` - Hugging Face Accelerate 1.x: a script built on ``accelerator.prepare`` (``bno.accelerate``)
- :mod:`.trainer` - the Hugging Face ``Trainer`` (transformers 5.x), batches split by token cost (``bno.hf``)
"""
