"""Hypothesis strategies for the user inputs that are directories or objects (issue 15):
checkpoint directories (real checkpoints with one place changed, foreign and damaged files),
``--model`` specs (with fixture modules of user code), image folders (odd names, empty class
folders, non-image and truncated files, symlink loops). Text and JSON files: fuzz_strategies.py.
"""

from __future__ import annotations

import importlib.util
import io

from hypothesis import strategies as st
from support.fuzz_strategies import any_json, mostly, odd_names, paths_in, replaced, texts

# -- checkpoint directories -------------------------------------------------------------------

ckpt_names = st.one_of(
    st.integers(0, 99_999_999).map(lambda u: f"ckpt-{u:08d}.pt"),
    st.sampled_from(["ckpt-00000010.pt", "ckpt-1.pt", "ckpt-00000010.pt.tmp.123", "ckpt-.pt", "model.pt"]),
    odd_names.map(lambda s: f"ckpt-{s}.pt"),
)
config_values = st.one_of(any_json, st.lists(st.integers(1, 64)).map(tuple), st.sampled_from(["cnn", "balanced", 32]))


@st.composite
def config_dicts(draw):
    """A checkpoint's config: this run's (the defaults) in part, with some values changed."""
    from bno_hvd.training.checkpoint import STATE_FLAGS
    from bno_hvd.training.config import TrainConfig

    current = TrainConfig().to_dict()
    keys = draw(st.lists(st.sampled_from(sorted(current)), max_size=len(current), unique=True))
    saved = {k: current[k] for k in keys}
    for key in draw(st.lists(mostly(st.sampled_from(STATE_FLAGS), texts(max_size=8)), max_size=3)):
        saved[key] = draw(config_values)
    return saved


class OneRank:
    """The collectives a Balancer and restore_training_state use, for a job of one rank (no MPI here)."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def bcast(self, obj, root=0):
        return obj

    def scatter(self, objs, root=0):
        return objs[0]

    def gather(self, obj, root=0):
        return [obj]


_REAL_STATE = []


def real_checkpoint_state() -> dict:
    """What save_training_state writes for a one-rank run of the default config, after one update."""
    if not _REAL_STATE:
        import random

        import numpy as np
        import torch

        from bno_hvd.allocation import make_strategy
        from bno_hvd.data.models import BaselineCNN
        from bno_hvd.library.balancer import Balancer
        from bno_hvd.training.config import TrainConfig

        cfg = TrainConfig(dataset="synthetic")
        model = BaselineCNN()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.zeros(2, 1, 28, 28)).sum().backward()
        optimizer.step()
        balancer = Balancer(OneRank(), make_strategy(cfg.strategy, 1, cfg.base_batch_size), 4096)
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        _REAL_STATE.append(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "balancer": balancer.state_dict(),
                "rng": [rng],
                "config": cfg.to_dict(),
            }
        )
    return _REAL_STATE[0]


@st.composite
def torch_payload(draw) -> bytes:
    """A file torch.save wrote: a real checkpoint with one place changed, or any other object."""
    import torch

    odd = st.one_of(
        any_json,
        st.sampled_from(["tensor", "bytes-tensor", "array", "set"]),
        st.lists(st.integers(-3, 3), max_size=3).map(tuple),
    )
    kind = draw(st.integers(0, 5))
    if kind <= 3:  # a real checkpoint with one value replaced (or removed)
        state = real_checkpoint_state()
        path = draw(st.sampled_from(list(paths_in(state))))
        value = draw(odd)
        if value == "tensor":
            value = torch.full((draw(st.integers(0, 3)),), draw(st.floats(width=32)))
        elif value == "bytes-tensor":
            value = torch.zeros(draw(st.integers(0, 5000)), dtype=torch.uint8)
        elif value == "array":
            import numpy as np

            value = np.arange(draw(st.integers(0, 5)))
        elif value == "set":
            value = {1, 2}
        obj = replaced(state, path, value, delete=draw(st.booleans()))
    elif kind == 4:
        obj = {"model": {}, "optimizer": {}, "balancer": {}, "config": draw(mostly(config_dicts(), any_json))}
    else:
        obj = draw(any_json)
    buf = io.BytesIO()
    torch.save(obj, buf)
    raw = buf.getvalue()
    if draw(st.integers(0, 6)) == 0:  # cut short, as a full disk or a killed copy leaves it
        raw = raw[: draw(st.integers(0, len(raw)))]
    return raw


ckpt_content = st.one_of(
    torch_payload(), torch_payload(), st.binary(max_size=300), st.just(b""), st.just(b"PK\x03\x04")
)
ckpt_entry = st.tuples(
    ckpt_names, st.one_of(ckpt_content, ckpt_content, ckpt_content, st.sampled_from(["dir", "link"]))
)
checkpoint_dirs = st.fixed_dictionaries(
    {
        "dir": mostly(st.just("ck"), st.sampled_from(["[ck]", "ck*", "ck?", "c[!k]"]), odd_names),
        "files": st.lists(ckpt_entry, max_size=4, unique_by=lambda e: e[0]),
    }
)


# -- model specs (--model) --------------------------------------------------------------------

FIXTURE_MODULE = "bno_fuzz_models"
FIXTURE_SOURCE = '''
"""Model functions a user might point --model at (written by tests/cli/test_fuzz_inputs.py)."""
from torch import nn
CONSTANT = 3
def ok(num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))
def no_args():
    return nn.Identity()
def returns_none():
    return None
def returns_text(num_classes):
    return "a model"
def raises(num_classes):
    raise ValueError("first line\\nsecond line\\r\\nthird")
def raises_empty():
    raise RuntimeError()
def recurses(num_classes=1):
    return recurses(num_classes)
def needs_more(num_classes, depth):
    return nn.Identity()
def keyword_only(*, num_classes):
    return nn.Linear(1, num_classes)
class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.fc = nn.Linear(784, num_classes)
'''
BROKEN_MODULE = "bno_fuzz_broken"
BROKEN_SOURCE = 'raise ImportError("cannot load\\nthe weights")\n'
FIXTURE_FUNCTIONS = ["ok", "no_args", "returns_none", "returns_text", "raises", "raises_empty", "recurses"]
FIXTURE_FUNCTIONS += ["needs_more", "keyword_only", "Net", "CONSTANT", "absent", "__name__", "nn"]
SMALL_TORCHVISION = ["resnet18", "squeezenet1_1", "mobilenet_v3_small", "shufflenet_v2_x0_5"]

model_specs = st.one_of(
    st.sampled_from(["cnn", "cnn", *SMALL_TORCHVISION, "lenet", "", ":", "a:", ":b", "a:b:c", ".x:y"]),
    mostly(st.sampled_from(FIXTURE_FUNCTIONS), texts(max_size=10)).map(lambda f: f"{FIXTURE_MODULE}:{f}"),
    texts(max_size=10).map(lambda f: f"{BROKEN_MODULE}:{f}"),
    st.builds(lambda m, f: f"{m}:{f}", texts(max_size=10), texts(max_size=10)),
    texts(max_size=20),
)
model_inputs = st.fixed_dictionaries(
    {
        "spec": model_specs,
        "num_classes": mostly(st.integers(1, 1000), st.integers(max_value=0)),
        "shape": st.one_of(st.just((1, 28, 28)), st.tuples(st.sampled_from([1, 3]), st.integers(1, 48))),
    }
)


# -- image folders (--dataset imagefolder --data-dir DIR) -------------------------------------

IMAGE_MODES = {
    "PNG": ["RGB", "L", "RGBA", "P", "1", "I;16", "LA"],
    "JPEG": ["RGB", "L", "CMYK"],
    "GIF": ["P", "L"],
    "BMP": ["RGB", "L", "1"],
    "TIFF": ["RGB", "F", "I;16", "CMYK"],
}
EXTENSIONS = {"PNG": ".png", "JPEG": ".jpg", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}


def tiny_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "PNG")
    return buf.getvalue()


@st.composite
def image_bytes(draw):
    from PIL import Image

    fmt = draw(st.sampled_from(sorted(IMAGE_MODES)))
    mode = draw(st.sampled_from(IMAGE_MODES[fmt]))
    size = (draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    buf = io.BytesIO()
    Image.new(mode, size, color=draw(st.integers(0, 255)) if mode not in ("RGB", "CMYK") else None).save(buf, fmt)
    raw = buf.getvalue()
    if draw(st.integers(0, 5)) == 0:  # a truncated download
        raw = raw[: draw(st.integers(0, len(raw)))]
    return EXTENSIONS[fmt], raw


file_node = st.one_of(
    image_bytes().map(lambda e: ("file", e[0], e[1])),
    image_bytes().map(lambda e: ("file", e[0], e[1])),
    st.tuples(st.just("file"), st.sampled_from([".jpg", ".png", ".JPEG", ".webp"]), st.binary(max_size=40)),
    st.tuples(st.just("file"), st.sampled_from([".txt", "", ".json", ".png.bak"]), st.binary(max_size=40)),
    st.tuples(st.just("link"), st.sampled_from([".png", ""]), st.sampled_from(["..", ".", "../..", "/nonexistent"])),
    st.tuples(st.just("dir"), st.just(""), st.just(b"")),
)
node_names = mostly(st.sampled_from(["a", "b", "cat", "dog", "img0", ".hidden"]), odd_names)


@st.composite
def image_tree(draw):
    """``[(relative path, kind, payload)]``: train/ and val/ of class folders, with odd corners."""
    classes = draw(st.lists(node_names, min_size=draw(st.sampled_from([1] * 9 + [0])), max_size=3, unique=True))
    entries = []
    for split in ("train", "val"):
        kind = draw(st.sampled_from(["dir"] * 9 + ["missing", "file", "link"]))
        if kind != "dir":
            if kind != "missing":
                entries.append((split, kind, b"x" if kind == "file" else "/nonexistent"))
            continue
        entries.append((split, "dir", b""))
        split_classes = draw(mostly(st.just(classes), st.lists(node_names, max_size=2)))
        for cls in split_classes:
            entries.append((f"{split}/{cls}", "dir", b""))
            first = draw(mostly(image_bytes().map(lambda e: [("file", e[0], e[1])]), st.just([])))
            for k, (what, ext, payload) in enumerate(first + draw(st.lists(file_node, max_size=3))):
                entries.append((f"{split}/{cls}/{draw(node_names)}{k}{ext}", what, payload))
    return entries


# sides a test machine can decode 16 samples at, and sides that must be refused
image_sides = mostly(st.integers(1, 64), st.integers(max_value=0), st.integers(min_value=4097), st.booleans())
image_folders = st.fixed_dictionaries({"tree": image_tree(), "image_size": image_sides})


def safe_to_import(inp) -> bool:
    """Model specs may only name our fixture modules: a random ``os:_exit`` must never run."""
    if not isinstance(inp, dict):
        return True
    specs = [inp.get("spec")] + [v for f, v in inp.get("flags", []) if f == "--model"]
    return all(_safe_spec(s) for s in specs if isinstance(s, str) and ":" in s)


def _safe_spec(spec: str) -> bool:
    top = spec.partition(":")[0].split(".")[0]
    if top in (FIXTURE_MODULE, BROKEN_MODULE):
        return True
    try:
        return importlib.util.find_spec(top) is None
    except (ValueError, ImportError):
        return True
