"""Shared by the examples: matplotlib as an optional extra, and image grids."""

import os

import numpy as np


def pyplot():
    """``matplotlib.pyplot`` with a file-only backend, or None (with a message) without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[examples]'); no plot written.")
        return None
    return plt


def save(fig, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def image_rows(path, rows, titles, shape=(28, 28), vmin=0.0, vmax=1.0):
    """One row of images per entry of ``rows`` (each ``(n, prod(shape))``), titled on the left.

    Each row is drawn as one mosaic (a single ``imshow``), not one sub-plot per image:
    a few hundred milliseconds and tens of kilobytes instead of seconds and hundreds.
    """
    plt = pyplot()
    if plt is None:
        return
    n = len(rows[0])
    fig, axes = plt.subplots(len(rows), 1, figsize=(n * 0.6, len(rows) * 0.75), squeeze=False)
    for ax, images, title in zip(axes[:, 0], rows, titles):
        images = np.asarray(images).reshape(-1, *shape)
        # a one-pixel gap (at vmax) between images
        mosaic = np.full((shape[0], n * (shape[1] + 1) - 1), vmax, np.float32)
        for c, img in enumerate(images):
            mosaic[:, c * (shape[1] + 1) : c * (shape[1] + 1) + shape[1]] = img
        ax.imshow(mosaic, cmap="gray", vmin=vmin, vmax=vmax, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(title, fontsize=8, rotation=0, ha="right", va="center")
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
