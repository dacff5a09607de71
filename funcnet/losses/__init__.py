"""Loss functions: small pure functions of arrays, usable under ``jit``, ``grad`` and ``pmap``.

Conventions
-----------
* **Classes are on the last axis** (``axis=-1``), the JAX / channels-last layout:
  logits of shape ``(N, C)`` or ``(N, d1, ..., C)`` with integer labels of shape
  ``(N,)`` / ``(N, d1, ...)``. PyTorch puts the classes on axis 1 (``(N, C, d1, ...)``);
  pass ``axis=1`` to use that layout unchanged. Every other semantic of
  :func:`cross_entropy` and :func:`nll_loss` is PyTorch's.
* ``reduction`` is ``"mean"`` (default), ``"sum"``, ``"sum_mean"`` or ``"none"`` (the
  per-element loss). ``"sum_mean"`` sums each example's loss over its non-batch axes and
  averages over the batch (axis 0 of the per-element loss, ``N`` examples):
  ``(1/N) * sum_n sum_i l[n, i]``. That is tinynn's MSE (sum over features
  divided by the batch size) and the per-example sum a VAE's ELBO needs. A scalar
  per-element loss has no batch axis and is rejected for ``"sum_mean"``.
* Bad inputs fail early: a wrong dtype raises ``TypeError`` and a wrong shape or rank
  ``ValueError``, at trace time. Integer labels that are concrete (not traced, i.e.
  outside ``jit``) are checked too: a class id outside ``[0, C)`` that is not
  ``ignore_index`` raises ``ValueError``.
* **Out-of-range labels under jit.** Their values cannot be checked while tracing, so
  they have a defined, loud result instead: such an element's loss is **NaN**, which
  makes a ``"mean"``/``"sum"`` NaN too (and its gradients). Negative ids are never
  wrapped around NumPy-style, and nothing is read out of bounds.

* **Precision.** bfloat16/float16 inputs are upcast to float32 inside every loss, and
  the result is float32 (float64 stays float64): a log-softmax or a mean over a batch
  in bfloat16 loses most of its digits. Gradients flow back to the inputs in their own
  dtype. There is no opt-out, on purpose: the cast fuses into the loss's elementwise
  work, and a half-precision loss value is never what training wants; cast the result
  if a lower-precision value is needed. :func:`center_loss` keeps its centers' dtype.

Center loss keeps its class centers as explicit state: :func:`center_loss_init` makes
them and :func:`center_loss` returns ``(loss, new_centers)``.
"""

from __future__ import annotations

# One module per family, all private: this package is the one import path of every loss.
from funcnet.losses._center import center_loss, center_loss_init
from funcnet.losses._classification import (
    binary_cross_entropy,
    cross_entropy,
    kl_div,
    nll_loss,
    sigmoid_binary_cross_entropy,
)
from funcnet.losses._embedding import (
    cosine_embedding_loss,
    hinge_embedding_loss,
    margin_ranking_loss,
    triplet_margin_loss,
)
from funcnet.losses._margin import (
    hinge,
    multiclass_hinge,
    multilabel_margin_loss,
    multilabel_soft_margin_loss,
    soft_margin_loss,
)
from funcnet.losses._regression import gaussian_nll_loss, huber, mae, mse, poisson_nll_loss, smooth_l1
from funcnet.losses._sequence import ctc_loss

__all__ = [
    "cross_entropy",
    "nll_loss",
    "sigmoid_binary_cross_entropy",
    "mse",
    "mae",
    "huber",
    "hinge",
    "multiclass_hinge",
    "smooth_l1",
    "center_loss_init",
    "center_loss",
    "binary_cross_entropy",
    "kl_div",
    "cosine_embedding_loss",
    "margin_ranking_loss",
    "triplet_margin_loss",
    "poisson_nll_loss",
    "gaussian_nll_loss",
    "ctc_loss",
    "soft_margin_loss",
    "multilabel_margin_loss",
    "multilabel_soft_margin_loss",
    "hinge_embedding_loss",
]

# The losses are named after their public home, not the private module they are written
# in: help(), reprs and pickles say funcnet.losses.X, and doctest finds their examples here
# (with this package's namespace), where the docs render them.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
