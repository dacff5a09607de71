"""Window arguments shared by the conv and pooling layers (private to funcnet.layers).

Filter/window shapes, padding specs and the output size of a strided window op,
normalised and checked in one place so ``Conv``, ``ConvTranspose``, ``MaxPool``
and ``AvgPool`` accept the same spellings and fail with the same messages.
"""

from __future__ import annotations

from typing import Sequence, Tuple

from jax import lax

from funcnet import _checks as checks

__all__ = ["PADDING_STRINGS", "window_tuple", "normalize_padding", "output_size"]

PADDING_STRINGS = ("VALID", "SAME", "SAME_LOWER")


def window_tuple(layer: str, value, what: str, max_dims: int = 3) -> Tuple[int, ...]:
    """A ``filter_shape``/``window_shape``: a tuple of 1 to ``max_dims`` positive ints."""
    if checks.is_int(value) or not isinstance(value, (tuple, list)):
        raise TypeError(
            f"{layer}: {what} must be a tuple of 1 to {max_dims} ints, one per "
            f"spatial axis (e.g. (3, 3) for 2-D), got {value!r}."
        )
    if not all(checks.is_int(v) for v in value):
        raise TypeError(f"{layer}: {what} must contain only ints, got {tuple(value)!r}.")
    if not 1 <= len(value) <= max_dims or not all(v > 0 for v in value):
        raise ValueError(f"{layer}: {what} must be 1 to {max_dims} positive ints, got {tuple(value)!r}.")
    return tuple(int(v) for v in value)


def normalize_padding(layer: str, padding, n: int, strings: Sequence[str] = PADDING_STRINGS):
    """Returns an upper-case padding string from ``strings`` or ``n`` ``(low, high)`` int pairs.

    Accepted: a string (case-insensitive), an int ``p`` (``(p, p)`` on every
    spatial axis, PyTorch's ``padding=p``), or ``n`` entries that are each an int
    ``p`` or a ``(low, high)`` pair. Entries must be non-negative.
    """
    choices = ", ".join(repr(s) for s in strings)
    if isinstance(padding, str):
        if padding.upper() not in strings:
            raise ValueError(
                f"{layer}: unknown padding {padding!r}; expected one of {choices}, "
                f"an int, or {n} (low, high) int pairs."
            )
        return padding.upper()
    if checks.is_int(padding):
        padding = [padding] * n
    bad = ValueError(
        f"{layer}: padding must be one of {choices}, a non-negative int, or {n} "
        f"(low, high) pairs of non-negative ints (one per spatial axis), got "
        f"{padding!r}."
    )
    if not isinstance(padding, (tuple, list)) or len(padding) != n:
        raise bad
    pairs = []
    for entry in padding:
        if checks.is_int(entry):
            entry = (entry, entry)
        if (
            not isinstance(entry, (tuple, list))
            or len(entry) != 2
            or not all(checks.is_int(p) and p >= 0 for p in entry)
        ):
            raise bad
        pairs.append((int(entry[0]), int(entry[1])))
    return tuple(pairs)


def output_size(layer: str, size: int, window: int, stride: int, padding, axis: int) -> int:
    """Spatial output size of a strided window op: ``(size + lo + hi - window) // stride + 1``.

    ``padding`` is a string from :data:`PADDING_STRINGS` or a ``(lo, hi)`` pair;
    ``window`` is the effective (dilated) window. An unknown size (-1) stays -1.
    """
    if size == -1:
        return -1
    lo, hi = lax.padtype_to_pads([size], [window], [stride], padding)[0] if isinstance(padding, str) else padding
    out = (size + lo + hi - window) // stride + 1
    if out < 1:
        raise ValueError(
            f"{layer}: input size {size} on axis {axis} is too small for a window "
            f"of {window} (after dilation) with padding {(lo, hi)}: the output would "
            f"be empty. Use a larger input, a smaller filter/window, or more "
            f"padding."
        )
    return out
