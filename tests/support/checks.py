"""Checks of what a run leaves behind: pictures, parameters."""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png_drawing(path, *, colours=(), min_bytes=15_000):
    """``path`` is a PNG with a real drawing: not tiny, many colours, and each RGB in ``colours`` used."""
    import matplotlib.image
    import numpy as np

    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC and len(data) > min_bytes, (path, len(data))
    pixels = matplotlib.image.imread(path)[..., :3].reshape(-1, 3)
    assert len(np.unique(pixels.round(2), axis=0)) > 20, path
    for rgb in colours:
        near = np.abs(pixels - np.array(rgb)).max(axis=1) < 0.02
        assert near.sum() > 200, (path, rgb, int(near.sum()))


def max_relative_difference(a, b, floor=1e-12):
    """Largest |a - b| over the largest |b|, over every tensor of two state dicts."""
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + floor)).item() for k in b)
