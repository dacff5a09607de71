"""Data pipeline: reproducible minibatches and device prefetching.

``batches`` slices aligned numpy arrays into minibatches; with ``shuffle`` the
order is a pure function of ``(rng, epoch)``, so a resumed run can rebuild the
order of any epoch and skip the batches it already consumed::

    for x, y in batches((images, labels), 128, shuffle=True, rng=seed, epoch=e, skip=k):
        ...

``prefetch_to_device`` keeps a few batches already on their way to the device
(``jax.device_put`` is asynchronous), so the copy overlaps with compute.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Callable, Iterable, Iterator, Optional

import jax
import numpy as np

from funcnet import _checks as checks

__all__ = ["batches", "epoch_order", "num_batches", "prefetch_to_device"]

# --------------------------------------------------------------------------- #
# Minibatches
# --------------------------------------------------------------------------- #

def _is_jax_key(rng) -> bool:
    if not isinstance(rng, jax.Array):
        return False
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return True
    return rng.dtype == np.uint32 and rng.shape == (2,)


def epoch_order(n: int, rng, epoch: Optional[int] = None) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on ``(rng, epoch)``.

    Args:
      n: number of examples.
      rng: an int seed, a jax PRNG key (typed ``jax.random.key`` or legacy
        ``uint32[2]``), or a ``numpy.random.Generator``.
      epoch: folded into the seed (``default_rng([seed, epoch])`` for ints,
        ``jax.random.fold_in(key, epoch)`` for keys), so each epoch has its own
        order and any epoch's order can be recomputed after a restart. A
        Generator has no reproducible per-epoch derivation, so it takes no
        epoch and its draws advance its state.

    Returns:
      int64 indices, a permutation of ``range(n)``.
    """
    if isinstance(rng, bool):
        raise TypeError("epoch_order: rng must be an int seed, a jax PRNG key or a "
                        f"numpy Generator, got {rng!r}.")
    if checks.is_int(rng):
        seed = int(rng) if epoch is None else [int(rng), int(epoch)]
        return np.random.default_rng(seed).permutation(n)
    if _is_jax_key(rng):
        key = rng if epoch is None else jax.random.fold_in(rng, int(epoch))
        return np.asarray(jax.random.permutation(key, n), dtype=np.int64)
    if isinstance(rng, np.random.Generator):
        if epoch is not None:
            raise TypeError("epoch_order: epoch= needs an int seed or a jax PRNG key; a numpy "
                            "Generator's order depends on how much it has been used.")
        return rng.permutation(n)
    raise TypeError("epoch_order: rng must be an int seed, a jax PRNG key or a numpy "
                    f"Generator, got {type(rng).__name__}.")


def num_batches(n: int, batch_size: int, drop_remainder: bool = True) -> int:
    """How many batches :func:`batches` yields for ``n`` examples."""
    return n // batch_size if drop_remainder else -(-n // batch_size)


def batches(arrays, batch_size: int, *, shuffle: bool = False, rng=None,
            drop_remainder: bool = True, epoch: Optional[int] = None,
            skip: int = 0) -> Iterator:
    """Minibatches of aligned arrays (one pass, i.e. one epoch).

    Args:
      arrays: a tuple/list or dict of arrays sharing their leading size, or a
        single array. Batches come back in the same container type.
      batch_size: examples per batch.
      shuffle: visit examples in the order ``epoch_order(n, rng, epoch)``;
        otherwise in order (batches are then views into ``arrays``).
      rng: the seed of the shuffle (see :func:`epoch_order`); required with
        ``shuffle``, ignored without it.
      drop_remainder: drop the last, smaller batch (default); with ``False``
        it is yielded.
      epoch: the epoch number folded into ``rng`` (see :func:`epoch_order`).
      skip: skip this many leading batches, e.g. those consumed before a
        restart; the rest are exactly what the uninterrupted run would see.

    Returns:
      An iterator over batches. Arguments are checked when ``batches`` is
      called, not at the first ``next``.
    """
    if isinstance(arrays, dict):
        keys, values, kind = list(arrays), list(arrays.values()), "dict"
    elif isinstance(arrays, (tuple, list)):
        keys, values, kind = None, list(arrays), "tuple"
    else:
        keys, values, kind = None, [arrays], "single"
    if not values:
        raise ValueError("batches: arrays is empty; pass a tuple or dict of arrays.")
    values = [np.asarray(v) for v in values]
    labels = keys if keys is not None else list(range(len(values)))
    if any(v.ndim == 0 for v in values):
        raise ValueError("batches: every array needs a leading (example) axis; got a scalar at "
                         f"{[l for l, v in zip(labels, values) if v.ndim == 0]}.")
    sizes = {l: v.shape[0] for l, v in zip(labels, values)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batches: all arrays need the same leading size, got {sizes}.")
    n = values[0].shape[0]
    batch_size = checks.positive_int("batches", "batch_size", batch_size)
    if drop_remainder and 0 < n < batch_size:
        raise ValueError(f"batches: batch_size={batch_size} is larger than the {n} examples, so "
                         "drop_remainder=True would yield nothing; use a smaller batch_size or "
                         "drop_remainder=False.")
    if skip < 0:
        raise ValueError(f"batches: skip must be >= 0, got {skip}.")
    if shuffle:
        if rng is None:
            raise ValueError("batches: shuffle=True needs rng= (an int seed or a jax PRNG key) "
                             "so the order is reproducible.")
        order = epoch_order(n, rng, epoch)
    else:
        order = None
    total = num_batches(n, batch_size, drop_remainder)

    def pack(batch):
        if kind == "dict":
            return dict(zip(keys, batch))
        if kind == "single":
            return batch[0]
        return tuple(batch)

    def generate():
        for i in range(skip, total):
            if order is None:
                sl = slice(i * batch_size, (i + 1) * batch_size)
                yield pack([v[sl] for v in values])
            else:
                idx = order[i * batch_size:(i + 1) * batch_size]
                yield pack([v[idx] for v in values])

    return generate()


# --------------------------------------------------------------------------- #
# Prefetching
# --------------------------------------------------------------------------- #

def _placement(device):
    if device is None or isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, (list, tuple)) and device and all(isinstance(d, jax.Device) for d in device):
        mesh = jax.sharding.Mesh(np.array(device), ("devices",))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
    raise TypeError("prefetch_to_device: device must be None, a jax.Device, a "
                    f"jax.sharding.Sharding or a list of devices, got {device!r}.")


def prefetch_to_device(iterator: Iterable, size: int = 2, device=None,
                       transform: Optional[Callable[[Any], Any]] = None) -> Iterator:
    """Yields the items of ``iterator`` already on device, ``size`` ahead.

    Each item (a pytree of host arrays) goes through ``transform`` (if given)
    and ``jax.device_put``; because ``device_put`` is asynchronous, keeping
    ``size`` items in flight overlaps the host-to-device copy of the next
    batches with the computation on the current one. Order is preserved.

    Args:
      iterator: any iterable of pytrees of arrays.
      size: how many items to keep in flight (>= 1).
      device: where to put them: ``None`` (default device), a ``jax.Device``,
        any ``jax.sharding.Sharding``, or a list of devices, which splits the
        leading axis across them (the layout ``jax.pmap`` consumes).
      transform: applied on the host before the transfer, e.g. reshaping each
        leaf to ``(n_devices, per_device_batch, ...)`` for pmap.
    """
    size = checks.positive_int("prefetch_to_device", "size", size)
    target = _placement(device)
    it = iter(iterator)

    def put(item):
        if transform is not None:
            item = transform(item)
        return jax.device_put(item, target)  # one call for the whole pytree

    def generate():
        queue = collections.deque(put(item) for item in itertools.islice(it, size))
        while queue:
            ready = queue.popleft()
            # Refill before yielding, so `size` transfers run while the consumer
            # computes on `ready`.
            for item in itertools.islice(it, 1):
                queue.append(put(item))
            yield ready

    return generate()
