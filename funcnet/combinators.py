"""Combinators: layers built from layers, threading params, state and rng.

``serial`` and ``parallel`` keep one params/state entry per child (a tuple), so
the pytrees mirror the network. Every child gets its own key from
``jax.random.split``: two Dropouts in one ``serial`` never share a mask.

A network whose layers are all stateless may be applied with ``state=()``
instead of the nested ``((), (), ...)`` its init returns: each combinator
expands ``()`` into one ``()`` per child, however deep the nesting, and gives
``()`` back. A stateful layer reached this way fails, and the error names it.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp

from funcnet import _checks as checks
from funcnet.core import Layer, MismatchError, PyTree, as_layer, describe_tree, named, normalize_axis, split_rng

__all__ = [
    "serial",
    "parallel",
    "FanOut",
    "FanInSum",
    "FanInConcat",
    "Identity",
    "Residual",
    "Remat",
    "Scan",
    "stack_params",
    "unstack_params",
]


def serial(*layers, **named_layers) -> Layer:
    """Composes layers in sequence: ``serial(f, g)(x) = g(f(x))``.

    Positional ``serial(f, g)``: params and state are tuples with one entry per
    layer. Named ``serial(encoder=f, decoder=g)``: they are dicts keyed by those
    names, so ``params["encoder"]`` and the path ``"encoder/0/W"``
    (:func:`funcnet.params.paths`) address a sub-network; layers run in the order
    written. Keywords were chosen over ``("name", layer)`` pairs because a Layer is
    itself a pair, and a keyword cannot be mistaken for one. Mixing positional and
    named layers is an error (the order would be ambiguous). ``serial`` of serials nests.

    ``state=()`` is accepted when every layer is stateless (see the module docstring).

    Args:
      *layers: the layers, run in the order given; params and state are then tuples
        with one entry per layer.
      **named_layers: the layers by name (``encoder=f, decoder=g``), run in the order
        written; params and state are then dicts keyed by those names.

    Returns:
      The composed :class:`~funcnet.core.Layer`. Its ``init`` returns the last layer's
        output shape and params and state with one entry per layer: a tuple for positional
        layers, a dict keyed by name for named ones. Its ``apply`` feeds each layer's output
        to the next and returns the last output and the new state in the same structure
        (``()`` when given ``state=()`` and every layer is stateless).

    Raises:
      TypeError: layers given both positionally and by name, or an argument that is not
        a layer (an ``(init, apply)`` pair).
      MismatchError: from ``apply``, params or state that do not fit (another network's,
        or params and state swapped); the message gives the failing layer's path.

    Examples:
      >>> from funcnet.layers import Dense, Relu
      >>> init, apply = serial(Dense(4), Relu)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3))
      >>> out_shape, params[0]["W"].shape, state
      ((-1, 4), (3, 4), ((), ()))
      >>> net = serial(encoder=Dense(4), decoder=Dense(2))
      >>> sorted(net.init(jax.random.key(0), (-1, 3))[1])
      ['decoder', 'encoder']
    """
    if layers and named_layers:
        raise TypeError(
            f"serial: give the layers either all positionally or all by name, got "
            f"{len(layers)} positional and {sorted(named_layers)} named. Name them "
            f"all, e.g. serial(encoder=enc, decoder=dec)."
        )
    if named_layers:
        names = tuple(named_layers)
        layers = tuple(as_layer(l, f"serial({n}=...)") for n, l in named_layers.items())
    else:
        names, layers = None, tuple(as_layer(l, "serial") for l in layers)
    inits = tuple(l.init for l in layers)
    children = names if names else len(layers)

    def init(rng, input_shape):
        params, state = [], []
        for init_fn, key in zip(inits, split_rng(rng, len(layers))):
            input_shape, p, s = init_fn(key, input_shape)
            params.append(p)
            state.append(s)
        return input_shape, _pack(names, params), _pack(names, state)

    def apply(params, state, inputs, *, rng=None, train=False):
        given_empty = _is_empty_tuple(state)
        state = _expand_empty_state(state, children)
        _check_children("serial", params, state, children)
        new_state = []
        for i, (layer, key) in enumerate(zip(layers, split_rng(rng, len(layers)))):
            k = names[i] if names else i
            inputs, s = _apply_child("serial", k, layer, params[k], state[k], inputs, key, train, given_empty)
            new_state.append(s)
        return inputs, _keep_empty(given_empty, _pack(names, new_state))

    return named("serial", init, apply)


def parallel(*layers) -> Layer:
    """Applies the i-th layer to the i-th element of a tuple input.

    Input and output are tuples of the same length as ``layers``; use with
    ``FanOut`` and ``FanInSum``/``FanInConcat`` to build branches.

    ``state=()`` is accepted when every branch is stateless.

    Args:
      *layers: the branches; the i-th is applied to the i-th element of the input tuple.

    Returns:
      The composed :class:`~funcnet.core.Layer`. Its ``init`` takes a tuple of input
        shapes (one per layer) and returns the tuple of output shapes; params and state
        are tuples with one entry per layer. Its ``apply`` takes a tuple of inputs and
        returns the tuple of outputs and the new state tuple (``()`` when given
        ``state=()`` and every branch is stateless).

    Raises:
      TypeError: an argument that is not a layer, or (from ``init``/``apply``) an input
        that is not a tuple of shapes/arrays.
      ValueError: from ``init``/``apply``, a tuple whose length is not the number of layers.
      MismatchError: from ``apply``, params or state that do not fit; the message gives
        the failing branch's index.

    Examples:
      >>> from funcnet.layers import Dense
      >>> init, apply = parallel(Dense(4), Dense(2))
      >>> out_shape, params, state = init(jax.random.key(0), ((-1, 3), (-1, 5)))
      >>> out_shape
      ((-1, 4), (-1, 2))
      >>> [y.shape for y in apply(params, state, (jnp.ones((2, 3)), jnp.ones((2, 5))))[0]]
      [(2, 4), (2, 2)]
    """
    layers = tuple(as_layer(l, "parallel") for l in layers)
    inits = tuple(l.init for l in layers)
    n = len(layers)

    def init(rng, input_shape):
        _check_tuple("parallel", input_shape, n, "input_shape")
        outs = [f(k, shape) for f, k, shape in zip(inits, split_rng(rng, n), input_shape)]
        return tuple(o[0] for o in outs), tuple(o[1] for o in outs), tuple(o[2] for o in outs)

    def apply(params, state, inputs, *, rng=None, train=False):
        given_empty = _is_empty_tuple(state)
        state = _expand_empty_state(state, n)
        _check_children("parallel", params, state, n)
        _check_tuple("parallel", inputs, n, "inputs")
        outs = [
            _apply_child("parallel", i, layer, p, s, x, k, train, given_empty)
            for i, (layer, p, s, x, k) in enumerate(zip(layers, params, state, inputs, split_rng(rng, n)))
        ]
        return tuple(o[0] for o in outs), _keep_empty(given_empty, tuple(o[1] for o in outs))

    return named("parallel", init, apply)


def FanOut(num: int) -> Layer:
    """Copies its input ``num`` times into a tuple.

    Args:
      num: how many copies, a positive int.

    Returns:
      The new :class:`~funcnet.core.Layer`, without params or state (both ``()``),
        whose output is the tuple of ``num`` copies of its input (and ``init``'s output
        shape the tuple of ``num`` copies of the input shape).

    Raises:
      ArgumentError: ``num`` is not a positive int.

    Examples:
      >>> from funcnet.layers import Dense
      >>> init, apply = serial(FanOut(2), parallel(Dense(4), Dense(4)), FanInSum)
      >>> init(jax.random.key(0), (-1, 3))[0]
      (-1, 4)
      >>> FanOut(2).apply((), (), jnp.ones(3))[0][1].shape
      (3,)
    """
    num = checks.positive_int("FanOut", "num", num)

    def init(rng, input_shape):
        return (input_shape,) * num, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        return (inputs,) * num, state

    return named(f"FanOut({num})", init, apply)


def _fan_in_sum():
    def init(rng, input_shape):
        _check_tuple("FanInSum", input_shape, None, "input_shape")
        shapes = {tuple(s) for s in input_shape}
        if len(shapes) != 1:
            raise ValueError(f"FanInSum: all branches must have the same shape, got {tuple(input_shape)}.")
        return tuple(input_shape[0]), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_tuple("FanInSum", inputs, None, "inputs")
        shapes = {x.shape for x in inputs}
        if len(shapes) != 1:
            raise ValueError(f"FanInSum: all branches must have the same shape, got {[x.shape for x in inputs]}.")
        return sum(inputs[1:], inputs[0]), state

    return named("FanInSum", init, apply)


FanInSum = _fan_in_sum()
"""Sums a tuple of same-shaped inputs (the branches of a `FanOut` or `parallel`), as stax's
`FanInSum`; branches of different shapes are an error at `init`."""


def FanInConcat(axis: int = -1) -> Layer:
    """Concatenates a tuple of inputs along ``axis``.

    Args:
      axis: the axis to concatenate along, negative counting from the end.

    Returns:
      The new :class:`~funcnet.core.Layer`, without params or state (both ``()``),
        whose input is a tuple of arrays and whose output is their concatenation along
        ``axis`` (its size unknown, -1, in the output shape when any branch's is).

    Raises:
      ArgumentError: ``axis`` is not an int.
      TypeError: from ``init``/``apply``, an input that is not a tuple of shapes/arrays.
      ValueError: from ``init``, an ``axis`` out of range, or branch shapes that differ
        on another axis or in rank.

    Examples:
      >>> init, apply = FanInConcat(axis=-1)
      >>> init(jax.random.key(0), ((-1, 3), (-1, 5)))[0]
      (-1, 8)
      >>> apply((), (), (jnp.ones((2, 3)), jnp.zeros((2, 5))))[0].shape
      (2, 8)
    """
    axis = checks.integer("FanInConcat", "axis", axis)

    def init(rng, input_shape):
        _check_tuple("FanInConcat", input_shape, None, "input_shape")
        rank = len(input_shape[0])
        ax = normalize_axis("FanInConcat", axis, rank)
        for s in input_shape:
            if len(s) != rank or any(a != b for i, (a, b) in enumerate(zip(s, input_shape[0])) if i != ax):
                raise ValueError(
                    f"FanInConcat(axis={axis}): branch shapes must agree except on "
                    f"the concatenation axis, got {tuple(input_shape)}."
                )
        sizes = [s[ax] for s in input_shape]
        total = -1 if -1 in sizes else sum(sizes)
        out = list(input_shape[0])
        out[ax] = total
        return tuple(out), (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        _check_tuple("FanInConcat", inputs, None, "inputs")
        return jnp.concatenate(inputs, axis=axis), state

    return named(f"FanInConcat(axis={axis})", init, apply)


def _identity():
    def init(rng, input_shape):
        return input_shape, (), ()

    def apply(params, state, inputs, *, rng=None, train=False):
        return inputs, state

    return named("Identity", init, apply)


Identity = _identity()
"""Returns its input unchanged, as ``torch.nn.Identity``: no params, no state."""


def Residual(layer: Layer) -> Layer:
    """``x + f(x)``; ``f`` must preserve the shape of its input.

    The backward pass sums the gradient reaching ``x`` (from ``f`` and the skip) once,
    into one array, as PyTorch's autograd does: left to itself XLA:CPU fuses that sum
    into every later block's backward, work that grows with the square of the depth.

    Args:
      layer: ``f``, a layer whose output shape is its input shape.

    Returns:
      The composed :class:`~funcnet.core.Layer` computing ``x + f(x)``, with ``f``'s
        own params and state (not wrapped in a tuple).

    Raises:
      TypeError: ``layer`` is not a layer.
      ValueError: from ``init``, ``layer`` changes the shape of its input.

    Examples:
      >>> from funcnet.layers import Dense
      >>> init, apply = Residual(Dense(3, W_init=jax.nn.initializers.zeros))
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3))
      >>> x = jnp.arange(3.0)[None]
      >>> apply(params, state, x)[0] - params["b"]  # x + (x @ 0 + b)
      Array([[0., 1., 2.]], dtype=float32)
    """
    inner = as_layer(layer, "Residual")

    def init(rng, input_shape):
        out_shape, params, state = inner.init(rng, input_shape)
        if tuple(out_shape) != tuple(input_shape):
            raise ValueError(
                f"Residual: the wrapped layer must keep the shape, but maps "
                f"{tuple(input_shape)} to {tuple(out_shape)}. Add a projection "
                f"(e.g. serial(FanOut(2), parallel(f, Dense(...)), FanInSum))."
            )
        return out_shape, params, state

    def apply(params, state, inputs, *, rng=None, train=False):
        inputs = _gradient_materialized(inputs)
        out, state = inner.apply(params, state, inputs, rng=rng, train=train)
        return inputs + out, state

    return named(f"Residual({inner.name})", init, apply)


@jax.custom_jvp
def _gradient_materialized(x):
    """``x``, unchanged; in the backward pass its gradient is computed once, in memory.

    The gradient reaching ``x`` (the sum over its two uses, the branch and the skip) is
    an element-wise sum that feeds both the branch's backward and the previous block's
    sum. XLA:CPU fuses such a sum into each consumer, recomputing it, so each block's
    backward re-adds every later block's contributions: work quadratic in depth (in
    nanoGPT's 4-block CPU GPT one fusion read 84 arrays). An ``optimization_barrier`` on
    the tangent (whose transpose is a barrier on the gradient) keeps the sum one array,
    as PyTorch's autograd has it; the forward pass and the values are untouched (the
    example's losses are the same bits). On jaxlib 0.12 that step is 6-9% faster
    (``python -m benchmarks.residual_probe``, 2026-11-29); jaxlib 0.10's XLA drops the
    barrier before fusing, so there the program is the one it was. A ``custom_jvp``
    rather than a ``custom_vjp`` so that forward mode (``jax.jvp``, ``jax.hessian``)
    still works through it.
    """
    return x


@_gradient_materialized.defjvp
def _gradient_materialized_jvp(primals, tangents):
    return primals[0], jax.lax.optimization_barrier(tangents[0])


def Remat(layer: Layer, *, policy: Optional[Callable[..., bool]] = None, prevent_cse: bool = True) -> Layer:
    """The same layer, its intermediates recomputed in the backward pass (``jax.checkpoint``).

    Same init, same outputs and gradients; the backward pass re-runs ``apply`` instead
    of keeping its intermediates, trading compute for memory (activation
    rematerialisation, torch's ``torch.utils.checkpoint``). ``policy`` is a
    ``jax.checkpoint_policies`` entry naming what may still be saved (e.g.
    ``dots_with_no_batch_dims_saveable``); ``prevent_cse`` as ``jax.checkpoint``.
    ``train`` is a Python bool and stays static; ``rng`` (or None) is passed through.

    Args:
      layer: the layer whose intermediates are recomputed.
      policy: a ``jax.checkpoint_policies`` entry naming what may still be saved, or
        None (``jax.checkpoint``'s default: every intermediate is recomputed).
      prevent_cse: passed to ``jax.checkpoint``, as there.

    Returns:
      The composed :class:`~funcnet.core.Layer` with ``layer``'s ``init`` (the same params and
        state, not wrapped) whose ``apply`` runs ``layer``'s under ``jax.checkpoint``.

    Raises:
      TypeError: ``layer`` is not a layer, or ``policy`` is neither None nor callable.
      ArgumentError: ``prevent_cse`` is not a bool.

    Examples:
      >>> from funcnet.layers import Dense, Tanh
      >>> init, apply = Remat(serial(Dense(4), Tanh))
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3))
      >>> loss = lambda p: apply(p, state, jnp.ones((2, 3)))[0].sum()
      >>> jax.jit(jax.grad(loss))(params)[0]["W"].shape
      (3, 4)
    """
    inner = as_layer(layer, "Remat")
    if policy is not None and not callable(policy):
        raise TypeError(
            f"Remat: policy must be one of jax.checkpoint_policies (a callable) or None, got {type(policy).__name__}."
        )
    prevent_cse = checks.flag("Remat", "prevent_cse", prevent_cse)

    def apply(params, state, inputs, *, rng=None, train=False):
        def run(params, state, inputs, rng):
            return inner.apply(params, state, inputs, rng=rng, train=train)

        return jax.checkpoint(run, policy=policy, prevent_cse=prevent_cse)(params, state, inputs, rng)

    return named(f"Remat({inner.name})", inner.init, apply)


def Scan(layer: Layer, n: int, *, unroll: int = 1) -> Layer:
    """``n`` copies of a shape-keeping layer in sequence, run by ``lax.scan``.

    The same network as ``serial(*[layer] * n)`` -- the same init keys, the same
    params (stacked on a new leading axis of size ``n``: ``stack_params`` of
    serial's), the same per-copy keys at apply, so even dropout masks agree -- but
    one compiled body instead of ``n``: compile time stays flat as ``n`` grows.
    State (if the layer keeps any) is stacked the same way, threaded and returned
    stacked. ``unroll`` is passed to ``lax.scan`` (copies per loop iteration).
    ``state=()`` is accepted for stateless layers; each copy then gets ``()``.
    Wrap the layer in :func:`Remat` to keep only the carry of each copy for the
    backward pass. A layer that changes its input's dtype (bfloat16 inputs into float32
    params give float32, as in ``serial``) has its first copy run before the scan, so
    the result is serial's.

    Args:
      layer: the layer copied; its output shape must be its input shape.
      n: the number of copies, a positive int.
      unroll: copies per loop iteration, passed to ``lax.scan``.

    Returns:
      The composed :class:`~funcnet.core.Layer` whose params (and state) are the ``n`` copies'
        trees stacked on a new leading axis of size ``n`` (:func:`stack_params` of what
        ``serial(*[layer] * n)`` has); ``apply`` returns the last copy's output and the
        new state, stacked the same way.

    Raises:
      TypeError: ``layer`` is not a layer.
      ArgumentError: ``n`` or ``unroll`` is not a positive int.
      ValueError: from ``init``, ``layer`` changes the shape of its input; from
        ``apply``, it changes its input's dtype at every copy, not only the first.
      MismatchError: from ``apply``, params or state whose leaves do not have ``n``
        copies stacked on axis 0.

    Examples:
      >>> from funcnet.layers import Dense
      >>> init, apply = Scan(Dense(3), 4)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 3))
      >>> out_shape, params["W"].shape  # 4 copies stacked on axis 0
      ((-1, 3), (4, 3, 3))
      >>> apply(params, state, jnp.ones((2, 3)))[0].shape
      (2, 3)
    """
    inner = as_layer(layer, "Scan")
    n = checks.positive_int("Scan", "n", n)
    unroll = checks.positive_int("Scan", "unroll", unroll)
    name = f"Scan({inner.name}, {n})"

    def init(rng, input_shape):
        outs = [inner.init(k, input_shape) for k in split_rng(rng, n)]
        out_shape = outs[0][0]
        if _shape_tree(out_shape) != _shape_tree(input_shape):
            raise ValueError(
                f"{name}: the layer must keep the shape (each copy's output is the "
                f"next copy's input), but maps {_shape_tree(input_shape)} to "
                f"{_shape_tree(out_shape)}. Scan only the shape-keeping part (e.g. "
                f"serial(Dense(d), Scan(block, n)))."
            )
        return out_shape, stack_params([o[1] for o in outs]), stack_params([o[2] for o in outs])

    def apply(params, state, inputs, *, rng=None, train=False):
        for what, tree in (("params", params), ("state", state)):
            if not all(jnp.ndim(x) > 0 and jnp.shape(x)[0] == n for x in jax.tree.leaves(tree)):
                hint = (
                    f"Use the {what} this Scan's init returned; those of "
                    f"serial(*[layer] * {n}) convert with stack_params."
                )
                raise MismatchError(
                    name,
                    what,
                    name,
                    f"{n} copies stacked on axis 0",
                    describe_tree(tree),
                    hint,
                    f"{name}: expected {what} of {n} copies stacked on axis 0, "
                    f"got shapes {describe_tree(tree)}. {hint}",
                )
        keys = None if rng is None else jax.random.split(rng, n)  # = split_rng, as serial's

        def body(x, per_copy):
            p, s, k = per_copy
            return inner.apply(p, s, x, rng=k, train=train)

        return _scan_copies(name, body, inputs, (params, state, keys), n, unroll)

    return named(name, init, apply)


def _avals(tree):
    """The structure, shapes and dtypes of ``tree``: what ``lax.scan`` needs of a carry."""
    return jax.tree.structure(tree), [(tuple(jnp.shape(x)), jnp.result_type(x)) for x in jax.tree.leaves(tree)]


def _scan_copies(name, body, inputs, per_copy, n, unroll):
    """``body`` over the ``n`` copies in ``per_copy``, threading ``inputs``, as serial would.

    A copy may change the input's dtype (bfloat16 inputs into float32 params promote to
    float32), which a scan's carry cannot: then the first copy runs on its own, as
    serial's first layer, and the other ``n - 1`` are scanned over its output (two traces
    of the layer instead of one, only then)."""
    copy = lambda i: lambda c: jax.tree.map(lambda a: a[i], c)
    # abstract (eval_shape): nothing is sliced or run for the check itself
    output = lambda x: jax.eval_shape(lambda x, c: body(x, copy(0)(c))[0], x, per_copy)
    # length: a layer without params or state (Dropout) gives scan no xs to count.
    if _avals(output(inputs)) == _avals(inputs):
        return jax.lax.scan(body, inputs, per_copy, length=n, unroll=unroll)
    y, s0 = body(inputs, copy(0)(per_copy))
    if n > 1:
        rest = copy(slice(1, None))(per_copy)
        again = output(y)
        if _avals(again) != _avals(y):
            raise ValueError(
                f"{name}: the layer changes its input's dtype (or shape) at "
                f"every copy ({describe_tree(inputs)} -> {describe_tree(y)} -> "
                f"{describe_tree(again)}), so the copies cannot share one "
                f"compiled body. Cast the input to the params' dtype first, or "
                f"use serial(*[layer] * {n})."
            )
        y, s_rest = jax.lax.scan(body, y, rest, length=n - 1, unroll=unroll)
        # the state in the scanned copies' dtypes, which later calls give it
        return y, jax.tree.map(lambda a, b: jnp.concatenate([a[None].astype(b.dtype), b]), s0, s_rest)
    return y, jax.tree.map(lambda a: a[None], s0)


def stack_params(trees: Sequence[PyTree]) -> PyTree:
    """One tree from a sequence of same-structured trees, each leaf stacked on a new axis 0.

    Turns the params (or state) of ``serial(*[layer] * n)`` into those of
    ``Scan(layer, n)``: ``stack_params(serial_params)``. The inverse of
    :func:`unstack_params`.

    Args:
      trees: a non-empty sequence of pytrees of one structure (params or state, one per
        copy).

    Returns:
      A pytree of that structure whose every leaf is the trees' leaves stacked on a new
        axis 0 (of size ``len(trees)``).

    Raises:
      ValueError: ``trees`` is empty, or a tree's structure or a leaf's shape differs
        from the first's (the message names the first such path and both shapes).

    Examples:
      >>> stacked = stack_params([{"W": jnp.zeros((3, 2))}, {"W": jnp.ones((3, 2))}])
      >>> stacked["W"].shape
      (2, 3, 2)
    """
    trees = list(trees)
    if not trees:
        raise ValueError("stack_params: expected a non-empty sequence of trees (one per copy), got none.")
    structure = jax.tree.structure(trees[0])
    for i, tree in enumerate(trees):
        if jax.tree.structure(tree) != structure:
            raise ValueError(
                f"stack_params: every tree must have the structure of the first, "
                f"but tree {i} is {describe_tree(tree)} and tree 0 is "
                f"{describe_tree(trees[0])}."
            )
        _check_same_shapes(trees[0], tree, i)
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _check_same_shapes(first, tree, i):
    """Tree ``i``'s leaves have tree 0's shapes (stacking needs them equal)."""
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(first)[0], jax.tree.leaves(tree)):
        if jnp.shape(a) != jnp.shape(b):
            where = jax.tree_util.keystr(tuple(path), simple=True, separator="/") or "<root>"
            raise ValueError(
                f"stack_params: every tree's leaves must have the shapes of the "
                f"first's, but {where!r} has shape {tuple(jnp.shape(b))} in tree "
                f"{i} and {tuple(jnp.shape(a))} in tree 0. Only copies of one "
                f"layer of one size stack (Scan's copies): build them with the "
                f"same sizes and input shape."
            )


def unstack_params(tree: PyTree, n: int) -> tuple[PyTree, ...]:
    """The ``n`` trees stacked on axis 0 of every leaf of ``tree``, as a tuple.

    Turns the params (or state) of ``Scan(layer, n)`` into those of
    ``serial(*[layer] * n)``. The inverse of :func:`stack_params`.

    Args:
      tree: a pytree whose every leaf holds ``n`` copies stacked on axis 0.
      n: the number of copies, a positive int.

    Returns:
      A tuple of ``n`` pytrees of ``tree``'s structure, the i-th holding copy ``i`` of
        every leaf.

    Raises:
      ArgumentError: ``n`` is not a positive int.
      ValueError: a leaf that is a scalar or whose axis 0 is not of size ``n``.

    Examples:
      >>> trees = unstack_params({"W": jnp.zeros((4, 3, 2))}, 4)
      >>> len(trees), trees[0]["W"].shape
      (4, (3, 2))
    """
    n = checks.positive_int("unstack_params", "n", n)
    if not all(jnp.ndim(x) > 0 and jnp.shape(x)[0] == n for x in jax.tree.leaves(tree)):
        raise ValueError(
            f"unstack_params: expected every leaf to hold {n} copies stacked on "
            f"axis 0, got shapes {describe_tree(tree)}."
        )
    return tuple(jax.tree.map(lambda x: x[i], tree) for i in range(n))


def _shape_tree(shape):
    """A shape (or a tuple of shapes) with lists made tuples, for comparing and showing."""
    if isinstance(shape, (tuple, list)):
        return tuple(_shape_tree(s) for s in shape)
    return shape


def _check_tuple(layer, value, n, what):
    if not isinstance(value, (tuple, list)) or (
        value and not isinstance(value[0], (tuple, list)) and what == "input_shape"
    ):
        raise TypeError(
            f"{layer}: expected a tuple of {'shapes' if what == 'input_shape' else 'arrays'}"
            f" (one per branch), got {value!r}. Put FanOut(n) in front."
        )
    if n is not None and len(value) != n:
        raise ValueError(f"{layer}: expected {n} branches, got {len(value)}.")


def _check_children(layer, params, state, n):
    """``n`` is the number of children (positional) or their names (named serial)."""
    if not isinstance(n, int):
        return _check_named_children(layer, params, state, n)
    if not isinstance(params, (tuple, list)) or len(params) != n:
        length = len(params) if hasattr(params, "__len__") else "?"
        raise MismatchError(
            layer,
            "params",
            layer,
            f"a tuple of {n} entries, one per layer",
            describe_tree(params),
            "Use the params returned by this layer's init.",
            f"{layer}: params do not match this {layer} of {n} layers (got "
            f"{type(params).__name__} of length {length}). Use the params returned by this "
            f"layer's init.",
        )
    if not isinstance(state, (tuple, list)) or len(state) != n:
        raise MismatchError(
            layer,
            "state",
            layer,
            f"a tuple of {n} entries, one per layer",
            describe_tree(state),
            "Use the state returned by this layer's init (or the last apply).",
            f"{layer}: state does not match this {layer} of {n} layers. Use the state returned "
            f"by this layer's init (or the last apply).",
        )


def _check_named_children(layer, params, state, names):
    for what, tree in (("params", params), ("state", state)):
        if not isinstance(tree, dict) or set(tree) != set(names):
            got = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
            raise MismatchError(
                layer,
                what,
                layer,
                f"a dict of the named layers {list(names)}",
                str(got),
                f"Use the {what} returned by this layer's init.",
                f"{layer}: {what} do not match this {layer} of the named layers {list(names)} "
                f"(got {got}). Use the {what} returned by this layer's init.",
            )


def _mismatch(layer, key, child, params, state, inputs, check_state=True):
    """The :class:`MismatchError` that explains why ``child`` failed on these params or
    state, or None when they have the structure its init gives (the failure is the
    layer's own). Called only after a failure, so the happy path costs nothing."""
    try:
        shapes = jax.tree.map(lambda x: tuple(jnp.shape(x)), inputs)
        _, want_params, want_state = jax.eval_shape(lambda k: child.init(k, shapes), jax.random.key(0))
    except Exception:  # the init cannot tell us what it expects: keep the original error
        return None

    def fits(given, want):
        try:
            return all(
                jnp.shape(g) == w.shape for g, w in zip(jax.tree.leaves(given), jax.tree.leaves(want), strict=True)
            ) and jax.tree.structure(given) == jax.tree.structure(want)
        except ValueError:
            return False

    if check_state and fits(params, want_state) and fits(state, want_params) and not fits(params, want_params):
        err = MismatchError(
            layer,
            "params",
            child.name,
            describe_tree(want_params),
            describe_tree(params),
            "The params and state look swapped: call apply(params, state, x), params first.",
        )
    elif not fits(params, want_params):
        err = MismatchError(
            layer,
            "params",
            child.name,
            describe_tree(want_params),
            describe_tree(params),
            "Pass the params this network's init "
            "returned: params of another network do not fit, even one with "
            "as many layers.",
        )
    elif check_state and not fits(state, want_state):
        err = MismatchError(
            layer,
            "state",
            child.name,
            describe_tree(want_state),
            describe_tree(state),
            "Pass the state this network's init (or its last apply) returned.",
        )
    else:
        return None
    return err.placed_under(layer, key)


# --------------------------------------------------------------------------- #
# state=() for networks of stateless layers
# --------------------------------------------------------------------------- #


def _expand_empty_state(state, children):
    """The state a combinator hands its children when it was given ``state=()``.

    ``children`` is their number (a tuple of that many ``()``) or their names (a
    dict of ``()``). Any other state is returned as it is. This is what lets
    ``net.apply(params, (), x)`` run a network whose layers are all stateless,
    however nested: each combinator expands ``()`` one level down. A stateful
    layer given ``()`` fails with an error naming it.
    """
    if not _is_empty_tuple(state):
        return state
    if isinstance(children, int):
        return ((),) * children
    return {name: () for name in children}


def _is_empty_tuple(state) -> bool:
    return isinstance(state, tuple) and len(state) == 0


def _keep_empty(given_empty, new_state):
    # Given (), give () back, so a loop that feeds the state back in keeps one
    # structure (no retrace) as long as the children had nothing to return.
    if given_empty and not jax.tree.leaves(new_state):
        return ()
    return new_state


_EMPTY_STATE_NOTE = "funcnet: applied with state=()"


def _apply_child(layer, key, child, params, state, inputs, rng, train, given_empty):
    """Runs one child; when it got an expanded ``state=()`` and fails, says which child."""
    try:
        return child.apply(params, state, inputs, rng=rng, train=train)
    except MismatchError as e:  # from a combinator inside: say where it sits in this one
        raise e.placed_under(layer, key)
    except (TypeError, KeyError, IndexError, AttributeError) as e:  # what indexing () raises
        notes = getattr(e, "__notes__", ())
        if given_empty and not any(n.startswith(_EMPTY_STATE_NOTE) for n in notes):
            # Only the innermost combinator adds the note: it knows the failing layer.
            e.add_note(
                f"{_EMPTY_STATE_NOTE}, which {layer} passed on as () to its layer "
                f"{key!r} ({child.name}). If {child.name} keeps state (e.g. BatchNorm "
                f"statistics), pass the state returned by init instead of ()."
            )
        # Params of another network, or params and state swapped, fail here as a
        # KeyError or "tuple indices must be integers": say which layer and what fits.
        # (An expanded state=() is the note's business: only params are compared then.)
        mismatch = _mismatch(layer, key, child, params, state, inputs, not given_empty)
        if mismatch is None:
            raise
        raise mismatch from e


def _pack(names, values):
    return dict(zip(names, values)) if names else tuple(values)
