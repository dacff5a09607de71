"""Recurrent layers: RNN, LSTM and GRU, with PyTorch's parameters and gate equations.

All three share one driver (:func:`_recurrent`): the input projection
``x @ W_ih + b_ih`` of every time step is one batched matmul, then ``lax.scan``
runs the cell over time (no Python loop, so it traces once and is jit/pmap clean).

Parameter layout, for ``G`` gates (RNN 1, LSTM 4, GRU 3), ``F`` input features and
``H`` hidden units, chosen so that loading torch weights is a transpose:

```
params["W_ih"]  (F, G*H)  = torch weight_ih_l0.T
params["W_hh"]  (H, G*H)  = torch weight_hh_l0.T
params["b_ih"]  (G*H,)    = torch bias_ih_l0
params["b_hh"]  (G*H,)    = torch bias_hh_l0       (both absent for bias=False)
params["W_hr"]  (H, P)    = torch weight_hr_l0.T   (LSTM(proj_size=P) only; W_hh
                                                    is then (P, G*H))
```

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
from funcnet.core import Layer, check_input, check_known, check_shape, named, need_rng
from funcnet.layers.dense import linear

__all__ = ["RNN", "LSTM", "GRU"]


class _Cell(NamedTuple):
    """A recurrent cell for :func:`_recurrent`.

    ``step(params, carry, xp) -> carry`` gets ``xp = x_t @ W_ih + b_ih`` (already
    projected) and returns the new carry, a tuple whose first entry is ``h_t``.
    """

    kind: str
    gates: int
    carry_size: int  # number of (N, H) arrays in the carry
    step: Callable


def _recurrent(
    cell: _Cell,
    hidden_size: int,
    return_sequences: bool,
    num_layers: int = 1,
    bidirectional: bool = False,
    dropout: float = 0.0,
    return_state: bool = False,
    bias: bool = True,
    proj_size: int = 0,
) -> Layer:
    """Builds the layer: shared init, input checks and the ``lax.scan`` over time."""
    hidden_size, num_layers, dropout, proj_size = _checked_options(
        cell, hidden_size, return_sequences, num_layers, bidirectional, dropout, return_state, bias, proj_size
    )
    name = f"{cell.kind}({hidden_size}" + (f", proj_size={proj_size})" if proj_size else ")")
    H = hidden_size
    P = proj_size or H  # the size of h (each step's output), torch's proj_size when given
    sizes = (P,) + (H,) * (cell.carry_size - 1)  # h's, then c's (LSTM) last axis
    dirs = 2 if bidirectional else 1
    flat = num_layers == 1 and not bidirectional  # the layout of a one-layer, one-way RNN
    keys = [f"l{k}" + ("_reverse" if d else "") for k in range(num_layers) for d in range(dirs)]
    init_one = _direction_init(cell.gates, H, proj_size, bias)

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=3, what="(batch, time, features)")
        check_known(name, shape, [-1], "feature dimension")
        if flat:
            params = init_one(rng, shape[-1])
        else:
            rngs = jax.random.split(rng, len(keys))
            params = {key: init_one(r, shape[-1] if key.startswith("l0") else dirs * P) for key, r in zip(keys, rngs)}
        width = dirs * P
        out_shape = (shape[0], shape[1], width) if return_sequences else (shape[0], width)
        if return_state:
            final = tuple((num_layers * dirs, shape[0], s) for s in sizes)
            out_shape = (out_shape, final if cell.carry_size > 1 else final[0])
        return out_shape, params, ()

    def apply(params, state, inputs, *, rng=None, train=False, initial_state=None, lengths=None):
        first = params if flat else params["l0"]
        check_input(name, inputs, rank=3, axis=-1, size=first["W_ih"].shape[0])
        N, T = _batch_and_steps(name, inputs)
        if lengths is not None:
            lengths = _checked_lengths(name, lengths, N, T)
        carries = None if initial_state is None else _initial_carries(name, initial_state, sizes, num_layers * dirs, N)
        drop = dropout if train and num_layers > 1 else 0.0
        if drop:
            need_rng(name, rng)
        x, finals = inputs, []
        for k in range(num_layers):
            outs = []
            for d in range(dirs):
                index = k * dirs + d
                p = params if flat else params[keys[index]]
                carry0 = None if carries is None else tuple(c[index] for c in carries)
                hs, carry = _run_direction(cell, sizes, p, x, carry0, lengths, reverse=bool(d))
                outs.append(hs)
                finals.append(carry)
            x = outs[0] if dirs == 1 else jnp.concatenate(outs, axis=-1)
            if drop and k < num_layers - 1:
                keep = jax.random.bernoulli(jax.random.fold_in(rng, k), 1.0 - drop, x.shape)
                x = jnp.where(keep, x / (1.0 - drop), 0.0)
        if return_sequences:
            out = x
        elif dirs == 1:
            out = finals[-1][0]
        else:  # torch's h_n of the last layer: forward's last valid step, reverse's first
            out = jnp.concatenate([finals[-2][0], finals[-1][0]], axis=-1)
        if return_state:
            stacked = tuple(jnp.stack([f[i] for f in finals]) for i in range(cell.carry_size))
            out = (out, stacked if cell.carry_size > 1 else stacked[0])
        return out, state

    return named(name, init, apply)


def _checked_options(
    cell, hidden_size, return_sequences, num_layers, bidirectional, dropout, return_state, bias, proj_size=0
):
    """The layer's arguments checked: ``(hidden_size, num_layers, dropout, proj_size)``."""
    hidden_size = checks.positive_int(cell.kind, "hidden_size", hidden_size)
    for flag, value in (
        ("return_sequences", return_sequences),
        ("bidirectional", bidirectional),
        ("return_state", return_state),
        ("bias", bias),
    ):
        if not isinstance(value, bool):
            raise ValueError(f"{cell.kind}: {flag} must be True or False, got {value!r}.")
    num_layers = checks.positive_int(cell.kind, "num_layers", num_layers)
    dropout = checks.real(cell.kind, "dropout", dropout, low=0.0)
    if dropout >= 1.0:
        raise checks.ArgumentError(
            f"{cell.kind}: dropout={dropout!r} must be in [0, 1): the "
            f"probability of zeroing each output of a layer but the last."
        )
    proj_size = checks.non_negative_int(cell.kind, "proj_size", proj_size)
    if proj_size >= hidden_size:
        raise checks.ArgumentError(
            f"{cell.kind}: proj_size={proj_size} has to be smaller than hidden_size="
            f"{hidden_size} (as torch requires): the projection W_hr maps each step's "
            f"{hidden_size} hidden units down to proj_size outputs. Give a proj_size below "
            f"{hidden_size}, or 0 (the default) for no projection."
        )
    return hidden_size, num_layers, dropout, proj_size


def _direction_init(G: int, H: int, proj_size: int, bias: bool):
    """``init_one(rng, features)``: one layer and direction's params, every entry from
    torch's ``U(-1/sqrt(H), 1/sqrt(H))`` (``W_hr`` too, with a projection)."""
    uniform = initializers.uniform_symmetric(1.0 / math.sqrt(H))

    def init_one(rng, features):
        k = jax.random.split(rng, 4)
        p = {
            "W_ih": uniform(k[0], (features, G * H), jnp.float32),
            "W_hh": uniform(k[1], (proj_size or H, G * H), jnp.float32),
        }
        if bias:
            p["b_ih"] = uniform(k[2], (G * H,), jnp.float32)
            p["b_hh"] = uniform(k[3], (G * H,), jnp.float32)
        if proj_size:
            # fold_in, not a fifth split: the entries above keep the values they have
            # without a projection
            p["W_hr"] = uniform(jax.random.fold_in(rng, 4), (H, proj_size), jnp.float32)
        return p

    return init_one


def _run_direction(cell: _Cell, sizes, p, x, carry0, lengths, reverse):
    """One direction of one layer over ``x`` (N, T, F): outputs (N, T, sizes[0]), last
    carry (its entries' last axes ``sizes``)."""
    T = x.shape[1]
    if reverse:
        x = _reverse_within(x, lengths)
    xp = linear(x, p["W_ih"], p.get("b_ih"))  # (N, T, G*H), all steps at once
    if carry0 is None:
        # zeros_like, not zeros: the carry must have the type the step gives it, i.e. the
        # input's batch sharding (Explicit mesh axes) and its varying axes (shard_map).
        carry0 = tuple(jnp.zeros_like(xp[:, 0, :s]) for s in sizes)
    else:
        carry0 = tuple(c.astype(xp.dtype) for c in carry0)
    valid = None if lengths is None else (jnp.arange(T)[None, :] < lengths[:, None])

    def body(carry, inp):
        xp_t, ok = inp
        new = cell.step(p, carry, xp_t)
        if ok is not None:
            new = tuple(jnp.where(ok[:, None], n, c) for n, c in zip(new, carry))
            out = jnp.where(ok[:, None], new[0], 0.0)
        else:
            out = new[0]
        return new, out

    steps = (jnp.swapaxes(xp, 0, 1), None if valid is None else valid.T)
    carry, hs = lax.scan(body, carry0, steps)  # scan runs over axis 0: time
    hs = jnp.swapaxes(hs, 0, 1)
    return (_reverse_within(hs, lengths) if reverse else hs), carry


def _hidden(params, h):
    """``h @ W_hh + b_hh``; no bias term at all for ``bias=False``."""
    out = h @ params["W_hh"]
    return out + params["b_hh"] if "b_hh" in params else out


def _batch_and_steps(name, inputs):
    """``(N, T)`` of a ``(N, T, F)`` input (its rank and features already checked), which
    must have a time step (at trace time): torch raises on an empty sequence too."""
    N, T = inputs.shape[0], inputs.shape[1]
    if T == 0:
        raise ValueError(
            f"{name}: the input has no time steps (shape {tuple(inputs.shape)}, "
            f"(batch, time, features) with time 0), so there is no last step "
            f"or state to return; torch raises on an empty sequence too. Give "
            f"at least one step, or skip the layer for empty sequences."
        )
    return N, T


def _checked_lengths(name, lengths, N, T):
    lengths = jnp.asarray(lengths)
    if lengths.shape != (N,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(
            f"{name}: lengths must be {N} integers (one per sequence of the "
            f"batch), got shape {tuple(lengths.shape)} and dtype {lengths.dtype}."
        )
    checks.concrete_within(
        name, "lengths", lengths, 0, T, what=" (the sequence length)", fix="Pass each sequence's number of valid steps."
    )
    # Under jit the values are not known: clipped, a negative length acts as 0 and one
    # past T as T (unclipped, the reverse direction would read past the end: NaN).
    return jnp.clip(lengths, 0, T)


def _initial_carries(name, initial_state, sizes, n, N):
    """The given initial carries, each (num_layers * directions, N, size), checked."""
    carry_size = len(sizes)
    want = [(n, N, s) for s in sizes]
    if len(set(sizes)) == 1:
        shapes = f"shape {want[0]}"
    else:  # LSTM(proj_size=P): h_0 has P features, c_0 H
        shapes = f"shapes {want[0]} (h_0) and {want[1]} (c_0)"
    given = initial_state if carry_size > 1 else (initial_state,)
    if isinstance(given, list):  # [h_0, c_0], as torch's LSTM also takes it
        given = tuple(given)
    if not isinstance(given, tuple) or len(given) != carry_size:
        raise ValueError(
            f"{name}: initial_state must be "
            f"{'(h_0, c_0)' if carry_size > 1 else 'h_0'}, arrays of {shapes} "
            f"(layers x directions, batch, hidden), as torch's."
        )
    for g, w, what in zip(given, want, ("h_0", "c_0")):
        if tuple(jnp.shape(g)) != w:
            raise ValueError(
                f"{name}: initial_state arrays must have {shapes} "
                f"(layers x directions, batch, hidden), as torch's; got "
                f"{tuple(jnp.shape(g))} for {what}."
            )
    return tuple(jnp.asarray(g) for g in given)


def _reverse_within(x, lengths):
    """Each sequence's first ``length`` steps reversed, its padding left in place
    (what a packed sequence's reverse direction reads); all of it without lengths."""
    if lengths is None:
        return jnp.flip(x, axis=1)
    T = x.shape[1]
    t = jnp.arange(T)[None, :]
    idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return jnp.take_along_axis(x, idx[:, :, None], axis=1)


def RNN(
    hidden_size: int,
    nonlinearity: str = "tanh",
    return_sequences: bool = True,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    dropout: float = 0.0,
    return_state: bool = False,
    bias: bool = True,
) -> Layer:
    """Elman RNN, as ``torch.nn.RNN(F, hidden_size, nonlinearity, batch_first=True)``:

    ```
    h_t = act(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh),   h_0 = 0
    ```

    Input ``(N, T, F)`` (batch first); output ``(N, T, H)`` every step, or ``(N, H)``
    the last step when ``return_sequences=False``. ``nonlinearity`` is ``"tanh"``
    or ``"relu"``. Parameter layout: see :mod:`funcnet.layers.recurrent`.

    Options, as torch's: ``num_layers`` stacked layers (each layer's input is the one
    below's output), ``bidirectional`` (a second pass over the reversed sequence; the
    output's last axis is ``2 * H``, forward then reverse), ``dropout`` on every layer's
    output but the last (training only, needs ``rng``). ``apply(..., initial_state=,
    lengths=)``: ``initial_state`` is torch's ``h_0`` (LSTM: ``(h_0, c_0)``) of shape
    ``(num_layers * directions, N, H)``, zeros by default; ``lengths`` (``(N,)`` ints)
    marks each sequence's valid steps: padded steps leave the state as it was and
    output zeros, and the reverse direction starts at each sequence's last valid step,
    as ``pack_padded_sequence`` gives; lengths outside ``[0, T]`` are an error when
    known, and clipped to it under ``jit``. ``return_state=True`` makes the output
    ``(outputs, h_n)`` (LSTM: ``(outputs, (h_n, c_n))``), torch's final states, each
    ``(num_layers * directions, N, H)``. With ``return_sequences=False`` the output is
    the last layer's final ``h`` (both directions side by side).
    Parameters: one layer, one direction keeps the flat layout above; otherwise one
    such dict per layer and direction under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ...
    (torch's ``weight_ih_l1_reverse`` is ``params["l1_reverse"]["W_ih"].T``).
    ``bias=False`` (torch's) drops ``b_ih`` and ``b_hh`` everywhere: the equations
    above without their bias terms.

    Args:
      hidden_size: the number of hidden units ``H``, a positive int.
      nonlinearity: ``"tanh"`` or ``"relu"``.
      return_sequences: True outputs ``h`` at every step, ``(N, T, D * H)``; False only
        the last, ``(N, D * H)`` (``D`` is 2 when bidirectional, else 1).
      num_layers: the number of stacked layers, a positive int.
      bidirectional: True adds a pass over the reversed sequence.
      dropout: the probability of zeroing each output of every layer but the last in
        train mode, in ``[0, 1)``.
      return_state: True also outputs torch's final state ``h_n``.
      bias: False drops ``b_ih`` and ``b_hh``.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, (N, T, F))`` gives
      ``(output_shape, params, ())`` (stateless). The output shape is ``(N, T, D * H)``
      or ``(N, D * H)``; with ``return_state``, paired with the final states' shapes,
      ``h_n``: ``(num_layers * D, N, H)``.
      Params ``{"W_ih": (F, H), "W_hh": (H, H), "b_ih": (H,), "b_hh": (H,)}``
      (float32) for one layer and direction, else one such dict per layer and direction
      under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ... (``W_ih`` ``(D * H, H)`` above
      the first layer).

    Raises:
      ArgumentError: ``hidden_size`` or ``num_layers`` not a positive int, or
        ``dropout`` outside ``[0, 1)``.
      ValueError: a flag that is not a bool, or ``nonlinearity`` not ``"tanh"``/``"relu"``; ``lengths`` of the wrong
        shape or dtype, or (outside ``jit``) outside ``[0, T]``; a badly shaped
        ``initial_state``.

    Examples:
      >>> init, apply = RNN(4)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 3))  # (N, T, F)
      >>> out_shape, {k: v.shape for k, v in sorted(params.items())}
      ((-1, 5, 4), {'W_hh': (4, 4), 'W_ih': (3, 4), 'b_hh': (4,), 'b_ih': (4,)})
      >>> apply(params, state, jnp.ones((2, 5, 3)))[0].shape
      (2, 5, 4)
    """
    acts = {"tanh": jnp.tanh, "relu": jax.nn.relu}
    if nonlinearity not in acts:
        raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}.")
    act = acts[nonlinearity]

    def step(params, carry, xp):
        (h,) = carry
        return (act(xp + _hidden(params, h)),)

    return _recurrent(
        _Cell("RNN", 1, 1, step), hidden_size, return_sequences, num_layers, bidirectional, dropout, return_state, bias
    )


def LSTM(
    hidden_size: int,
    return_sequences: bool = True,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    dropout: float = 0.0,
    return_state: bool = False,
    bias: bool = True,
    proj_size: int = 0,
) -> Layer:
    """LSTM, as ``torch.nn.LSTM(F, hidden_size, batch_first=True)``:

    ```
    i, f, g, o = split(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh, 4)
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t = sigmoid(o) * tanh(c_t),                      h_0 = c_0 = 0
    ```

    Input ``(N, T, F)``; output ``h``: ``(N, T, H)`` or, with
    ``return_sequences=False``, ``(N, H)``. Parameter layout: see
    :mod:`funcnet.layers.recurrent` (gate order ``i, f, g, o``).

    Options, as torch's: ``num_layers`` stacked layers (each layer's input is the one
    below's output), ``bidirectional`` (a second pass over the reversed sequence; the
    output's last axis is ``2 * H``, forward then reverse), ``dropout`` on every layer's
    output but the last (training only, needs ``rng``). ``apply(..., initial_state=,
    lengths=)``: ``initial_state`` is torch's ``h_0`` (LSTM: ``(h_0, c_0)``) of shape
    ``(num_layers * directions, N, H)``, zeros by default; ``lengths`` (``(N,)`` ints)
    marks each sequence's valid steps: padded steps leave the state as it was and
    output zeros, and the reverse direction starts at each sequence's last valid step,
    as ``pack_padded_sequence`` gives; lengths outside ``[0, T]`` are an error when
    known, and clipped to it under ``jit``. ``return_state=True`` makes the output
    ``(outputs, h_n)`` (LSTM: ``(outputs, (h_n, c_n))``), torch's final states, each
    ``(num_layers * directions, N, H)``. With ``return_sequences=False`` the output is
    the last layer's final ``h`` (both directions side by side).
    Parameters: one layer, one direction keeps the flat layout above; otherwise one
    such dict per layer and direction under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ...
    (torch's ``weight_ih_l1_reverse`` is ``params["l1_reverse"]["W_ih"].T``).
    ``bias=False`` (torch's) drops ``b_ih`` and ``b_hh`` everywhere: the equations
    above without their bias terms.

    ``proj_size=P`` (``0 < P < H``; torch's ``proj_size``, an LSTM with projections,
    Sak et al. 2014) projects each step's output down to ``P`` features:

    ```
    h_t = (sigmoid(o) * tanh(c_t)) @ W_hr,            W_hr (H, P) = torch weight_hr_l0.T
    ```

    with one ``W_hr`` per layer and direction (torch's ``weight_hr_l{k}[_reverse]``,
    drawn from ``U(-1/sqrt(H), 1/sqrt(H))`` as every other entry). ``h`` then has ``P``
    features everywhere ``H`` is written above for it: the outputs ``(N, T, D * P)``,
    ``W_hh`` ``(P, 4 * H)``, the next layer's input ``D * P``, ``h_0``/``h_n``
    ``(num_layers * D, N, P)``; the cell state ``c`` keeps ``H`` (``c_0``/``c_n``
    ``(num_layers * D, N, H)``).

    Args:
      hidden_size: the number of hidden units ``H``, a positive int.
      return_sequences: True outputs ``h`` at every step, ``(N, T, D * H)``; False only
        the last, ``(N, D * H)`` (``D`` is 2 when bidirectional, else 1).
      num_layers: the number of stacked layers, a positive int.
      bidirectional: True adds a pass over the reversed sequence.
      dropout: the probability of zeroing each output of every layer but the last in
        train mode, in ``[0, 1)``.
      return_state: True also outputs torch's final states ``(h_n, c_n)``.
      bias: False drops ``b_ih`` and ``b_hh``.
      proj_size: ``P``, the size of ``h`` after the projection ``W_hr``, an int with
        ``0 < P < H``; 0 (the default) for no projection.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, (N, T, F))`` gives
      ``(output_shape, params, ())`` (stateless). The output shape is ``(N, T, D * H)``
      or ``(N, D * H)``; with ``return_state``, paired with the final states' shapes,
      ``(h_n, c_n)``: each ``(num_layers * D, N, H)``.
      Params ``{"W_ih": (F, 4 * H), "W_hh": (H, 4 * H), "b_ih": (4 * H,), "b_hh": (4 * H,)}``
      (float32) for one layer and direction, else one such dict per layer and direction
      under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ... (``W_ih`` ``(D * H, 4 * H)`` above
      the first layer).

    Raises:
      ArgumentError: ``hidden_size`` or ``num_layers`` not a positive int,
        ``dropout`` outside ``[0, 1)``, or ``proj_size`` not an int in ``[0, H)``.
      ValueError: a flag that is not a bool; ``lengths`` of the wrong
        shape or dtype, or (outside ``jit``) outside ``[0, T]``; a badly shaped
        ``initial_state``.

    Examples:
      >>> init, apply = LSTM(4, return_sequences=False, return_state=True)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 3))
      >>> params["W_ih"].shape, params["W_hh"].shape  # gates i, f, g, o side by side
      ((3, 16), (4, 16))
      >>> h, (h_n, c_n) = apply(params, state, jnp.ones((2, 5, 3)))[0]
      >>> h.shape, h_n.shape, c_n.shape  # h_n: (num_layers * directions, N, H)
      ((2, 4), (1, 2, 4), (1, 2, 4))
      >>> init, apply = LSTM(4, proj_size=2, return_state=True)   # h: 2 features, c: 4
      >>> _, params, state = init(jax.random.key(0), (-1, 5, 3))
      >>> params["W_hh"].shape, params["W_hr"].shape
      ((2, 16), (4, 2))
      >>> y, (h_n, c_n) = apply(params, state, jnp.ones((2, 5, 3)))[0]
      >>> y.shape, h_n.shape, c_n.shape
      ((2, 5, 2), (1, 2, 2), (1, 2, 4))
    """

    def step(params, carry, xp):
        h, c = carry
        i, f, g, o = jnp.split(xp + _hidden(params, h), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h @ params["W_hr"] if "W_hr" in params else h), c

    return _recurrent(
        _Cell("LSTM", 4, 2, step),
        hidden_size,
        return_sequences,
        num_layers,
        bidirectional,
        dropout,
        return_state,
        bias,
        proj_size,
    )


def GRU(
    hidden_size: int,
    return_sequences: bool = True,
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    dropout: float = 0.0,
    return_state: bool = False,
    bias: bool = True,
) -> Layer:
    """GRU, as ``torch.nn.GRU(F, hidden_size, batch_first=True)``:

    ```
    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
    h_t = (1 - z) * n + z * h_{t-1},                   h_0 = 0
    ```

    (``b_hn`` sits inside the ``r *`` product, which is why the two biases are kept
    apart.) Input ``(N, T, F)``; output ``(N, T, H)`` or ``(N, H)``. Parameter
    layout: see :mod:`funcnet.layers.recurrent` (gate order ``r, z, n``).

    Options, as torch's: ``num_layers`` stacked layers (each layer's input is the one
    below's output), ``bidirectional`` (a second pass over the reversed sequence; the
    output's last axis is ``2 * H``, forward then reverse), ``dropout`` on every layer's
    output but the last (training only, needs ``rng``). ``apply(..., initial_state=,
    lengths=)``: ``initial_state`` is torch's ``h_0`` (LSTM: ``(h_0, c_0)``) of shape
    ``(num_layers * directions, N, H)``, zeros by default; ``lengths`` (``(N,)`` ints)
    marks each sequence's valid steps: padded steps leave the state as it was and
    output zeros, and the reverse direction starts at each sequence's last valid step,
    as ``pack_padded_sequence`` gives; lengths outside ``[0, T]`` are an error when
    known, and clipped to it under ``jit``. ``return_state=True`` makes the output
    ``(outputs, h_n)`` (LSTM: ``(outputs, (h_n, c_n))``), torch's final states, each
    ``(num_layers * directions, N, H)``. With ``return_sequences=False`` the output is
    the last layer's final ``h`` (both directions side by side).
    Parameters: one layer, one direction keeps the flat layout above; otherwise one
    such dict per layer and direction under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ...
    (torch's ``weight_ih_l1_reverse`` is ``params["l1_reverse"]["W_ih"].T``).
    ``bias=False`` (torch's) drops ``b_ih`` and ``b_hh`` everywhere: the equations
    above without their bias terms.

    Args:
      hidden_size: the number of hidden units ``H``, a positive int.
      return_sequences: True outputs ``h`` at every step, ``(N, T, D * H)``; False only
        the last, ``(N, D * H)`` (``D`` is 2 when bidirectional, else 1).
      num_layers: the number of stacked layers, a positive int.
      bidirectional: True adds a pass over the reversed sequence.
      dropout: the probability of zeroing each output of every layer but the last in
        train mode, in ``[0, 1)``.
      return_state: True also outputs torch's final state ``h_n``.
      bias: False drops ``b_ih`` and ``b_hh``.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, (N, T, F))`` gives
      ``(output_shape, params, ())`` (stateless). The output shape is ``(N, T, D * H)``
      or ``(N, D * H)``; with ``return_state``, paired with the final states' shapes,
      ``h_n``: ``(num_layers * D, N, H)``.
      Params ``{"W_ih": (F, 3 * H), "W_hh": (H, 3 * H), "b_ih": (3 * H,), "b_hh": (3 * H,)}``
      (float32) for one layer and direction, else one such dict per layer and direction
      under ``"l0"``, ``"l0_reverse"``, ``"l1"``, ... (``W_ih`` ``(D * H, 3 * H)`` above
      the first layer).

    Raises:
      ArgumentError: ``hidden_size`` or ``num_layers`` not a positive int, or
        ``dropout`` outside ``[0, 1)``.
      ValueError: a flag that is not a bool; ``lengths`` of the wrong
        shape or dtype, or (outside ``jit``) outside ``[0, T]``; a badly shaped
        ``initial_state``.

    Examples:
      >>> init, apply = GRU(4, num_layers=2, bidirectional=True)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 3))
      >>> out_shape, sorted(params)  # forward and reverse side by side: 2 * 4 features
      ((-1, 5, 8), ['l0', 'l0_reverse', 'l1', 'l1_reverse'])
      >>> y, _ = apply(params, state, jnp.ones((2, 5, 3)), lengths=jnp.array([5, 3]))
      >>> y.shape, float(jnp.abs(y[1, 3:]).max())  # the padded steps output zeros
      ((2, 5, 8), 0.0)
    """

    def step(params, carry, xp):
        (h,) = carry
        xr, xz, xn = jnp.split(xp, 3, axis=-1)
        hr, hz, hn = jnp.split(_hidden(params, h), 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        return ((1.0 - z) * n + z * h,)

    return _recurrent(
        _Cell("GRU", 3, 1, step), hidden_size, return_sequences, num_layers, bidirectional, dropout, return_state, bias
    )
