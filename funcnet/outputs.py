"""Apache MXNet's output layers: forward ops whose backward is a built-in loss gradient.

MXNet (1.x) ends a network with an *output operator* such as ``SoftmaxOutput``:
its forward returns predictions (softmax probabilities, the regression value)
and its backward ignores the head gradient and writes the hand-derived gradient
of the matching loss straight into ``data``. Training is ``executor.backward()``
with no head gradients. This module reproduces those operators as
``jax.custom_vjp`` functions:

* the forward value is exactly MXNet's forward;
* the VJP **ignores the incoming cotangent** and returns MXNet's loss gradient
  for ``data`` (so ``grad(7 * op(x))`` equals ``grad(op(x))``, as in MXNet);
* ``label`` always gets a zero gradient.

Use :func:`grad` / :func:`value_and_grad` to differentiate a function whose
outputs are output-op results: every output leaf is seeded with ones and the
gradients are summed, the JAX spelling of MXNet's ``executor.backward()`` over a
``Group`` of heads. ``jax.grad`` of ``jnp.sum(op(...))`` gives the same result
for a single head.

Precision: bfloat16/float16 ``data`` is upcast to float32 inside every output op
(not :func:`block_grad`), so forward values are float32 and the injected loss
gradient is computed in float32; it reaches ``data`` cast back to ``data``'s dtype.
There is no opt-out (as in :mod:`funcnet.losses`): a softmax or its gradient in
bfloat16 loses most of its digits, and the cast fuses into the op.

The semantics were checked against real MXNet 1.9.1 (``tests/golden``). Labels
are compared after MXNet's C cast ``static_cast<int>(label)``, i.e. truncation
toward zero; under ``jit``, labels outside ``[0, C)`` match no class
(``softmax_output`` raises on them when their values are known, outside ``jit``).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet.core import PyTree

__all__ = [
    "softmax_output",
    "linear_regression_output",
    "logistic_regression_output",
    "mae_regression_output",
    "svm_output",
    "make_loss",
    "block_grad",
    "grad",
    "value_and_grad",
]

_NORMALIZATIONS = ("null", "batch", "valid")


# --------------------------------------------------------------------------- #
# Shared machinery.
# --------------------------------------------------------------------------- #


def _loss_op(forward: Callable, data_grad: Callable, data, *extra):
    """Builds ``forward(data)`` whose VJP is ``data_grad(out, *extra)``.

    The cotangent is dropped on purpose (MXNet output layers do the same), and
    every extra input (the label) receives a zero cotangent. Every MXNet output
    gradient is a function of the output alone (the forwards are softmax, sigmoid
    or the identity), so only ``out`` is kept for the backward pass, not ``data``
    too: the op holds no more memory than autodiff through the same loss.
    """

    @jax.custom_vjp
    def op(data, *extra):
        return forward(data)

    def fwd(data, *extra):
        out = forward(data)
        return out, (out, extra)

    def bwd(res, _cotangent):
        out, extra = res
        g = data_grad(out, *extra).astype(out.dtype)
        return (g,) + (None,) * len(extra)

    op.defvjp(fwd, bwd)
    return op(data, *extra)


def _as_float_data(fn: str, data):
    data = jnp.asarray(data)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(
            f"{fn}: data must be a floating-point array, got dtype {data.dtype}. "
            f"Cast it first, e.g. data.astype(jnp.float32)."
        )
    if data.ndim == 0:
        raise ValueError(f"{fn}: data must have a batch axis, got a scalar (shape ()).")
    return _at_least_f32(data)


def _at_least_f32(data):
    """Half precision in, float32 out (see "Precision" in the module doc)."""
    return data.astype(jnp.promote_types(data.dtype, jnp.float32))


def _as_label(fn: str, label):
    label = jnp.asarray(label)
    if not (jnp.issubdtype(label.dtype, jnp.floating) or jnp.issubdtype(label.dtype, jnp.integer)):
        raise TypeError(f"{fn}: label must be a float or integer array, got dtype {label.dtype}.")
    return label


def _class_index(label):
    """``static_cast<int>(label)``: truncation toward zero, as MXNet compares labels."""
    return label.astype(jnp.int32)  # XLA's float->int convert truncates toward zero


def _check_normalization(fn: str, normalization) -> None:
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"{fn}: normalization must be one of {_NORMALIZATIONS}, got {normalization!r}.")


# --------------------------------------------------------------------------- #
# SoftmaxOutput.
# --------------------------------------------------------------------------- #


def softmax_output(
    data: ArrayLike,
    label: ArrayLike,
    *,
    grad_scale: float = 1.0,
    ignore_label: float = -1.0,
    use_ignore: bool = False,
    normalization: str = "null",
    multi_output: bool = False,
    preserve_shape: bool = False,
    smooth_alpha: float = 0.0,
) -> jax.Array:
    r"""Softmax forward with the softmax-cross-entropy gradient (MXNet ``SoftmaxOutput``).

    Layouts (``C`` classes; MXNet's label-shape rules):

    * default: ``data (N, C)``, ``label (N,)``; softmax over the last axis.
    * ``multi_output=True``: ``data (N, C, d1, ...)``, softmax over axis 1; label
      ``(N, d1, ...)``, ``(N, d1*...)`` or ``(N, 1, d1, ...)``. Write ``D = d1*...``
      (``D = 1`` for 2-D data).
    * ``preserve_shape=True``: ``data (..., C)``, softmax over the last axis,
      ``label data.shape[:-1]``.
    * probability label: ``label.shape == data.shape`` (any layout above).

    Forward: ``out = softmax(data)`` along the class axis.

    Backward for integer labels, with ``k = trunc(label)`` (labels outside
    ``[0, C)`` hit no class) and ``t`` the target distribution:

    ```
    t_c  = 1[c == k]                                   (smooth_alpha == 0)
    t_c  = 1 - alpha if c == k else alpha / (C - 1)    (label smoothing)
    grad = (out - t) * grad_scale / norm
    grad = 0 on every position with k == trunc(ignore_label)   if use_ignore
    ```

    ``norm`` (``L`` = number of labels, ``valid = max(1, #{k != trunc(ignore_label)})``;
    ``valid`` counts ignore_label even when ``use_ignore`` is False, as MXNet does):

    | normalization | default / preserve_shape | multi_output |
    |---|---|---|
    | ``"null"`` | 1 | D |
    | ``"batch"`` | L (N, or prod(shape[:-1])) | N * D |
    | ``"valid"`` | valid | valid |

    Note MXNet's ``multi_output`` divides by ``D`` even with ``"null"``.

    Backward for a probability label: ``grad = (out - label) * grad_scale``; as in
    MXNet, ``use_ignore`` and ``normalization`` have no effect there.

    ``label`` gets a zero gradient; the incoming cotangent is ignored.

    Label range: labels whose values are known (called outside ``jit``, or closed
    over) must be class ids in ``[0, C)`` after truncation, or ``ignore_label``;
    anything else raises ValueError. Under ``jit`` they cannot be checked and MXNet's
    rule holds: a label outside ``[0, C)`` matches no class (``t = 0``), so its
    gradient is ``out * grad_scale / norm``, pushing every class down.

    Differences from MXNet, made errors instead of silent no-ops: ``smooth_alpha``
    with ``multi_output`` or with a probability label (MXNet ignores it), both
    ``multi_output`` and ``preserve_shape`` (MXNet picks ``multi_output``), and
    default-layout data of rank > 2 (MXNet pairs only the first ``N`` of its
    ``N*d1*...`` labels with rows; use ``multi_output`` or ``preserve_shape``).
    The ``out_grad`` option is not provided.

    Args:
      data: float scores, layouts above.
      label: class ids (float or integer, truncated toward zero) or probabilities of
        ``data``'s shape.
      grad_scale: multiplies the gradient.
      ignore_label: the label of positions to leave out (with ``use_ignore``).
      use_ignore: give positions labelled ``ignore_label`` a zero gradient.
      normalization: ``"null"``, ``"batch"`` or ``"valid"`` (table above).
      multi_output: classes on axis 1, ``data (N, C, d1, ...)``.
      preserve_shape: classes on the last axis of ``data (..., C)``.
      smooth_alpha: label smoothing of the target distribution.

    Returns:
      The softmax probabilities, ``data``'s shape, float32 or wider.

    Raises:
      TypeError: ``data`` not floating, or ``label`` neither float nor integer.
      ValueError: a scalar ``data``, a label shape the layout does not accept, a bad
        ``normalization`` or scalar option, an unsupported option combination (above),
        or concrete labels that are neither class ids nor ``ignore_label``.

    Examples:
      >>> softmax_output(jnp.zeros((1, 2)), jnp.array([0])).tolist()
      [[0.5, 0.5]]
      >>> # MXNet's gradient (softmax - one_hot), whatever the head gradient:
      >>> jax.grad(lambda d: softmax_output(d, jnp.array([0])).sum())(jnp.zeros((1, 2))).tolist()
      [[-0.5, 0.5]]
    """
    fn = "softmax_output"
    data = _as_float_data(fn, data)
    label = _as_label(fn, label)
    _check_normalization(fn, normalization)
    grad_scale = checks.real(fn, "grad_scale", grad_scale)
    ignore_label = checks.real(fn, "ignore_label", ignore_label)
    smooth_alpha = checks.real(fn, "smooth_alpha", smooth_alpha)
    use_ignore = checks.flag(fn, "use_ignore", use_ignore)
    layout = _softmax_layout(
        fn,
        data.shape,
        label.shape,
        multi_output=checks.flag(fn, "multi_output", multi_output),
        preserve_shape=checks.flag(fn, "preserve_shape", preserve_shape),
    )
    _check_smoothing(fn, layout, smooth_alpha, label.shape, data.shape)
    if not layout.probability_label:
        _check_class_labels(fn, label, layout, ignore_label)

    def forward(x):
        return jax.nn.softmax(x, axis=layout.axis)

    if layout.probability_label:

        def data_grad(out, lab):
            return (out - lab.astype(out.dtype)) * grad_scale
    else:
        data_grad = _class_index_grad(
            layout,
            grad_scale=grad_scale,
            ignore_index=int(ignore_label),
            use_ignore=use_ignore,
            normalization=normalization,
            smooth_alpha=smooth_alpha,
        )
    return _loss_op(forward, data_grad, data, label)


class _SoftmaxLayout(NamedTuple):
    """Where the classes are and how labels pair with rows (MXNet's label-shape rules)."""

    axis: int  # the class axis
    num_classes: int
    multi_output: bool
    probability_label: bool  # label has data's shape: a distribution per position
    label_shape: tuple  # class-index labels reshaped to this before one_hot
    per_norm: dict  # the "null" and "batch" normalizers


def _softmax_layout(
    fn: str, shape: tuple, label_shape: tuple, *, multi_output: bool, preserve_shape: bool
) -> _SoftmaxLayout:
    if multi_output and preserve_shape:
        raise ValueError(
            f"{fn}: multi_output=True (softmax over axis 1) and "
            f"preserve_shape=True (softmax over the last axis) conflict; "
            f"set only one."
        )
    if len(shape) < 2:
        raise ValueError(f"{fn}: data must be at least 2-D (N, C, ...), got shape {shape}.")
    probability_label = label_shape == shape
    if multi_output:
        spatial = shape[2:]
        d = math.prod(spatial)
        accepted = [(shape[0],) + spatial, (shape[0], d), (shape[0], 1) + spatial]
        if not probability_label and label_shape not in accepted:
            raise ValueError(
                f"{fn}: with multi_output=True and data of shape {shape}, label must have "
                f"shape {accepted[0]}, {accepted[1]} or {accepted[2]} (class indices) or "
                f"{shape} (probabilities); got {label_shape}."
            )
        return _SoftmaxLayout(
            1, shape[1], True, probability_label, (shape[0],) + spatial, {"null": d, "batch": shape[0] * d}
        )
    if len(shape) > 2 and not preserve_shape:
        raise ValueError(
            f"{fn}: data of shape {shape} has rank > 2; pass multi_output=True for "
            f"classes on axis 1 (data (N, C, d1, ...)) or preserve_shape=True for "
            f"classes on the last axis."
        )
    if not probability_label and label_shape != shape[:-1]:
        raise ValueError(
            f"{fn}: data of shape {shape} needs label of shape {shape[:-1]} (class "
            f"indices) or {shape} (probabilities); got {label_shape}."
        )
    return _SoftmaxLayout(
        len(shape) - 1, shape[-1], False, probability_label, shape[:-1], {"null": 1, "batch": math.prod(shape[:-1])}
    )


def _check_smoothing(fn: str, layout: _SoftmaxLayout, smooth_alpha: float, label_shape: tuple, shape: tuple) -> None:
    if smooth_alpha == 0.0:
        return
    if layout.multi_output or layout.probability_label:
        raise ValueError(
            f"{fn}: smooth_alpha is only supported for class-index labels without "
            f"multi_output (MXNet silently ignores it otherwise); got "
            f"multi_output={layout.multi_output}, label shape {label_shape} for data {shape}."
        )
    if layout.num_classes < 2:
        raise ValueError(
            f"{fn}: smooth_alpha needs at least 2 classes, data has {layout.num_classes} on axis {layout.axis}."
        )


def _check_class_labels(fn: str, label, layout: _SoftmaxLayout, ignore_label: float) -> None:
    """Concrete labels (outside jit) must be classes or ignore_label: MXNet's silent
    "hits no class" gives a gradient that pushes every class down, which is never
    what a label meant. Traced labels keep MXNet's rule (see softmax_output)."""
    values = checks.concrete(label)
    if values is None or values.size == 0:
        return
    k = np.trunc(values.astype(np.float64))  # static_cast<int>: toward zero
    bad = ((k < 0) | (k >= layout.num_classes)) & (k != math.trunc(ignore_label))
    if bad.any():
        found = [int(v) for v in np.unique(k[bad])[:8]]
        where = "axis 1 (multi_output=True)" if layout.multi_output else "the last axis"
        raise ValueError(
            f"{fn}: labels must be class ids in [0, {layout.num_classes}) or "
            f"ignore_label={ignore_label:g}, found {found} (after truncation toward zero, as "
            f"MXNet compares labels). data has {layout.num_classes} classes on {where}: check "
            f"the number of classes, the class axis (multi_output=True for (N, C, ...) data), "
            f"or pass ignore_label= (with use_ignore=True) for padding labels. Under jit labels "
            f"are not checked and an out-of-range one matches no class, as in MXNet."
        )


def _class_index_grad(
    layout: _SoftmaxLayout,
    *,
    grad_scale: float,
    ignore_index: int,
    use_ignore: bool,
    normalization: str,
    smooth_alpha: float,
) -> Callable:
    """SoftmaxOutput's backward for class-index labels: ``(out - t) * grad_scale / norm``."""
    axis, num_classes = layout.axis, layout.num_classes

    def data_grad(out, lab):
        k = _class_index(lab.reshape(layout.label_shape))
        hit = jax.nn.one_hot(k, num_classes, axis=axis, dtype=out.dtype)
        if smooth_alpha != 0.0:
            off = smooth_alpha / (num_classes - 1)
            target = hit * (1.0 - smooth_alpha) + (1.0 - hit) * off
        else:
            target = hit
        g = out - target
        ignored = k == ignore_index
        if use_ignore:
            g = jnp.where(jnp.expand_dims(ignored, axis), jnp.zeros_like(g), g)
        if normalization == "valid":
            count = jnp.maximum(k.size - jnp.sum(ignored), 1)
            scale = jnp.asarray(grad_scale, out.dtype) / count.astype(out.dtype)
        else:
            scale = grad_scale / layout.per_norm[normalization]
        return g * scale

    return data_grad


# --------------------------------------------------------------------------- #
# Regression outputs.
# --------------------------------------------------------------------------- #


def _regression(fn: str, forward: Callable, residual_grad: Callable, data, label, grad_scale):
    data = _as_float_data(fn, data)
    label = _as_label(fn, label)
    grad_scale = checks.real(fn, "grad_scale", grad_scale)
    if label.ndim == 0 or label.shape[0] != data.shape[0] or label.size != data.size:
        raise ValueError(
            f"{fn}: label must have the batch size of data and as many elements "
            f"(MXNet reshapes it to data's shape): data {data.shape}, label {label.shape}. "
            f"Use label of shape {data.shape}."
        )
    num_output = data.size // data.shape[0] if data.shape[0] else 1

    def data_grad(out, lab):
        lab = lab.reshape(out.shape).astype(out.dtype)
        return residual_grad(out, lab) * (grad_scale / num_output)

    return _loss_op(forward, data_grad, data, label)


def linear_regression_output(data: ArrayLike, label: ArrayLike, *, grad_scale: float = 1.0) -> jax.Array:
    r"""Identity forward with the squared-error gradient (MXNet ``LinearRegressionOutput``).

    ``out = data``;  ``grad = (out - label) * grad_scale / num_output`` with
    ``num_output = data.size / data.shape[0]`` (outputs per sample), i.e. the
    gradient of ``grad_scale * sum((out - label)**2) / (2 * num_output)``.
    ``label`` may have any shape with ``data``'s batch size and element count (MXNet
    reads it in data's memory order), e.g. ``(N,)`` for ``data (N, 1)``. ``label``
    gets a zero gradient; the incoming cotangent is ignored.

    Args:
      data: float predictions with a batch axis, ``(N, ...)``.
      label: targets with ``data``'s batch size and element count.
      grad_scale: multiplies the gradient.

    Returns:
      ``data`` unchanged, ``data``'s shape, float32 or wider.

    Raises:
      TypeError: ``data`` not floating, or ``label`` neither float nor integer.
      ValueError: a scalar ``data``, a ``label`` of another batch size or element count,
        or a bad ``grad_scale``.

    Examples:
      >>> f = lambda d: linear_regression_output(d, jnp.array([[1.0, 0.0]])).sum()
      >>> jax.grad(f)(jnp.array([[3.0, 2.0]])).tolist()  # (out - label) / num_output
      [[1.0, 1.0]]
    """
    return _regression("linear_regression_output", lambda x: x, lambda out, lab: out - lab, data, label, grad_scale)


def logistic_regression_output(data: ArrayLike, label: ArrayLike, *, grad_scale: float = 1.0) -> jax.Array:
    r"""Sigmoid forward with the logistic-loss gradient (MXNet ``LogisticRegressionOutput``).

    ``out = sigmoid(data)``;  ``grad = (out - label) * grad_scale / num_output`` with
    ``num_output = data.size / data.shape[0]``: the gradient of binary cross-entropy
    with respect to the logit. Label rules as :func:`linear_regression_output`.

    Args:
      data: float predictions with a batch axis, ``(N, ...)``.
      label: targets with ``data``'s batch size and element count.
      grad_scale: multiplies the gradient.

    Returns:
      ``sigmoid(data)``, ``data``'s shape, float32 or wider.

    Raises:
      TypeError: ``data`` not floating, or ``label`` neither float nor integer.
      ValueError: a scalar ``data``, a ``label`` of another batch size or element count,
        or a bad ``grad_scale``.

    Examples:
      >>> f = lambda d: logistic_regression_output(d, jnp.array([[1.0]]))
      >>> f(jnp.zeros((1, 1))).tolist()
      [[0.5]]
      >>> jax.grad(lambda d: f(d).sum())(jnp.zeros((1, 1))).tolist()  # out - label
      [[-0.5]]
    """
    return _regression(
        "logistic_regression_output", jax.nn.sigmoid, lambda out, lab: out - lab, data, label, grad_scale
    )


def mae_regression_output(data: ArrayLike, label: ArrayLike, *, grad_scale: float = 1.0) -> jax.Array:
    r"""Identity forward with the absolute-error gradient (MXNet ``MAERegressionOutput``).

    ``out = data``;  ``grad = s * grad_scale / num_output`` with
    ``num_output = data.size / data.shape[0]`` and ``s = +1 if out - label > 0 else -1``
    (MXNet's ``minus_sign``: a tie gives -1, not 0). Label rules as
    :func:`linear_regression_output`.

    Args:
      data: float predictions with a batch axis, ``(N, ...)``.
      label: targets with ``data``'s batch size and element count.
      grad_scale: multiplies the gradient.

    Returns:
      ``data`` unchanged, ``data``'s shape, float32 or wider.

    Raises:
      TypeError: ``data`` not floating, or ``label`` neither float nor integer.
      ValueError: a scalar ``data``, a ``label`` of another batch size or element count,
        or a bad ``grad_scale``.

    Examples:
      >>> f = lambda d: mae_regression_output(d, jnp.array([1.0, 1.0])).sum()
      >>> jax.grad(f)(jnp.array([[2.0], [1.0]])).tolist()  # the tie gets -1
      [[1.0], [-1.0]]
    """

    def sign(out, lab):
        return jnp.where(out - lab > 0, jnp.ones_like(out), -jnp.ones_like(out))

    return _regression("mae_regression_output", lambda x: x, sign, data, label, grad_scale)


# --------------------------------------------------------------------------- #
# SVMOutput.
# --------------------------------------------------------------------------- #


def svm_output(
    data: ArrayLike,
    label: ArrayLike,
    *,
    margin: float = 1.0,
    regularization_coefficient: float = 1.0,
    use_linear: bool = False,
) -> jax.Array:
    r"""Identity forward with a one-vs-all hinge gradient (MXNet ``SVMOutput``).

    ``data (..., C)`` scores with classes on the last axis, ``label data.shape[:-1]``
    class indices, ``k = trunc(label)``; ``m = margin``, ``r = regularization_coefficient``.
    ``out = data``. Per score ``o`` (no ``grad_scale``, no normalization):

    * L2-SVM (default), loss ``r * sum(max(0, m - y*o)**2)`` with ``y = +1`` for the
      label class and ``-1`` elsewhere:

      ```
      label class:  grad = -2 r (m - o)   if m > o   else 0
      other class:  grad = +2 r (m + o)   if m > -o  else 0
      ```

    * L1-SVM (``use_linear=True``), loss ``r * sum(max(0, m - y*o))``:

    ```
    label class:  grad = -r   if m > o   else 0
    other class:  grad = +r   if m > -o  else 0
    ```

    Labels outside ``[0, C)`` make every score an "other class" score. ``label`` gets
    a zero gradient; the incoming cotangent is ignored.

    Args:
      data: float scores ``(..., C)``.
      label: class ids of shape ``data.shape[:-1]`` (float or integer).
      margin: ``m``.
      regularization_coefficient: ``r``.
      use_linear: the L1-SVM gradient instead of the L2-SVM one.

    Returns:
      ``data`` unchanged, float32 or wider.

    Raises:
      TypeError: ``data`` not floating, or ``label`` neither float nor integer.
      ValueError: a scalar ``data``, a ``label`` of another shape, or a bad scalar option.

    Examples:
      >>> f = lambda d: svm_output(d, jnp.array([0])).sum()
      >>> # label class: -2 (1 - 0.5); other class: 2 (1 + 0.25)
      >>> jax.grad(f)(jnp.array([[0.5, 0.25]])).tolist()
      [[-1.0, 2.5]]
      >>> f1 = lambda d: svm_output(d, jnp.array([0]), use_linear=True).sum()
      >>> jax.grad(f1)(jnp.array([[0.5, 0.25]])).tolist()
      [[-1.0, 1.0]]
    """
    fn = "svm_output"
    data = _as_float_data(fn, data)
    label = _as_label(fn, label)
    margin = checks.real(fn, "margin", margin)
    reg = checks.real(fn, "regularization_coefficient", regularization_coefficient)
    use_linear = checks.flag(fn, "use_linear", use_linear)
    if label.shape != data.shape[:-1]:
        raise ValueError(
            f"{fn}: data of shape {data.shape} (classes on the last axis) needs "
            f"label of shape {data.shape[:-1]}, got {label.shape}."
        )
    num_classes = data.shape[-1]

    def data_grad(out, lab):
        is_label = jax.nn.one_hot(_class_index(lab), num_classes, dtype=jnp.bool_)
        zero = jnp.zeros_like(out)
        if use_linear:
            g_label = jnp.where(margin > out, -reg + zero, zero)
            g_other = jnp.where(margin > -out, reg + zero, zero)
        else:
            g_label = jnp.where(margin > out, -2.0 * reg * (margin - out), zero)
            g_other = jnp.where(margin > -out, 2.0 * reg * (margin + out), zero)
        return jnp.where(is_label, g_label, g_other)

    return _loss_op(lambda x: x, data_grad, data, label)


# --------------------------------------------------------------------------- #
# MakeLoss and BlockGrad.
# --------------------------------------------------------------------------- #


def make_loss(
    data: ArrayLike, *, grad_scale: float = 1.0, normalization: str = "null", valid_thresh: float = 0.0
) -> jax.Array:
    r"""Marks ``data`` as a loss (MXNet ``MakeLoss``): identity forward, constant gradient.

    ``out = data``;  ``grad = grad_scale / norm`` for every element, where

    * ``"null"``:  ``norm = 1``;
    * ``"batch"``: ``norm = prod(data.shape[:-1])`` - MXNet flattens data to 2-D
      keeping the last axis, so ``(N, K)`` divides by ``N`` but a per-sample loss
      vector ``(N,)`` divides by **1** and ``(N, d, K)`` by ``N * d``;
    * ``"valid"``: ``norm = max(1, #{data > valid_thresh})`` (strict ``>``, over all
      elements).

    The incoming cotangent is ignored.

    Args:
      data: a float loss, any shape.
      grad_scale: the gradient of every element before normalization.
      normalization: ``"null"``, ``"batch"`` or ``"valid"``.
      valid_thresh: the threshold of ``"valid"``.

    Returns:
      ``data`` unchanged, float32 or wider.

    Raises:
      TypeError: ``data`` not floating.
      ValueError: a bad ``normalization``, ``grad_scale`` or ``valid_thresh``.

    Examples:
      >>> jax.grad(lambda x: make_loss(x ** 2).sum())(jnp.array([3.0])).tolist()
      [6.0]
    """
    fn = "make_loss"
    data = jnp.asarray(data)
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"{fn}: data must be a floating-point array, got dtype {data.dtype}.")
    data = _at_least_f32(data)
    _check_normalization(fn, normalization)
    grad_scale = checks.real(fn, "grad_scale", grad_scale)
    valid_thresh = checks.real(fn, "valid_thresh", valid_thresh)
    rows = math.prod(data.shape[:-1])

    def data_grad(out):  # out is data: the forward is the identity
        if normalization == "valid":
            count = jnp.maximum(jnp.sum(out > valid_thresh), 1).astype(out.dtype)
            return jnp.full_like(out, grad_scale) / count
        norm = rows if normalization == "batch" else 1
        return jnp.full_like(out, grad_scale / norm)

    return _loss_op(lambda x: x, data_grad, data)


def block_grad(x: PyTree) -> PyTree:
    """Identity forward, zero gradient (MXNet ``BlockGrad`` = ``jax.lax.stop_gradient``).

    Args:
      x: an array or a pytree of arrays.

    Returns:
      ``x``, with no gradient flowing back through it.

    Examples:
      >>> jax.grad(lambda x: (block_grad(x) * x).sum())(jnp.array([3.0])).tolist()
      [3.0]
    """
    return jax.lax.stop_gradient(x)  # accepts pytrees


# --------------------------------------------------------------------------- #
# Differentiating networks that end in output ops.
# --------------------------------------------------------------------------- #


def _seeded(fun: Callable, has_aux: bool) -> Callable:
    """Wraps ``fun`` as ``args -> (sum of all floating output leaves, (outputs, aux))``.

    Differentiating that sum is a VJP with a ones cotangent on every output leaf
    (summing the gradients of all heads); output ops ignore the ones anyway.
    """

    @functools.wraps(fun)
    def scalar_fun(*args, **kwargs):
        result = fun(*args, **kwargs)
        if has_aux:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise TypeError(
                    "funcnet.outputs.grad(has_aux=True): the function must "
                    f"return a pair (outputs, aux), got {type(result).__name__}."
                )
            outputs, aux = result
        else:
            outputs, aux = result, None
        leaves = [leaf for leaf in jax.tree.leaves(outputs) if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)]
        total = sum((jnp.sum(leaf).astype(jnp.float32) for leaf in leaves), jnp.zeros((), jnp.float32))
        return total, (outputs, aux)

    return scalar_fun


def value_and_grad(fun: Callable, argnums: Union[int, Sequence[int]] = 0, has_aux: bool = False) -> Callable:
    """Like :func:`jax.value_and_grad` for networks whose outputs are output ops.

    ``fun`` may return any pytree of arrays (several heads, like an MXNet
    ``Group``). Every floating output leaf is seeded with a cotangent of ones and
    the gradients are summed - MXNet's ``executor.backward()`` without head
    gradients. Output ops ignore that seed and inject their loss gradient; a
    plain (non-output-op) head contributes the gradient of its sum (MXNet would
    demand an explicit head gradient there). Integer leaves are not differentiated.

    Returns ``(outputs, grads)``, or ``((outputs, aux), grads)`` with ``has_aux``;
    ``grads`` has the structure of ``args[argnums]``. Works under ``jax.jit``.

    Args:
      fun: the network, returning a pytree of outputs (and ``aux`` with ``has_aux``).
      argnums: which positional argument(s) to differentiate.
      has_aux: ``fun`` returns a pair ``(outputs, aux)``.

    Returns:
      A function of ``fun``'s arguments returning ``(outputs, grads)`` as above.

    Raises:
      TypeError: (when called) ``has_aux`` is set and ``fun`` does not return a pair.

    Examples:
      >>> heads = lambda d: {"cls": softmax_output(d, jnp.array([0])),
      ...                    "reg": linear_regression_output(d, jnp.array([[1.0, 0.0]]))}
      >>> outputs, g = value_and_grad(heads)(jnp.zeros((1, 2)))
      >>> outputs["cls"].tolist(), outputs["reg"].tolist()
      ([[0.5, 0.5]], [[0.0, 0.0]])
      >>> g.tolist()  # softmax - one_hot, plus (out - label) / 2
      [[-1.0, 0.5]]
    """
    inner = jax.value_and_grad(_seeded(fun, has_aux), argnums=argnums, has_aux=True)

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        (_, (outputs, aux)), grads = inner(*args, **kwargs)
        return ((outputs, aux) if has_aux else outputs), grads

    return wrapped


def grad(fun: Callable, argnums: Union[int, Sequence[int]] = 0, has_aux: bool = False) -> Callable:
    """Like :func:`jax.grad` for networks whose outputs are output ops.

    See :func:`value_and_grad` for the seeding rule. Returns ``grads``, or
    ``(grads, aux)`` with ``has_aux`` (the order :func:`jax.grad` uses).

    Args:
      fun: the network, returning a pytree of outputs (and ``aux`` with ``has_aux``).
      argnums: which positional argument(s) to differentiate.
      has_aux: ``fun`` returns a pair ``(outputs, aux)``.

    Returns:
      A function of ``fun``'s arguments returning ``grads`` (or ``(grads, aux)``).

    Raises:
      TypeError: (when called) ``has_aux`` is set and ``fun`` does not return a pair.

    Examples:
      >>> # an output op ignores the head gradient: scaling the head changes nothing
      >>> grad(lambda d: 7.0 * softmax_output(d, jnp.array([0])))(jnp.zeros((1, 2))).tolist()
      [[-0.5, 0.5]]
    """
    vg = value_and_grad(fun, argnums=argnums, has_aux=has_aux)

    @functools.wraps(fun)
    def wrapped(*args, **kwargs):
        value, grads = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return wrapped
