"""Argument checks shared by the losses of :mod:`funcnet.losses` (private to the package).

They look only at static shapes and dtypes (free under jit), plus label values when
those are concrete.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks

# Nothing here is public: the losses are exported by funcnet.losses alone.
__all__: list[str] = []


def _array(fn: str, x, what: str):
    if x is None or isinstance(x, (str, bytes, dict, set)):
        raise TypeError(f"{fn}: {what} must be an array, got {type(x).__name__}.")
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{fn}: {what} must be an array, got {type(x).__name__}: {e}") from None


def _float_array(fn: str, x, what: str, upcast: bool = True):
    x = _array(fn, x, what)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"{fn}: {what} must have a floating dtype, got {x.dtype}. Cast it, e.g. {what}.astype(jnp.float32)."
        )
    return _at_least_f32(x) if upcast else x


def _at_least_f32(x):
    """Half-precision losses are computed in float32 ("Precision" in the docstring of
    funcnet.losses)."""
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _int_labels(fn: str, labels, what: str = "labels", like=None, like_what: str = "inputs"):
    """Integer class ids. ``like`` (the scores) tells one-hot targets from ids in the
    wrong dtype: a cast would be the wrong advice for those."""
    labels = _array(fn, labels, what)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        if like is not None and labels.ndim >= 1 and labels.shape == jnp.shape(like):
            raise TypeError(
                f"{fn}: {what} must be integer class ids, got dtype {labels.dtype} "
                f"of the {like_what}' shape {labels.shape}: one-hot or probability "
                f"targets? Pass the class ids, {what}.argmax(-1) (the class axis), "
                f"or use cross_entropy, which takes float targets."
            )
        raise TypeError(
            f"{fn}: {what} must be integer class ids, got dtype {labels.dtype}. "
            f"Cast them, e.g. {what}.astype(jnp.int32)."
        )
    return labels


def _same_shape(fn: str, a, b, what_a: str, what_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{fn}: {what_b} must have the shape of {what_a} {a.shape}, got "
            f"{b.shape}. funcnet does not broadcast losses implicitly."
        )


_concrete = checks.concrete  # the value when known now, None while traced


def _check_label_range(fn: str, labels, num_classes: int, ignore_index=None) -> None:
    """ValueError for concrete class ids outside ``[0, num_classes)`` (except ignore_index)."""
    values = _concrete(labels)
    if values is None or values.size == 0:
        return
    bad = (values < 0) | (values >= num_classes)
    if ignore_index is not None:
        bad &= values != ignore_index
    if bad.any():
        found = np.unique(values[bad])[:8].tolist()
        skip = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
        raise ValueError(
            f"{fn}: labels must be class ids in [0, {num_classes}){skip}, found "
            f"{found}. Check num_classes or the class axis."
        )


def _check_number(fn: str, what: str, value, **bounds):
    """``checks.real``, but a 0-d array is read when concrete and trusted when traced."""
    if isinstance(value, (jax.Array, np.ndarray)) and value.ndim == 0:
        concrete = _concrete(value)
        if concrete is None:
            return value  # traced scalar: cannot range-check, trust the caller
        value = concrete.item()
    return checks.real(fn, what, value, **bounds)


def _is_zero(value) -> bool:
    """True for a static zero; a traced value counts as non-zero (the general path)."""
    return isinstance(value, numbers.Real) and value == 0


def _class_weight(fn: str, weight, num_classes: int, dtype):
    if weight is None:
        return None
    weight = _float_array(fn, weight, "weight")
    if weight.shape != (num_classes,):
        raise ValueError(f"{fn}: weight must hold one value per class, shape ({num_classes},), got {weight.shape}.")
    return weight.astype(dtype)


def _class_axis(fn: str, logits, axis) -> int:
    if logits.ndim == 0:
        raise ValueError(f"{fn}: logits must have a class axis, got a scalar.")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -logits.ndim <= axis < logits.ndim:
        raise ValueError(f"{fn}: axis {axis!r} is out of range for logits of shape {logits.shape}.")
    return int(axis) % logits.ndim


def _check_index_labels(fn: str, logits, labels, axis: int, *, has_axis: bool = True) -> None:
    expected = logits.shape[:axis] + logits.shape[axis + 1 :]
    if labels.shape != expected:
        hint = ""
        if labels.shape == logits.shape:
            hint = " If these are one-hot or probability targets, pass them as floats."
        elif axis == logits.ndim - 1 and logits.ndim >= 3 and labels.shape == logits.shape[:1] + logits.shape[2:]:
            fix = "pass axis=1" if has_axis else "move the classes last, jnp.moveaxis(scores, 1, -1)"
            hint = f" The shapes fit classes on axis 1 (PyTorch's (N, C, d1, ...) layout): {fix}."
        raise ValueError(
            f"{fn}: integer labels must have the logits' shape {logits.shape} "
            f"without the class axis {axis}, i.e. {expected}, got {labels.shape}."
            f"{hint}"
        )


def _real_array(fn: str, x, what: str, dtype):
    x = _array(fn, x, what)
    if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
        raise TypeError(f"{fn}: {what} must be real numbers, got dtype {x.dtype}.")
    return x.astype(dtype)


def _broadcasts_to(fn: str, x, shape, what: str, like_what: str):
    try:
        fits = jnp.broadcast_shapes(x.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{fn}: {what} of shape {x.shape} does not broadcast to the {like_what}' shape {tuple(shape)}."
        )
    return x


def _sign_labels(fn: str, labels, shape, what: str = "labels"):
    labels = _array(fn, labels, what)
    if labels.shape != tuple(shape):
        raise ValueError(f"{fn}: {what} must have shape {tuple(shape)}, got {labels.shape}.")
    values = _concrete(labels)
    if values is not None and values.size and not np.isin(values, (-1, 1)).all():
        found = np.unique(values[~np.isin(values, (-1, 1))])[:8].tolist()
        raise ValueError(f"{fn}: {what} must be 1 or -1, found {found}. Map {{0, 1}} labels with 2 * y - 1.")
    return labels
