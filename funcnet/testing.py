"""The layer contract, as a chex-based check users can run on their own layers.

>>> from funcnet.testing import check_layer
>>> out_shape, params, state = check_layer(funcnet.layers.Dense(3), (-1, 5))
>>> out_shape
(-1, 3)

``check_layer`` asserts, for every ``train`` mode asked for:

1. ``init``'s output shape equals the shape ``apply`` actually returns (with the
   ``-1`` batch entries filled in);
2. the state tree keeps its structure, shapes and dtypes across ``apply``, and a
   stateless layer (``state == ()``) returns ``()``;
3. ``jax.jit(apply)`` gives the same result as ``apply``;
4. ``jax.test_util.check_grads`` (reverse mode, order 1) passes on params and on
   floating inputs, in float64, so the finite differences are meaningful.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads
from jax.typing import DTypeLike

from funcnet.core import Layer, PyTree, as_layer

__all__ = ["check_layer", "fill_batch", "random_inputs"]


def fill_batch(shape: Sequence[Any], batch: int = 2) -> tuple:
    """Replaces -1 entries of a shape (or a pytree of shapes) by ``batch``.

    Args:
      shape: a shape, or a tuple/list of shapes (nested).
      batch: the size that replaces -1.

    Returns:
      ``shape`` with every -1 replaced, as tuples.

    Examples:
      >>> fill_batch((-1, 3)), fill_batch(((-1, 3), (-1, 4, 5)), batch=8)
      ((2, 3), ((8, 3), (8, 4, 5)))
    """
    if _is_shape(shape):
        return tuple(batch if d == -1 else d for d in shape)
    return type(shape)(fill_batch(s, batch) for s in shape)


def random_inputs(
    rng: jax.Array, input_shape: Sequence[Any], dtype: DTypeLike = jnp.float32, batch: int = 2
) -> jax.Array | Tuple[jax.Array, ...]:
    """Standard-normal inputs of ``input_shape`` (a shape or a tuple of shapes).

    Args:
      rng: a PRNG key.
      input_shape: a shape or a tuple of shapes, -1 for the batch.
      dtype: the inputs' floating dtype.
      batch: the size that replaces -1.

    Returns:
      An array, or a tuple of arrays for a tuple of shapes.

    Examples:
      >>> x = random_inputs(jax.random.key(0), (-1, 3))
      >>> x.shape, x.dtype
      ((2, 3), dtype('float32'))
      >>> [a.shape for a in random_inputs(jax.random.key(0), ((-1, 3), (-1, 5)), batch=4)]
      [(4, 3), (4, 5)]
    """
    if _is_shape(input_shape):
        return jax.random.normal(rng, fill_batch(input_shape, batch), dtype)
    keys = jax.random.split(rng, len(input_shape))
    return tuple(random_inputs(k, s, dtype, batch) for k, s in zip(keys, input_shape))


def check_layer(
    layer: Layer,
    input_shape: Sequence[Any],
    *,
    rng: Optional[jax.Array] = None,
    train_modes: Sequence[bool] = (False, True),
    grad_check: bool = True,
    inputs: Optional[PyTree] = None,
    batch: int = 2,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    grad_eps: float = 1e-4,
) -> Tuple[Any, PyTree, PyTree]:
    """Asserts that ``layer`` honours funcnet's layer contract; raises AssertionError if not.

    Args:
      layer: the ``(init, apply)`` pair under test.
      input_shape: passed to ``init``; -1 entries become ``batch`` for the real inputs.
      rng: a PRNG key (default ``jax.random.key(0)``); used for init, inputs and ``apply``.
      train_modes: the values of ``train`` to check ``apply`` under.
      grad_check: run ``jax.test_util.check_grads`` on params and floating inputs.
      inputs: the inputs to use instead of standard-normal ones (e.g. token ids for
        an Embedding). Their shape must match ``input_shape`` with the batch filled in.
      batch: the batch size that replaces -1 in ``input_shape``.
      atol: the absolute tolerance of the jit-versus-eager comparison.
      rtol: the relative tolerance of the jit-versus-eager comparison.
      grad_eps: the finite-difference step of the gradient check.

    Returns:
      ``(output_shape, params, state)`` from ``init``, for further checks.

    Raises:
      AssertionError: a clause of the contract fails; the message names the layer,
        the ``train`` mode and the clause.
      TypeError: ``layer`` is not a layer.

    Examples:
      >>> from funcnet.layers import Dropout
      >>> out_shape, params, state = check_layer(Dropout(0.5), (-1, 4), grad_check=False)
      >>> out_shape, params, state
      ((-1, 4), (), ())
    """
    layer = as_layer(layer, "check_layer")
    rng = jax.random.key(0) if rng is None else rng
    init_key, input_key, apply_key = jax.random.split(rng, 3)
    out_shape, params, state = layer.init(init_key, input_shape)
    if inputs is None:
        inputs = random_inputs(input_key, input_shape, batch=batch)
    name = layer.name

    for train in train_modes:
        where = f"{name} (train={train})"
        out, new_state = layer.apply(params, state, inputs, rng=apply_key, train=train)

        expected = fill_batch(out_shape, _batch_of(inputs, input_shape, batch))
        actual = jax.tree.map(lambda x: tuple(x.shape), out)
        if _is_shape(expected):
            chex.assert_shape(
                out,
                expected,
                custom_message=f"{where}: init's output shape {tuple(out_shape)} disagrees with apply's output",
            )
        else:
            assert _shapes_equal(actual, expected), (
                f"{where}: init's output shapes {out_shape} disagree with apply's {actual}"
            )

        if _is_empty_tuple(state):
            assert _is_empty_tuple(new_state), f"{where}: a stateless layer must return state (), got {new_state!r}"
        else:
            chex.assert_trees_all_equal_structs(state, new_state)
            chex.assert_trees_all_equal_shapes_and_dtypes(state, new_state)

        jit_out, jit_state = jax.jit(lambda p, s, x, k: layer.apply(p, s, x, rng=k, train=train))(
            params, state, inputs, apply_key
        )
        chex.assert_trees_all_close(
            (jit_out, jit_state),
            (out, new_state),
            atol=atol,
            rtol=rtol,
            custom_message=f"{where}: jit(apply) differs from apply",
        )

        if grad_check:
            _check_grads(layer, params, state, inputs, apply_key, train, grad_eps)
    return out_shape, params, state


def _check_grads(layer, params, state, inputs, key, train, eps):
    with jax.enable_x64(True):
        params64, state64, inputs64 = _to_f64((params, state, inputs))
        float_inputs = all(jnp.issubdtype(x.dtype, jnp.floating) for x in jax.tree.leaves(inputs64))

        # jit: check_grads calls f many times; eager apply would re-trace lax.scan each call.
        @jax.jit
        def f(p, x):
            return layer.apply(p, state64, x, rng=key, train=train)[0]

        if jax.tree.leaves(params64) and float_inputs:
            check_grads(f, (params64, inputs64), order=1, modes=["rev"], eps=eps)
        elif jax.tree.leaves(params64):
            check_grads(lambda p: f(p, inputs64), (params64,), order=1, modes=["rev"], eps=eps)
        elif float_inputs:
            check_grads(lambda x: f(params64, x), (inputs64,), order=1, modes=["rev"], eps=eps)


def _is_empty_tuple(x) -> bool:
    return isinstance(x, tuple) and not x


def _to_f64(tree):
    def cast(x):
        x = jnp.asarray(x)
        return x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree.map(cast, tree)


def _is_shape(s) -> bool:
    return isinstance(s, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in s)


def _batch_of(inputs, input_shape, default):
    """The batch size that replaced -1 in the inputs actually given."""
    for x, s in zip(jax.tree.leaves(inputs), _leaf_shapes(input_shape)):
        for d, want in zip(x.shape, s):
            if want == -1:
                return d
    return default


def _leaf_shapes(shape):
    if _is_shape(shape):
        return [tuple(shape)]
    return [t for s in shape for t in _leaf_shapes(s)]


def _shapes_equal(actual, expected) -> bool:
    if _is_shape(expected):
        return tuple(actual) == tuple(expected)
    return (
        isinstance(actual, (tuple, list))
        and len(actual) == len(expected)
        and all(_shapes_equal(a, e) for a, e in zip(actual, expected))
    )
