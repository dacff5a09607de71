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
    """One row of images per entry of ``rows`` (each ``(n, prod(shape))``), titled on the left."""
    plt = pyplot()
    if plt is None:
        return
    n = len(rows[0])
    fig, axes = plt.subplots(len(rows), n, figsize=(n * 0.9, len(rows) * 1.0), squeeze=False)
    for r, (images, title) in enumerate(zip(rows, titles)):
        for c in range(n):
            ax = axes[r][c]
            ax.imshow(np.asarray(images[c]).reshape(shape), cmap="gray", vmin=vmin, vmax=vmax)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[r][0].set_ylabel(title, fontsize=8)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
