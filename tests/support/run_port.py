"""Run ``examples/horovod_mnist.py``, ``examples/ddp_mnist.py`` or ``examples/ddp_text.py`` (or a plain
twin) unchanged, in float64, and keep what the port's tests compare.

Usage (under horovodrun/mpirun/torchrun): ``python tests/support/run_port.py OUT_DIR SCRIPT [script args]``

- torch's default dtype is float64 before the example runs (torchvision's ``ToTensor`` follows it,
  so the data, the model and the gradients are float64);
- a global forward hook (torch's public ``register_module_forward_hook``) notes the size of the
  batch of every training forward of the script's ``Net`` (or ``GPT``: also the passes that
  measure its cost, on rank 0) (``OUT_DIR/sizes-RANK.json``), and rank 0 saves its parameters at
  the end (``OUT_DIR/model.pt``);
- the hook also keeps the job's default process group until the script is done, so that its last
  reference is this file's and not the script's DDP model (see ``main``);
- ``OUT_DIR/done-RANK`` says this rank's work is done (all that follows is its exit).
"""

import gzip
import json
import os
import runpy
import struct
import sys

import torch


def write_fashion_subset(root, source: str, train: int, test: int) -> str:
    """The first ``train``/``test`` samples of the real Fashion-MNIST IDX files in ``source``,
    written where ``torchvision.datasets.FashionMNIST(root)`` reads them; returns ``root``."""
    raw = os.path.join(root, "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for split, count in (("train", train), ("t10k", test)):
        for kind in ("images-idx3", "labels-idx1"):
            stem = f"{split}-{kind}-ubyte"
            with gzip.open(os.path.join(source, stem + ".gz"), "rb") as fh:
                data = fh.read()
            dims = data[3]
            shape = list(struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims]))
            per_sample = 1 if dims == 1 else shape[1] * shape[2]
            start = 4 + 4 * dims
            with open(os.path.join(raw, stem), "wb") as out:
                out.write(data[:4] + struct.pack(f">{dims}I", count, *shape[1:]))
                out.write(data[start : start + count * per_sample])
    return str(root)


MODELS = (
    "Net",
    "GPT",
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
)  # the examples' models (ddp_text.py: GPT; hf_trainer_text.py: GPT-2)


def keep_float64_in_causal_lm_loss() -> None:
    """transformers' causal-LM loss casts the logits to float32 (``logits = logits.float()``, meant
    for float16 models), which would round a float64 run's loss to float32; here it keeps them as
    they are, the loss otherwise transformers' own (its source with that one line changed). The
    function object stays transformers' (its code is swapped): the Trainer tells a loss that shifts
    the labels by ``LOSS_MAPPING[...] is ForCausalLMLoss`` and counts a sequence's predictions,
    ``num_items_in_batch``, by it (a new function there made it count every label, one too many)."""
    import inspect

    from transformers.loss import loss_utils

    source = inspect.getsource(loss_utils.ForCausalLMLoss)
    assert "    logits = logits.float()\n" in source, "transformers' ForCausalLMLoss changed: update this copy"
    scope = {}
    exec(
        compile(source.replace("    logits = logits.float()\n", ""), loss_utils.__file__, "exec"),
        vars(loss_utils),
        scope,
    )
    loss_utils.ForCausalLMLoss.__code__ = scope["ForCausalLMLoss"].__code__


def main() -> None:
    out, script = sys.argv[1:3]
    sys.argv = [script, *sys.argv[3:]]
    torch.set_default_dtype(torch.float64)
    with open(script) as fh:
        if "from transformers import" in fh.read():
            keep_float64_in_causal_lm_loss()
    seen = {"model": None, "sizes": [], "group": None}

    def note(module, inputs, output):
        if type(module).__name__ in MODELS:
            seen["model"] = module
            if torch.distributed.is_initialized():
                if seen["group"] is None:
                    seen["group"] = torch.distributed.group.WORLD
                seen["rank"] = torch.distributed.get_rank()  # bno.elastic: the rank in the last generation
            if module.training:  # (a transformers model takes its inputs by keyword: its logits' rows)
                seen["sizes"].append(int(inputs[0].shape[0] if inputs else output.logits.shape[0]))

    def tokens(module, args, kwargs, output):  # a transformers model's labels to predict (-100: none)
        labels = kwargs.get("labels")
        if type(module).__name__ in MODELS and module.training and labels is not None:
            seen.setdefault("tokens", []).append(int((labels[:, 1:] != -100).sum()))

    handle = torch.nn.modules.module.register_module_forward_hook(note)
    token_handle = torch.nn.modules.module.register_module_forward_hook(tokens, with_kwargs=True)
    runpy.run_path(script, run_name="__main__")
    rank = int(
        os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", seen.pop("rank", 0)))
    )  # mpirun's, torchrun's
    if seen["model"] is not None:  # (an elastic worker ran none: a joiner whose generation had no update left)
        with open(os.path.join(out, f"sizes-{rank}.json"), "w") as fh:
            json.dump(seen["sizes"], fh)
        if "tokens" in seen:
            with open(os.path.join(out, f"tokens-{rank}.json"), "w") as fh:
                json.dump(seen["tokens"], fh)
        if rank == 0:
            torch.save(seen["model"].state_dict(), os.path.join(out, "model.pt"))
        open(os.path.join(out, f"done-{rank}"), "w").close()
    # Why the group is kept: a DDP script (torch's tutorial, the plain twin) calls destroy_process_group()
    # while its DDP model lives; the model, freed when main() returns, then holds the last reference to
    # the Gloo group, and torch frees it from the DDP's Reducer with the GIL held: ~ProcessGroupGloo
    # joins its worker thread, which may still be freeing the last allreduce's work and waits for the
    # GIL, so the rank never exits (pytorch/pytorch#56297). Dropped here, from Python, the group is
    # freed with the GIL released (torch's Python binding of a process group does that).
    handle.remove()
    token_handle.remove()
    group = seen.pop("group")
    seen.clear()
    from bno_hvd.processes.torchenv import finish_process_group  # (nothing of bno-hvd before the script)

    finish_process_group()  # models first (gc), then a group the script left (pytorch/pytorch#190489)
    del group


if __name__ == "__main__":
    main()
