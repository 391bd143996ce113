"""DATA AND MODELS: what is trained. May import :mod:`bno_hvd.common` (and torch, torchvision);
nothing of the library, the
training application, the processes, the lab or the CLI.

- :mod:`.catalog` - names and sizes of the built-in datasets and models (no torch: the CLI starts fast)
- :mod:`.images` - Fashion-MNIST, MNIST, synthetic data, image folders; augmentation; offline roots
- :mod:`.models` - the baseline CNN, torchvision models by name, ``package.module:function``
- :mod:`.corpus` - text documents: Debian's fortunes, or a directory of .txt/.jsonl files
- :mod:`.tokens` - the offline BPE tokenizer, sequences of their own lengths, padded batches
- :mod:`.gpt` - language models: gpt-mini, or ``package.module:function``

Re-exported (loaded on first use): what the examples read, offline, as a script reads torchvision's
datasets (the built-in Fashion-MNIST's root; the built-in text corpus, tokenized)::

    from bno_hvd.data import torchvision_root, load_datasets, load_text_datasets
"""

import importlib

_EXPORTS = {
    "images": ("Datasets", "load_datasets", "torchvision_root"),
    "models": ("build_model",),
    "tokens": ("load_text_datasets",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module 'bno_hvd.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
