"""Center loss (Wen et al. 2016), its class centers as explicit state."""

from __future__ import annotations

from typing import Hashable, Optional, Tuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike, DTypeLike

from funcnet import _mesh
from funcnet import _checks as checks
from funcnet.losses._args import _check_label_range, _check_number, _float_array, _int_labels

__all__ = ["center_loss_init", "center_loss"]


def center_loss_init(num_classes: int, feature_dim: int, dtype: DTypeLike = jnp.float32) -> jax.Array:
    """Initial class centers: zeros of shape ``(num_classes, feature_dim)``.

    Args:
      num_classes: the number of classes, a positive int.
      feature_dim: the size of each feature vector, a positive int.
      dtype: the centers' dtype.

    Returns:
      The centers, zeros of shape ``(num_classes, feature_dim)``.

    Raises:
      ArgumentError: ``num_classes`` or ``feature_dim`` is not a positive int.

    Examples:
      >>> centers = center_loss_init(3, 2)
      >>> centers.shape, centers.dtype
      ((3, 2), dtype('float32'))
    """
    for what, n in (("num_classes", num_classes), ("feature_dim", feature_dim)):
        checks.positive_int("center_loss_init", what, n)
    return jnp.zeros((int(num_classes), int(feature_dim)), dtype)


def _center_sums(diff, segments, features, num_classes, dtype):
    """Per-class sums of ``diff`` (no gradient) and per-class counts."""
    # Per-class sums of a batch split over Explicit mesh axes are whole on every device.
    # (A scatter-add, as segment_sum computes it; segment_sum takes out_sharding only
    # from jax 0.10.1.) Segment num_classes, the invalid ids, is dropped.
    delta = (
        jnp.zeros((num_classes, diff.shape[-1]), diff.dtype)
        .at[segments]
        .add(lax.stop_gradient(diff), mode="drop", out_sharding=_mesh.explicit_sharding(features, None, None))
    )
    counts = (
        jnp.zeros((num_classes,), dtype)
        .at[segments]
        .add(1, mode="drop", out_sharding=_mesh.explicit_sharding(features, None))
    )
    return delta, counts


def _center_args(fn, centers, features, labels, alpha):
    """The checked arguments of :func:`center_loss`."""
    centers = _float_array(fn, centers, "centers", upcast=False)  # new_centers keep its dtype
    features = _float_array(fn, features, "features")
    labels = _int_labels(fn, labels)
    if centers.ndim != 2:
        raise ValueError(
            f"{fn}: centers must be (num_classes, feature_dim), got shape "
            f"{centers.shape}. Make them with center_loss_init."
        )
    num_classes, dim = centers.shape
    if features.ndim != 2 or features.shape[1] != dim:
        raise ValueError(
            f"{fn}: features must be (batch, {dim}) to match centers {centers.shape}, got {features.shape}."
        )
    if labels.shape != features.shape[:1]:
        raise ValueError(
            f"{fn}: labels must be ({features.shape[0]},), one class id per feature row, got {labels.shape}."
        )
    alpha = _check_number(fn, "alpha", alpha, low=0.0)
    _check_label_range(fn, labels, num_classes)
    return centers, features, labels, alpha


def center_loss(
    centers: ArrayLike,
    features: ArrayLike,
    labels: ArrayLike,
    *,
    alpha: float = 0.5,
    axis_name: Optional[Hashable] = None,
) -> Tuple[jax.Array, jax.Array]:
    r"""Center loss and the updated centers: ``(loss, new_centers)``.

    With :math:`B` samples :math:`x_i` of classes :math:`y_i` and centers :math:`c`
    (held under ``stop_gradient``):

    .. math:

    ```
    L = \frac{1}{2B}\sum_i \lVert x_i - c_{y_i}\rVert^2, \qquad
    \frac{\partial L}{\partial x_i} = \frac{x_i - c_{y_i}}{B},
    ```

    and the centers follow MXNet's center-loss rule, computed from the centers passed in:

    .. math:

    ```
    c_j \leftarrow c_j + \alpha\,\frac{\sum_{i: y_i = j} (x_i - c_j)}{1 + n_j},
    ```

    :math:`n_j` the number of samples of class :math:`j`. ``centers`` never receive a
    gradient (and ``new_centers`` carry none): they are state, not parameters. Use it
    inside ``jax.value_and_grad(loss_fn, has_aux=True)`` returning the new centers as aux.

    **Data parallel** (``axis_name`` set, inside ``pmap``): the per-class sums, counts
    and squared distances are ``psum``-ed, so every device returns the same
    ``new_centers`` and the same ``loss``, both equal to the single-device result on the
    global batch. Each device's gradient w.r.t. its own features is
    :math:`(x_i - c_{y_i})/B_\text{local}`: the usual per-device-mean convention, so
    ``lax.pmean`` of the parameter gradients (as for any local-mean loss) gives the
    gradient of the global-batch loss.

    Labels out of ``[0, num_classes)`` raise ``ValueError`` when concrete; under jit
    they make the loss NaN and are left out of the center update.

    Args:
      centers: ``(num_classes, feature_dim)`` from :func:`center_loss_init` or a previous call.
      features: ``(B, feature_dim)`` float features.
      labels: ``(B,)`` integer class ids.
      alpha: center learning rate.
      axis_name: the ``pmap`` axis to reduce over, or None on one device.

    Returns:
      ``(loss, new_centers)``: the scalar loss (float32 or wider) and the updated centers,
      ``centers``' shape and dtype, without gradient.

    Raises:
      TypeError: ``centers`` or ``features`` not floating, or ``labels`` not integer.
      ValueError: shapes other than those above, a bad ``alpha``, or concrete labels
        outside ``[0, num_classes)``.

    Examples:
      >>> centers = center_loss_init(2, 2)
      >>> features, labels = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.array([0, 1])
      >>> loss, new_centers = center_loss(centers, features, labels)
      >>> float(loss)  # (1 + 4) / (2 * 2)
      1.25
      >>> new_centers.tolist()  # each center moves alpha * diff / (1 + n_j)
      [[0.25, 0.0], [0.0, 0.5]]
    """
    fn = "funcnet.losses.center_loss"
    centers, features, labels, alpha = _center_args(fn, centers, features, labels, alpha)
    num_classes = centers.shape[0]
    batch = features.shape[0]
    in_range = (labels >= 0) & (labels < num_classes)
    # Invalid ids go to segment `num_classes`, which the scatter-add below drops.
    segments = jnp.where(in_range, labels, num_classes)
    c = lax.stop_gradient(centers)
    diff = features - _mesh.gather(c, jnp.where(in_range, labels, 0))
    sq = jnp.where(in_range, jnp.sum(diff * diff, axis=-1), jnp.nan)
    local = jnp.sum(sq) / (2 * batch)
    delta, counts = _center_sums(diff, segments, features, num_classes, centers.dtype)
    if axis_name is None:
        loss = local
    else:
        delta = lax.psum(delta, axis_name)
        counts = lax.psum(counts, axis_name)
        total = lax.psum(lax.stop_gradient(jnp.sum(sq)), axis_name)
        global_batch = lax.psum(jnp.asarray(batch, sq.dtype), axis_name)
        # The value is the global-batch loss; the gradient is that of the local mean
        # (see docstring), independent of how psum happens to be transposed.
        loss = local + lax.stop_gradient(total / (2 * global_batch) - local)
    new_centers = c + alpha * delta / (1.0 + counts)[:, None]
    return loss, lax.stop_gradient(new_centers.astype(centers.dtype))
