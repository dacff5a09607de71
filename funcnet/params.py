"""Parameters by name: a ``path -> array`` view, boolean masks, and freezing.

funcnet's params are plain pytrees that mirror the network: tuples for positional
``serial``/``parallel``, dicts for named ``serial(encoder=..., decoder=...)`` and
for the several models of a :class:`funcnet.TrainState`, and each layer's own
dict (``W``/``b``, ``scale``/``bias``, ``E``, ...). A *path* joins the keys from the
root to a leaf with ``/``: ``"encoder/0/W"`` is the kernel of the first layer of
the sub-network named ``encoder`` (:func:`jax.tree_util.keystr` with
``simple=True``).

Masks are pytrees of bools with the structure of the params, what
``optax.masked`` and ``optax.multi_transform`` take. Every mask function has the
signature ``mask(params) -> bool pytree``, so it can be handed to optax as the
callable form as well (``optax.masked(tx, kernel_mask)``); :func:`subtree_mask`
and :func:`mask_where` take their extra argument after ``params``.

``freeze`` is the funcnet answer to "frozen means frozen". In PyTorch a parameter
with ``requires_grad=False`` has no gradient and ``optimizer.step()`` skips it:
no weight decay, no momentum. In optax, ``jax.lax.stop_gradient`` only zeroes the
gradient: ``add_decayed_weights`` still adds ``weight_decay * p``, and momentum
still carries earlier steps, so the "frozen" parameter moves. :func:`freeze`
routes the frozen leaves to ``optax.set_to_zero()`` with
``optax.multi_transform``, so the optimizer never sees them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import jax
import numpy as np
import optax

from funcnet import _checks as checks
from funcnet.core import PyTree

__all__ = ["paths", "path_str", "mask_where", "kernel_mask", "subtree_mask", "freeze", "KERNEL_NAMES"]

KERNEL_NAMES = frozenset({"W", "E"})
"""Leaf keys that hold kernels: ``W`` (Dense, Conv, ConvTranspose) and ``E`` (Embedding).
Keys starting with ``W_`` (the RNN/LSTM/GRU ``W_ih``/``W_hh``) count too."""


def path_str(key_path: Sequence[Any]) -> str:
    """A key path from ``jax.tree_util.tree_flatten_with_path`` as ``"a/0/W"``.

    Args:
      key_path: a sequence of jax key entries (``DictKey``, ``SequenceKey``, ...).

    Returns:
      The keys joined by ``/``.

    Examples:
      >>> (key_path, leaf), = jax.tree_util.tree_flatten_with_path({"a": [{"W": 1}]})[0]
      >>> path_str(key_path)
      'a/0/W'
    """
    return jax.tree_util.keystr(tuple(key_path), simple=True, separator="/")


def paths(tree: PyTree) -> Dict[str, Any]:
    """``{path: leaf}`` for every leaf of ``tree``, in the pytree's leaf order.

    E.g. for ``serial(encoder=serial(Dense(4), Relu), decoder=Dense(2))``:
    ``{"decoder/W": ..., "decoder/b": ..., "encoder/0/W": ..., "encoder/0/b": ...}``
    (JAX orders dict keys). The arrays are the tree's own, not copies.

    Args:
      tree: a params (or state, or grads) pytree.

    Returns:
      A dict from each leaf's path (:func:`path_str`) to the leaf.

    Examples:
      >>> from funcnet.combinators import serial
      >>> from funcnet.layers import Dense, Relu
      >>> net = serial(encoder=serial(Dense(4), Relu), decoder=Dense(2))
      >>> _, params, _ = net.init(jax.random.key(0), (-1, 3))
      >>> {path: leaf.shape for path, leaf in paths(params).items()}
      {'decoder/W': (4, 2), 'decoder/b': (2,), 'encoder/0/W': (3, 4), 'encoder/0/b': (4,)}
    """
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {path_str(path): leaf for path, leaf in leaves}


def mask_where(params: PyTree, predicate: Callable[[str, Any], bool]) -> PyTree:
    """The bool pytree ``predicate(path, leaf)`` for every leaf of ``params``.

    E.g. ``mask_where(params, lambda path, x: path.endswith("/b"))`` selects biases.

    Args:
      params: a params pytree.
      predicate: ``predicate(path, leaf) -> bool``, ``path`` as :func:`paths` gives it.

    Returns:
      A pytree of Python bools with ``params``' structure.

    Examples:
      >>> params = {"W": jnp.ones((3, 2)), "b": jnp.zeros(2)}
      >>> mask_where(params, lambda path, x: x.ndim == 1)
      {'W': False, 'b': True}
    """
    return jax.tree_util.tree_map_with_path(lambda path, leaf: bool(predicate(path_str(path), leaf)), params)


def kernel_mask(params: PyTree) -> PyTree:
    """True for kernels, False for everything else (biases, norm scales and shifts).

    A leaf is a kernel when its own key is ``W`` (Dense, Conv, ConvTranspose), ``E``
    (Embedding) or starts with ``W_`` (RNN/LSTM/GRU ``W_ih``, ``W_hh``): the usual
    "weight decay on weights only" split, ``optax.add_decayed_weights(wd,
    mask=kernel_mask)``. A user layer opts in by naming its kernel ``W``.

    Args:
      params: a params pytree.

    Returns:
      A pytree of Python bools with ``params``' structure.

    Examples:
      >>> params = ({"W": jnp.ones((3, 2)), "b": jnp.zeros(2)}, {"E": jnp.ones((5, 2))})
      >>> kernel_mask(params)
      ({'W': True, 'b': False}, {'E': True})
      >>> opt = optax.adamw(1e-3, weight_decay=0.01, mask=kernel_mask)
    """
    return mask_where(params, lambda path, leaf: _is_kernel(path.rsplit("/", 1)[-1]))


def _is_kernel(key: str) -> bool:
    return key in KERNEL_NAMES or key.startswith("W_")


def subtree_mask(params: PyTree, *prefixes: str) -> PyTree:
    """True for the leaves under any of ``prefixes`` (paths such as ``"encoder"``, ``"gen/0"``).

    A prefix matches whole path components: ``"enc"`` does not select ``"encoder/W"``.

    Args:
      params: a params pytree.
      *prefixes: paths of sub-trees, as :func:`paths` spells them.

    Returns:
      A pytree of Python bools with ``params``' structure.

    Raises:
      ValueError: a prefix that selects no leaf (a typo would otherwise freeze or
        decay nothing, silently); the message lists the paths there are.
      TypeError: no prefix was given.

    Examples:
      >>> params = {"encoder": {"W": jnp.ones((3, 2))}, "decoder": {"W": jnp.ones((2, 3))}}
      >>> subtree_mask(params, "encoder")
      {'decoder': {'W': False}, 'encoder': {'W': True}}
      >>> subtree_mask(params, "enc")
      Traceback (most recent call last):
      ValueError: subtree_mask: no parameter path starts with 'enc'. The params have the
      paths: decoder/W, encoder/W.
    """
    if not prefixes:
        raise TypeError("subtree_mask: give at least one path prefix, e.g. subtree_mask(params, 'encoder').")
    all_paths = list(paths(params))
    for prefix in prefixes:
        if not any(_under(path, prefix) for path in all_paths):
            shown = ", ".join(all_paths[:12]) + (", ..." if len(all_paths) > 12 else "")
            raise ValueError(
                f"subtree_mask: no parameter path starts with {prefix!r}. The params have the paths: {shown}."
            )
    return mask_where(params, lambda path, leaf: any(_under(path, p) for p in prefixes))


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.strip("/")
    return path == prefix or path.startswith(prefix + "/")


def freeze(
    optimizer: optax.GradientTransformation, mask: PyTree | Callable[[PyTree], PyTree], *, allow_empty: bool = False
) -> optax.GradientTransformation:
    """``optimizer`` for the leaves where ``mask`` is False; zero updates where it is True.

    ``mask`` is a bool pytree with the params' structure, or a function ``params ->
    mask`` (e.g. ``lambda p: subtree_mask(p, "encoder")``). Built with
    ``optax.multi_transform``: the frozen leaves get ``optax.set_to_zero()`` and are
    masked out of ``optimizer``, so its weight decay and momentum cannot move them
    and it keeps no state for them. That is PyTorch's ``requires_grad=False``
    (``optimizer.step()`` skips parameters without gradients); a
    ``stop_gradient`` alone is not, because optax's weight decay and momentum
    still update a parameter whose gradient is zero.

    Args:
      optimizer: the optax transformation for the trained leaves.
      mask: a bool pytree (True: frozen) or a function ``params -> mask``.
      allow_empty: accept a mask that freezes nothing. By default an all-False
        mask is refused when the optimizer is initialized: it is almost always a
        typo in a path prefix (the same typo :func:`subtree_mask` refuses).

    Returns:
      An ``optax.GradientTransformation``.

    Examples:
      >>> params = {"encoder": {"W": jnp.ones(2)}, "decoder": {"W": jnp.ones(2)}}
      >>> opt = freeze(optax.sgd(0.5), lambda p: subtree_mask(p, "encoder"))
      >>> grads = jax.tree.map(jnp.ones_like, params)
      >>> updates, _ = opt.update(grads, opt.init(params), params)
      >>> updates["encoder"]["W"].tolist(), updates["decoder"]["W"].tolist()
      ([0.0, 0.0], [-0.5, -0.5])
    """
    allow_empty = checks.flag("freeze", "allow_empty", allow_empty)

    def labels(params):
        tree = mask(params) if callable(mask) else mask
        if jax.tree.structure(params) != jax.tree.structure(tree):
            raise ValueError(
                f"freeze: mask must have the params' structure, one bool per "
                f"parameter array; got {jax.tree.structure(tree)} for params "
                f"{jax.tree.structure(params)}. Build it with subtree_mask(params, "
                f"'prefix') or mask_where(params, fn)."
            )
        flags = []
        for path, frozen in jax.tree_util.tree_flatten_with_path(tree)[0]:
            value = checks.concrete(frozen)
            if value is None or value.ndim != 0 or value.dtype != np.bool_:
                raise TypeError(
                    f"freeze: mask{jax.tree_util.keystr(tuple(path))} must be one "
                    f"bool per parameter array (True: frozen), got "
                    f"{checks.got(frozen)[:80]}; whole arrays are frozen or not, "
                    f"element-wise masks are not supported."
                )
            flags.append(bool(value))
        if flags and not any(flags) and not allow_empty:
            raise ValueError(
                "freeze: the mask selects no parameter, so nothing would be "
                "frozen (a typo in a path prefix?). Check it with "
                "funcnet.params.paths(params); pass allow_empty=True if freezing "
                "nothing is intended."
            )
        return jax.tree.map(lambda frozen: "frozen" if frozen else "trained", tree)

    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()}, labels)
