"""Recurrent layers: RNN, LSTM and GRU, with PyTorch's parameters and gate equations.

All three share one driver (:func:`_recurrent`): the input projection
``x @ W_ih + b_ih`` of every time step is one batched matmul, then ``lax.scan``
runs the cell over time (no Python loop, so it traces once and is jit/pmap clean).

Parameter layout, for ``G`` gates (RNN 1, LSTM 4, GRU 3), ``F`` input features and
``H`` hidden units, chosen so that loading torch weights is a transpose::

    params["W_ih"]  (F, G*H)  = torch weight_ih_l0.T
    params["W_hh"]  (H, G*H)  = torch weight_hh_l0.T
    params["b_ih"]  (G*H,)    = torch bias_ih_l0
    params["b_hh"]  (G*H,)    = torch bias_hh_l0

The gate blocks sit along the last axis in torch's order: LSTM ``i, f, g, o``,
GRU ``r, z, n``. Every entry starts from ``U(-1/sqrt(H), 1/sqrt(H))``, as torch.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from funcnet import _checks as checks
from funcnet import initializers
from funcnet.core import Layer, check_input, check_known, check_shape, named


class _Cell(NamedTuple):
    """A recurrent cell for :func:`_recurrent`.

    ``step(params, carry, xp) -> carry`` gets ``xp = x_t @ W_ih + b_ih`` (already
    projected) and returns the new carry, a tuple whose first entry is ``h_t``.
    """

    kind: str
    gates: int
    carry_size: int  # number of (N, H) arrays in the carry
    step: Callable


def _recurrent(cell: _Cell, hidden_size: int, return_sequences: bool) -> Layer:
    """Builds the layer: shared init, input checks and the ``lax.scan`` over time."""
    hidden_size = checks.positive_int(cell.kind, "hidden_size", hidden_size)
    if not isinstance(return_sequences, bool):
        raise ValueError(f"{cell.kind}: return_sequences must be True or False, got "
                         f"{return_sequences!r}.")
    name = f"{cell.kind}({hidden_size})"
    H, G = hidden_size, cell.gates
    uniform = initializers.uniform_symmetric(1.0 / math.sqrt(H))

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=3, what="(batch, time, features)")
        check_known(name, shape, [-1], "feature dimension")
        k = jax.random.split(rng, 4)
        params = {
            "W_ih": uniform(k[0], (shape[-1], G * H), jnp.float32),
            "W_hh": uniform(k[1], (H, G * H), jnp.float32),
            "b_ih": uniform(k[2], (G * H,), jnp.float32),
            "b_hh": uniform(k[3], (G * H,), jnp.float32),
        }
        out_shape = (shape[0], shape[1], H) if return_sequences else (shape[0], H)
        return out_shape, params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        check_input(name, inputs, rank=3, axis=-1, size=params["W_ih"].shape[0])
        xp = inputs @ params["W_ih"] + params["b_ih"]          # (N, T, G*H), all steps at once
        # zeros_like, not zeros: the carry must have the type the step gives it, i.e. the
        # input's batch sharding (Explicit mesh axes) and its varying axes (shard_map).
        h0 = jnp.zeros_like(xp[:, 0, :H])
        carry0 = (h0,) * cell.carry_size

        def body(carry, xp_t):
            carry = cell.step(params, carry, xp_t)
            return carry, (carry[0] if return_sequences else None)

        carry, hs = lax.scan(body, carry0, jnp.swapaxes(xp, 0, 1))  # scan runs over axis 0: time
        return (jnp.swapaxes(hs, 0, 1) if return_sequences else carry[0]), state

    return named(name, init, apply)


def RNN(hidden_size: int, nonlinearity: str = "tanh", return_sequences: bool = True) -> Layer:
    """Elman RNN, as ``torch.nn.RNN(F, hidden_size, nonlinearity, batch_first=True)``::

        h_t = act(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh),   h_0 = 0

    Input ``(N, T, F)`` (batch first); output ``(N, T, H)`` every step, or ``(N, H)``
    the last step when ``return_sequences=False``. ``nonlinearity`` is ``"tanh"``
    or ``"relu"``. Parameter layout: see :mod:`funcnet.layers.recurrent`.
    """
    acts = {"tanh": jnp.tanh, "relu": jax.nn.relu}
    if nonlinearity not in acts:
        raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}.")
    act = acts[nonlinearity]

    def step(params, carry, xp):
        (h,) = carry
        return (act(xp + h @ params["W_hh"] + params["b_hh"]),)

    return _recurrent(_Cell("RNN", 1, 1, step), hidden_size, return_sequences)


def LSTM(hidden_size: int, return_sequences: bool = True) -> Layer:
    """LSTM, as ``torch.nn.LSTM(F, hidden_size, batch_first=True)``::

        i, f, g, o = split(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh, 4)
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
        h_t = sigmoid(o) * tanh(c_t),                      h_0 = c_0 = 0

    Input ``(N, T, F)``; output ``h``: ``(N, T, H)`` or, with
    ``return_sequences=False``, ``(N, H)``. Parameter layout: see
    :mod:`funcnet.layers.recurrent` (gate order ``i, f, g, o``).
    """

    def step(params, carry, xp):
        h, c = carry
        i, f, g, o = jnp.split(xp + h @ params["W_hh"] + params["b_hh"], 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    return _recurrent(_Cell("LSTM", 4, 2, step), hidden_size, return_sequences)


def GRU(hidden_size: int, return_sequences: bool = True) -> Layer:
    """GRU, as ``torch.nn.GRU(F, hidden_size, batch_first=True)``::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h_t = (1 - z) * n + z * h_{t-1},                   h_0 = 0

    (``b_hn`` sits inside the ``r *`` product, which is why the two biases are kept
    apart.) Input ``(N, T, F)``; output ``(N, T, H)`` or ``(N, H)``. Parameter
    layout: see :mod:`funcnet.layers.recurrent` (gate order ``r, z, n``).
    """

    def step(params, carry, xp):
        (h,) = carry
        xr, xz, xn = jnp.split(xp, 3, axis=-1)
        hr, hz, hn = jnp.split(h @ params["W_hh"] + params["b_hh"], 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        return ((1.0 - z) * n + z * h,)

    return _recurrent(_Cell("GRU", 3, 1, step), hidden_size, return_sequences)
