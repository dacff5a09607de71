"""Data pipeline: reproducible minibatches and device prefetching.

``batches`` slices aligned numpy arrays into minibatches; with ``shuffle`` the
order is a pure function of ``(rng, epoch)``, so a resumed run can rebuild the
order of any epoch and skip the batches it already consumed:

```
for x, y in batches((images, labels), 128, shuffle=True, rng=seed, epoch=e, skip=k):
    ...
```

``prefetch_to_device`` keeps a few batches already on their way to the device
(``jax.device_put`` is asynchronous), so the copy overlaps with compute.
``background`` assembles the batches (and starts their copies) in a thread, so the
host's gathering overlaps with the steps too; ``funcnet.fit`` uses it for the host
pipeline.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet._mesh import data_axis

__all__ = [
    "batches",
    "Batches",
    "epoch_order",
    "num_batches",
    "prefetch_to_device",
    "background",
    "Background",
    "DeviceData",
]

# --------------------------------------------------------------------------- #
# Minibatches
# --------------------------------------------------------------------------- #


def _is_jax_key(rng) -> bool:
    if not isinstance(rng, jax.Array):
        return False
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return True
    return rng.dtype == np.uint32 and rng.shape == (2,)


def epoch_order(n: int, rng: int | jax.Array | np.random.Generator, epoch: Optional[int] = None) -> np.ndarray:
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

    Raises:
      TypeError: ``rng`` is not an int seed, a jax PRNG key or a numpy Generator
        (a bool included), or ``epoch`` is given with a Generator.

    Examples:
      >>> order = epoch_order(5, 0, epoch=1)
      >>> sorted(order.tolist())
      [0, 1, 2, 3, 4]
      >>> np.array_equal(order, epoch_order(5, 0, epoch=1))  # recomputed after a restart
      True
      >>> epoch_order(5, jax.random.key(0), epoch=1).shape
      (5,)
    """
    if isinstance(rng, bool):
        raise TypeError(f"epoch_order: rng must be an int seed, a jax PRNG key or a numpy Generator, got {rng!r}.")
    if checks.is_int(rng):
        seed = int(rng) if epoch is None else [int(rng), int(epoch)]
        return np.random.default_rng(seed).permutation(n)
    if _is_jax_key(rng):
        key = rng if epoch is None else jax.random.fold_in(rng, int(epoch))
        return np.asarray(jax.random.permutation(key, n), dtype=np.int64)
    if isinstance(rng, np.random.Generator):
        if epoch is not None:
            raise TypeError(
                "epoch_order: epoch= needs an int seed or a jax PRNG key; a numpy "
                "Generator's order depends on how much it has been used."
            )
        return rng.permutation(n)
    raise TypeError(
        f"epoch_order: rng must be an int seed, a jax PRNG key or a numpy Generator, got {type(rng).__name__}."
    )


def num_batches(n: int, batch_size: int, drop_remainder: bool = True) -> int:
    """How many batches :func:`batches` yields for ``n`` examples.

    Args:
      n: number of examples.
      batch_size: examples per batch.
      drop_remainder: as for :func:`batches`: count the last, smaller batch
        only when ``False``.

    Returns:
      ``n // batch_size``, or ``ceil(n / batch_size)`` without ``drop_remainder``.

    Examples:
      >>> num_batches(10, 3), num_batches(10, 3, drop_remainder=False)
      (3, 4)
    """
    return n // batch_size if drop_remainder else -(-n // batch_size)


def _aligned(fn: str, arrays, to_numpy: bool = True):
    """``(pack, leaves, n)``: the arrays of a tuple/list/dict/single array, checked to share
    their leading size ``n``; ``pack(leaves)`` rebuilds the caller's container."""
    if isinstance(arrays, dict):
        keys, values, kind = list(arrays), list(arrays.values()), "dict"
    elif isinstance(arrays, (tuple, list)):
        keys, values, kind = None, list(arrays), "tuple"
    else:
        keys, values, kind = None, [arrays], "single"
    if not values:
        raise ValueError(f"{fn}: arrays is empty; pass a tuple or dict of arrays.")
    # NumPy arrays; with to_numpy=False, jax arrays stay where they are.
    values = [v if not to_numpy and isinstance(v, jax.Array) else np.asarray(v) for v in values]
    labels = keys if keys is not None else list(range(len(values)))
    if any(np.ndim(v) == 0 for v in values):
        raise ValueError(
            f"{fn}: every array needs a leading (example) axis; got a scalar at "
            f"{[l for l, v in zip(labels, values) if np.ndim(v) == 0]}."
        )
    sizes = {l: v.shape[0] for l, v in zip(labels, values)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"{fn}: all arrays need the same leading size, got {sizes}.")

    def pack(batch):
        if kind == "dict":
            return dict(zip(keys, batch))
        if kind == "single":
            return batch[0]
        return tuple(batch)

    return pack, values, values[0].shape[0]


def batches(
    arrays: ArrayLike | Sequence[ArrayLike] | Mapping[str, ArrayLike],
    batch_size: int,
    *,
    shuffle: bool = False,
    rng: Optional[int | jax.Array | np.random.Generator] = None,
    drop_remainder: bool = True,
    epoch: Optional[int] = None,
    skip: int = 0,
) -> "Batches":
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
      The batches, a :class:`Batches`, an iterator over the batches that also carries these
      arguments. Arguments are checked when ``batches`` is called, not at the
      first ``next``.

    Raises:
      ValueError: the arrays are empty, scalars or of different leading sizes;
        ``batch_size`` exceeds ``n`` with ``drop_remainder``; ``skip < 0``; or
        ``shuffle`` without ``rng``.
      TypeError: a bad ``rng`` (see :func:`epoch_order`).
      ArgumentError: ``batch_size`` is not a positive int.

    Examples:
      >>> x, y = np.arange(10).reshape(5, 2), np.arange(5)
      >>> [yb.tolist() for xb, yb in batches((x, y), 2)]
      [[0, 1], [2, 3]]
      >>> [b["y"].tolist() for b in batches({"x": x, "y": y}, 2, drop_remainder=False)]
      [[0, 1], [2, 3], [4]]
      >>> shuffled = [yb for _, yb in batches((x, y), 2, shuffle=True, rng=0, epoch=1)]
      >>> np.array_equal(np.concatenate(shuffled), epoch_order(5, 0, epoch=1)[:4])
      True
      >>> resumed = batches((x, y), 2, shuffle=True, rng=0, epoch=1, skip=1)
      >>> np.array_equal(next(resumed)[1], shuffled[1])  # the batch after the first
      True
    """
    pack, values, n = _aligned("batches", arrays)
    batch_size = checks.positive_int("batches", "batch_size", batch_size)
    if drop_remainder and 0 < n < batch_size:
        raise ValueError(
            f"batches: batch_size={batch_size} is larger than the {n} examples, so "
            "drop_remainder=True would yield nothing; use a smaller batch_size or "
            "drop_remainder=False."
        )
    if skip < 0:
        raise ValueError(f"batches: skip must be >= 0, got {skip}.")
    if shuffle:
        if rng is None:
            raise ValueError(
                "batches: shuffle=True needs rng= (an int seed or a jax PRNG key) so the order is reproducible."
            )
        order = epoch_order(n, rng, epoch)
    else:
        order = None
    total = num_batches(n, batch_size, drop_remainder)
    rows = _Rows(values, pack, order, batch_size)

    def generate():
        for i in range(skip, total):
            yield rows.take(i * batch_size, min((i + 1) * batch_size, n))

    return Batches(
        generate(),
        n=n,
        batch_size=batch_size,
        shuffle=bool(shuffle),
        rng=rng if shuffle else None,
        drop_remainder=bool(drop_remainder),
        skip=skip,
        rows=rows,
    )


class _Rows:
    """The examples of one epoch in visiting order: ``take(start, stop)`` gathers
    positions ``start .. stop - 1`` of that order (a view without shuffle, when it can)."""

    def __init__(self, values, pack, order, batch_size):
        self.values, self.pack, self.order, self.batch_size = values, pack, order, batch_size

    def take(self, start: int, stop: int, pad_to: Optional[int] = None):
        """Rows ``start .. stop - 1``; with ``pad_to``, the last ``batch_size`` of them
        repeated until there are ``pad_to`` rows (one gather, nothing copied twice)."""
        if pad_to is None or pad_to == stop - start:
            if self.order is None:
                return self.pack([v[start:stop] for v in self.values])
            idx = self.order[start:stop]
        else:
            idx = np.arange(start, stop) if self.order is None else self.order[start:stop]
            idx = np.concatenate([idx] + [idx[-self.batch_size :]] * ((pad_to - (stop - start)) // self.batch_size))
        return self.pack([v[idx] for v in self.values])


class Batches:
    """What :func:`batches` returns: an iterator over one epoch's batches (used up
    after one pass, like a generator) that also says what they are made of.

    ``n``, ``batch_size``, ``shuffle``, ``rng`` (None without shuffle) and
    ``drop_remainder`` are :func:`batches`'s arguments (``n`` the number of
    examples), as :class:`DeviceData` has them: ``fit`` reads them from each epoch's
    iterable (``train_data(epoch)``) and records them in its checkpoints, so a resume
    over other data is refused instead of training some examples twice.

    :meth:`stacked` reads several of the epoch's batches at once, as one array per
    leaf with a leading batch axis, without using the iterator up: ``fit`` runs
    several steps per dispatch on them (see its ``steps_per_dispatch``), with one
    gather and one host-to-device copy per dispatch instead of one per step.

    Args:
      generator: the generator of the epoch's batches, which the iterator draws from.
      n: the number of examples (kept as ``.n``, as are the arguments below).
      batch_size: examples per batch.
      shuffle: whether the examples are visited in a shuffled order.
      rng: the seed of the shuffle (None without shuffle).
      drop_remainder: whether the last, smaller batch is dropped.
      skip: how many leading batches the iteration skips (:func:`batches`'s ``skip``).
      rows: where :meth:`stacked` reads the batches from (``batches`` passes it; None:
        an iterator without random access).

    Examples:
      >>> it = batches(np.arange(10), 4)
      >>> it
      Batches(n=10, batch_size=4, shuffle=False, drop_remainder=True)
      >>> [b.tolist() for b in it]
      [[0, 1, 2, 3], [4, 5, 6, 7]]
      >>> list(it)  # used up
      []
    """

    def __init__(
        self,
        generator: Iterator[Any],
        *,
        n: int,
        batch_size: int,
        shuffle: bool,
        rng: Optional[int | jax.Array | np.random.Generator],
        drop_remainder: bool,
        skip: int = 0,
        rows: Optional[_Rows] = None,
    ) -> None:
        self._generator = generator
        self.n, self.batch_size, self.shuffle = n, batch_size, shuffle
        self.rng, self.drop_remainder, self.skip = rng, drop_remainder, skip
        self._rows = rows

    @property
    def num_batches(self) -> int:
        """The epoch's batches, those ``skip`` leaves out included."""
        return num_batches(self.n, self.batch_size, self.drop_remainder)

    @property
    def stackable(self) -> bool:
        """Whether :meth:`stacked` and :meth:`batch` can read this epoch's batches (an
        iterator made by :func:`batches`)."""
        return self._rows is not None

    @property
    def full_batches(self) -> int:
        """The epoch's batches of ``batch_size`` examples (all but a smaller last one)."""
        return self.n // self.batch_size

    def batch(self, i: int):
        """Batch ``i`` of the epoch (numbered from 0, ``skip`` not applied), the same
        values iteration yields, without advancing the iterator.

        Args:
          i: the batch's number, ``0 <= i < num_batches``.

        Returns:
          The batch, in the arrays' container.

        Raises:
          ValueError: ``i`` is out of range, or the iterator was not made by :func:`batches`.

        Examples:
          >>> it = batches(np.arange(10), 4, drop_remainder=False)
          >>> it.batch(2).tolist(), it.num_batches
          ([8, 9], 3)
        """
        self._check_readable("batch")
        if not 0 <= i < self.num_batches:
            raise ValueError(f"Batches.batch: batch {i} is not among the epoch's {self.num_batches} batches.")
        b = self.batch_size
        return self._rows.take(i * b, min((i + 1) * b, self.n))

    def _check_readable(self, method: str) -> None:
        if self._rows is None:
            raise ValueError(
                f"Batches.{method}: this iterator has no random access (it was not made by funcnet.data.batches)."
            )

    def stacked(self, start: int, count: int, size: Optional[int] = None):
        """Batches ``start .. start + count - 1`` of the epoch (numbered from 0, ``skip``
        not applied) as one batch of arrays of shape ``(size, batch_size, ...)``:
        element ``j`` is batch ``start + j``, the same values iteration yields, and
        elements past ``count`` repeat the last one (padding, so that one compiled
        program can serve every ``count``). Only full batches (``full_batches``) stack;
        the iterator is not advanced.

        Args:
          start: the first batch's number in the epoch.
          count: how many batches.
          size: the leading axis's length, ``>= count`` (default ``count``).

        Returns:
          The batches' container (tuple, dict or array) with stacked arrays.

        Raises:
          ValueError: the batches are not all full batches of the epoch; ``size <
            count``; or the iterator was not made by :func:`batches`.

        Examples:
          >>> it = batches(np.arange(10), 3, shuffle=True, rng=0)
          >>> chunk = it.stacked(1, 2, size=3)
          >>> chunk.shape
          (3, 3)
          >>> [b.tolist() for b in it][1:3] == chunk[:2].tolist()
          True
          >>> chunk[2].tolist() == chunk[1].tolist()  # the padding repeats the last batch
          True
        """
        size = count if size is None else size
        self._check_readable("stacked")
        if not (0 <= start and 1 <= count <= size and start + count <= self.full_batches):
            raise ValueError(
                f"Batches.stacked: batches {start}..{start + count - 1} padded to "
                f"{size} are not among the epoch's {self.full_batches} full "
                f"batches of {self.batch_size} (need 0 <= start, 1 <= count <= "
                f"size, start + count <= {self.full_batches})."
            )
        b = self.batch_size
        flat = self._rows.take(start * b, (start + count) * b, pad_to=size * b)
        return jax.tree.map(lambda a: a.reshape((size, b) + a.shape[1:]), flat)

    def __iter__(self) -> "Batches":
        return self

    def __next__(self):
        return next(self._generator)

    def close(self) -> None:
        """Stops the iteration, as a generator's ``close`` does."""
        self._generator.close()

    def __repr__(self):
        return (
            f"Batches(n={self.n}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_remainder={self.drop_remainder})"
        )


# --------------------------------------------------------------------------- #
# A data set held on the device
# --------------------------------------------------------------------------- #


class DeviceData:
    """Aligned arrays put on the device once; batches are gathered there, by index.

    The batches are exactly those of :func:`batches` with the same arguments: epoch
    ``e`` visits ``epoch_order(n, rng, e)`` (or ``0..n-1`` without ``shuffle``) in
    consecutive chunks of ``batch_size``. Given as ``train_data`` to
    :func:`funcnet.fit`, the gather runs inside the jitted step, so an epoch costs one
    host-to-device copy of its index matrix and nothing per step but the dispatch
    (and ``fit`` runs several steps per dispatch: see its ``steps_per_dispatch``).
    Use it when the data set fits in device memory (MNIST's 60000 images are 188 MB
    as float32); the host pipeline (:func:`batches`) is for data that does not.

    On a mesh (``device=mesh``, or ``fit(..., mesh=mesh)``, which places it so) the
    examples are split over the mesh's data axis (:func:`funcnet.sharding.data_axis`),
    each device holding about ``n / N`` of them for ``N`` devices along it (whole
    along a second, tensor-parallel axis), and each step gathers a global batch split over the
    devices as :func:`funcnet.distributed.shard_batch` splits one: every device
    picks the batch's rows it holds and one reduce-scatter (over the raw bits, so
    the values are exact) gives each device its part. With several processes, each
    passes the whole data set and places only its own devices' part.

    Called as ``data(epoch)`` it also yields the batches one by one as device
    arrays (a hand-written loop, ``eval_data=``, or the deprecated ``fit(devices=N)``,
    which splits each batch over the pmap devices).

    Args:
      arrays: a tuple/list or dict of arrays sharing their leading size, or one
        array (NumPy or jax); batches come back in the same container type.
        Boolean, integer and floating dtypes.
      batch_size: examples per batch, as for :func:`batches`.
      shuffle: visit the examples in a shuffled order, as for :func:`batches`.
      rng: the seed of the shuffle, as for :func:`batches`.
      drop_remainder: drop the last, smaller batch, as for :func:`batches`.
      device: where to keep the arrays: ``None`` (the default device), a
        ``jax.Device``, or a 1-D ``jax.sharding.Mesh``
        (:func:`funcnet.distributed.data_mesh`) to split them over.

    Raises:
      TypeError: an array of another dtype (complex, string, object), a bad
        ``rng`` (see :func:`epoch_order`) or a bad ``device``.
      ValueError: arrays that are empty, scalars or of different leading sizes;
        ``batch_size`` larger than ``n`` with ``drop_remainder``; ``shuffle``
        without ``rng``; a batch that does not split evenly over the mesh's
        devices.

    Examples:
      >>> x, y = np.arange(10).reshape(5, 2), np.arange(5)
      >>> data = DeviceData((x, y), 2, shuffle=True, rng=0)
      >>> data, data.num_batches
      (DeviceData(n=5, batch_size=2, shuffle=True, drop_remainder=True), 2)
      >>> got = [yb for _, yb in data(epoch=1)]  # device arrays
      >>> expected = [yb for _, yb in batches((x, y), 2, shuffle=True, rng=0, epoch=1)]
      >>> all(np.array_equal(g, e) for g, e in zip(got, expected))
      True
    """

    def __init__(
        self,
        arrays: ArrayLike | Sequence[ArrayLike] | Mapping[str, ArrayLike],
        batch_size: int,
        *,
        shuffle: bool = False,
        rng: Optional[int | jax.Array | np.random.Generator] = None,
        drop_remainder: bool = True,
        device: Optional[jax.Device | jax.sharding.Mesh] = None,
    ) -> None:
        pack, values, n = _aligned("DeviceData", arrays, to_numpy=False)
        bad = [str(v.dtype) for v in values if not _gatherable(v.dtype)]
        if bad:
            raise TypeError(f"DeviceData: arrays must have boolean, integer or floating dtypes, got {bad}.")
        checks.fits_x32("DeviceData", pack(values))
        self.batch_size = checks.positive_int("DeviceData", "batch_size", batch_size)
        self.drop_remainder = checks.flag("DeviceData", "drop_remainder", drop_remainder)
        if self.drop_remainder and n < self.batch_size:
            raise ValueError(
                f"DeviceData: batch_size={batch_size} is larger than the {n} "
                f"examples, so drop_remainder=True would give no batch; use a "
                f"smaller batch_size or drop_remainder=False."
            )
        if shuffle and rng is None:
            raise ValueError(
                "DeviceData: shuffle=True needs rng= (an int seed or a jax PRNG key) so the order is reproducible."
            )
        if shuffle:
            epoch_order(1, rng, 0)  # a bad rng fails here, not in the first epoch
        self.shuffle, self.rng, self.n = bool(shuffle), rng, int(n)
        self.mesh, self._take_jit = None, None
        if isinstance(device, jax.sharding.Mesh):
            self._check_mesh(device)
            self.arrays, self.mesh = _split_rows(device, pack(values), self.n), device
        elif device is None or isinstance(device, jax.Device):
            self.arrays = jax.device_put(pack(values), device)
        else:
            raise TypeError(
                f"DeviceData: device must be None (the default device), a "
                f"jax.Device or a jax.sharding.Mesh, got {type(device).__name__}."
            )

    @property
    def num_batches(self) -> int:
        return num_batches(self.n, self.batch_size, self.drop_remainder)

    def order(self, epoch: int):
        """``(full, tail)``: int32 indices of epoch ``epoch``'s full batches, shape
        ``(n // batch_size, batch_size)``, and of the last, smaller batch (None
        with ``drop_remainder`` or when ``batch_size`` divides ``n``)."""
        idx = (epoch_order(self.n, self.rng, epoch) if self.shuffle else np.arange(self.n)).astype(np.int32)
        full = self.n // self.batch_size
        tail = None
        if not self.drop_remainder and self.n % self.batch_size:
            tail = idx[full * self.batch_size :]
        return idx[: full * self.batch_size].reshape(full, self.batch_size), tail

    def placed(self, mesh=None) -> "DeviceData":
        """This data set with its arrays split over ``mesh`` (None: whole on the
        default device); itself when they already are."""
        if mesh is self.mesh or (mesh is not None and mesh == self.mesh):
            return self
        out = object.__new__(DeviceData)
        out.__dict__.update(self.__dict__)
        out._take_jit = None
        if mesh is None:
            out.arrays = jax.device_put(jax.tree.map(lambda a: np.asarray(a)[: self.n], self.arrays))
        else:
            out._check_mesh(mesh)
            rows = self.arrays if self.mesh is None else jax.tree.map(lambda a: np.asarray(a)[: self.n], self.arrays)
            out.arrays = _split_rows(mesh, rows, self.n)
        out.mesh = mesh
        return out

    def take(self, arrays, idx):
        """The batch of rows ``idx`` of ``arrays`` (this data set's, as placed): a pure
        function of its arguments for use inside ``jax.jit`` (``fit``'s step calls it)."""
        if self.mesh is None:
            return jax.tree.map(lambda a: a[idx], arrays)
        return _take_split(self.mesh, arrays, idx)

    def take_ordered(self, arrays, idx):
        """:meth:`take` for ``idx`` a batch of this data set's own order (a row of
        :meth:`order`'s ``full``, or its ``tail``), as ``fit`` reads it: the same rows,
        and without ``shuffle`` (consecutive rows) read as one slice from ``idx[0]``
        instead of a gather: one contiguous block, which XLA reads without an index per
        row (BENCHMARKS.md, workload 6's runs T and U, has the effect in ``fit``)."""
        if self.shuffle or self.mesh is not None:
            return self.take(arrays, idx)
        return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, idx[0], idx.shape[0]), arrays)

    def __call__(self, epoch: int = 0, skip: int = 0) -> Iterator:
        if self._take_jit is None:
            take = jax.jit(self.take)
            self._take_jit = take if self.mesh is None else _with_mesh(self.mesh, take)
        full, tail = self.order(epoch)
        rows = list(full) + ([tail] if tail is not None else [])
        for idx in rows[skip:]:
            yield self._take_jit(self.arrays, idx)

    def _check_mesh(self, mesh) -> None:
        axis = data_axis(mesh)
        n_split = mesh.shape[axis]
        tail = 0 if self.drop_remainder else self.n % self.batch_size
        for size in (self.batch_size, tail):
            if size % n_split:
                fix = (
                    f"Use a batch_size that is a multiple of {n_split} (e.g. "
                    f"{max(n_split, size // n_split * n_split)})."
                    if size == self.batch_size
                    else f"It is each epoch's last batch, the rows left of n={self.n} after "
                    f"batches of batch_size={self.batch_size}: drop it "
                    f"(drop_remainder=True) or pick a batch_size that leaves a multiple "
                    f"of {n_split}."
                )
                raise ValueError(
                    f"DeviceData: a batch of {size} examples cannot be split evenly "
                    f"over {n_split} devices (mesh axis {axis!r}). {fix}"
                )

    def __repr__(self) -> str:
        where = "" if self.mesh is None else f", split over {self.mesh.shape[data_axis(self.mesh)]} devices"
        return (
            f"DeviceData(n={self.n}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_remainder={self.drop_remainder}{where})"
        )


def _gatherable(dtype) -> bool:
    return (
        dtype == np.bool_
        or jax.numpy.issubdtype(dtype, np.integer)
        or (jax.numpy.issubdtype(dtype, np.floating) and dtype.itemsize in (1, 2, 4, 8))
    )


def _split_rows(mesh, tree, n: int):
    """Every leaf's rows split over ``mesh``'s axis, zero rows appended up to a multiple
    of the device count (no index points at them)."""
    split = mesh.shape[data_axis(mesh)]
    per = -(-n // split)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(data_axis(mesh)))

    def put(x):
        xp = jax.numpy if isinstance(x, jax.Array) else np

        def part(index):
            start = index[0].start or 0
            stop = per * split if index[0].stop is None else index[0].stop
            piece = x[start : min(stop, n)]
            if stop > n:
                piece = xp.concatenate([piece, xp.zeros((stop - max(start, n),) + x.shape[1:], x.dtype)])
            return piece

        return jax.make_array_from_callback((per * split,) + x.shape[1:], sharding, part)

    return jax.tree.map(put, tree)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _take_split(mesh, arrays, idx):
    """Rows ``idx`` (the same on every device) of row-split ``arrays``, split over the axis.

    Each device gathers the requested rows it holds, zeros elsewhere, and a reduce-scatter
    adds the devices' parts and leaves each its slice of the batch. The sum runs over the
    raw bits as unsigned integers (only one device's part is not zero), so every value,
    -0.0 and NaN payloads included, arrives exactly.
    """
    from jax import lax

    jnp = jax.numpy
    axis = data_axis(mesh)
    spec = jax.sharding.PartitionSpec(axis)

    def local(arrays, idx):
        rows = jax.tree.leaves(arrays)[0].shape[0]
        at = idx - lax.axis_index(axis) * rows
        mine = (at >= 0) & (at < rows)
        at = jnp.where(mine, at, 0)

        def one(a):
            got = a[at]
            if a.dtype == np.bool_:
                bits = got.astype(np.uint8)
            elif jnp.issubdtype(a.dtype, np.integer):
                bits = got
            else:
                bits = lax.bitcast_convert_type(got, _UINT[a.dtype.itemsize])
            keep = mine.reshape(mine.shape + (1,) * (got.ndim - 1))
            bits = lax.psum_scatter(
                jnp.where(keep, bits, jnp.zeros((), bits.dtype)), axis, scatter_dimension=0, tiled=True
            )
            if a.dtype == np.bool_:
                return bits != 0
            if jnp.issubdtype(a.dtype, np.integer):
                return bits
            return lax.bitcast_convert_type(bits, a.dtype)

        return jax.tree.map(one, arrays)

    return jax.shard_map(local, mesh=mesh, in_specs=(spec, jax.sharding.PartitionSpec()), out_specs=spec)(arrays, idx)


def _with_mesh(mesh, fn):
    def run(*args):
        with jax.set_mesh(mesh):
            return fn(*args)

    return run


# --------------------------------------------------------------------------- #
# Prefetching
# --------------------------------------------------------------------------- #


def _placement(device):
    if device is None or isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, (list, tuple)) and device and all(isinstance(d, jax.Device) for d in device):
        mesh = jax.sharding.Mesh(np.array(device), ("devices",))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
    raise TypeError(
        "prefetch_to_device: device must be None, a jax.Device, a "
        f"jax.sharding.Sharding or a list of devices, got {device!r}."
    )


def prefetch_to_device(
    iterator: Iterable,
    size: int = 2,
    device: Optional[jax.Device | jax.sharding.Sharding | Sequence[jax.Device]] = None,
    transform: Optional[Callable[[Any], Any]] = None,
) -> Iterator:
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

    Returns:
      A generator of the transformed items as jax arrays on ``device``.

    Raises:
      ArgumentError: ``size`` is not a positive int.
      ValueError: an item holds a 64-bit integer that int32 cannot hold with x64
        off.
      TypeError: ``device`` is none of the accepted kinds.

    Examples:
      >>> items = prefetch_to_device(batches(np.arange(6.0), 2), size=2)
      >>> [(type(b).__name__, b.tolist()) for b in items]
      [('ArrayImpl', [0.0, 1.0]), ('ArrayImpl', [2.0, 3.0]), ('ArrayImpl', [4.0, 5.0])]
    """
    size = checks.positive_int("prefetch_to_device", "size", size)
    target = _placement(device)
    it = iter(iterator)

    def put(item):
        if transform is not None:
            item = transform(item)
        checks.fits_x32("prefetch_to_device", item)
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


# --------------------------------------------------------------------------- #
# A background thread
# --------------------------------------------------------------------------- #

_ITEM, _END, _ERROR = 0, 1, 2


class Background:
    """The items of ``iterable``, produced ``size`` ahead by a background thread.

    Made by :func:`background`; an iterator and a context manager. :meth:`close` (or
    leaving the ``with`` block, or the iterator being garbage-collected) stops the
    thread and waits for it: the thread checks between items, so it finishes at most
    the item it is computing (a blocking ``next`` of the source finishes first).

    Args:
      iterable: the iterable to read ahead, as for :func:`background`.
      size: how many items may wait in the queue, as for :func:`background`.
      transform: applied in the thread to every item, as for :func:`background`.

    Examples:
      >>> items = Background(range(3), size=2, transform=lambda i: i * i)
      >>> list(items)
      [0, 1, 4]
      >>> items.close()  # already ended: a no-op
    """

    def __init__(self, iterable: Iterable, size: int, transform: Optional[Callable]) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._done = False
        # Taken here, on the caller's thread: an argument error of the source's
        # iter() is the caller's, as with a plain for loop.
        source = iter(iterable)
        self._thread = threading.Thread(
            target=self._produce, args=(source, transform), name="funcnet-background", daemon=True
        )
        self._thread.start()

    def _put(self, message) -> bool:
        """Waits for room in the queue; False once the consumer has stopped."""
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, source, transform) -> None:
        index = 0
        try:
            while not self._stop.is_set():
                try:
                    item = next(source)
                except StopIteration:
                    self._put((_END, None, index))
                    return
                if transform is not None:
                    item = transform(item)
                if not self._put((_ITEM, item, index)):
                    return
                index += 1
        except BaseException as e:  # re-raised on the consumer's thread, in __next__
            self._put((_ERROR, e, index))
        finally:
            close = getattr(source, "close", None)  # a generator: run its finally blocks here
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 -- the consumer is gone; nothing to report to
                    pass

    def __iter__(self) -> "Background":
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        kind, value, index = self._queue.get()
        if kind == _ITEM:
            return value
        self._done = True
        self._thread.join()
        if kind == _END:
            raise StopIteration
        value.add_note(
            f"funcnet.data.background: raised in the background thread while it "
            f"produced item {index} (0-based) of the iterable (in fit: the batch "
            f"index in the epoch)."
        )
        raise value

    def close(self) -> None:
        """Stops the thread (it drops what it had produced ahead) and waits for it."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # make room, so a put the thread is blocked in returns at once
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.01)

    def __enter__(self) -> "Background":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_thread", None) is not None and self._thread.is_alive():
            self._stop.set()  # no join from a finalizer: the thread ends at its next check


def background(iterable: Iterable, size: int = 2, transform: Optional[Callable[[Any], Any]] = None) -> Background:
    """Iterates ``iterable`` in a background thread, ``size`` items ahead, in order.

    The thread takes each item, applies ``transform`` (e.g. ``jax.device_put``, which
    starts the copy to the device) and hands it over through a queue of ``size``
    items, so assembling the next batches (NumPy gathers and copies, which release
    the GIL) overlaps with the work on the current one. The items and their order are
    exactly the iterable's. An exception raised by the iterable or ``transform`` is
    raised from ``next()`` with the index of the item it was producing added as a
    note. Use it as a context manager (``with background(it) as items:``) so that
    stopping early (a ``break``, an exception, KeyboardInterrupt) also stops the thread.

    The iterable runs on the other thread: an iterable that needs the calling thread
    (thread-local state, e.g. a ``jax.enable_x64`` context it relies on) should be
    iterated directly.

    Args:
      iterable: any iterable; a generator's ``close`` runs (in the thread) when it
        ends or is stopped.
      size: how many items may wait in the queue (>= 1).
      transform: applied in the thread to every item.

    Returns:
      The iterator, a :class:`Background`: an iterator over the (transformed) items and a
      context manager that stops the thread on exit.

    Raises:
      ArgumentError: ``size`` is not a positive int.

    Examples:
      >>> with background(batches(np.arange(6), 2), transform=lambda b: b * 10) as items:
      ...     [b.tolist() for b in items]
      [[0, 10], [20, 30], [40, 50]]
    """
    size = checks.positive_int("background", "size", size)
    return Background(iterable, size, transform)
