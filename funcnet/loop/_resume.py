"""Resuming ``fit``: the checkpoint to start from, and what its loop position means.

A checkpoint written by ``fit`` holds, beside the train state and the
:class:`funcnet.loop.LoopPosition`, the layout of the training data the position
counts in (batch size, data size, drop_remainder, shuffle and seed) and the states of
the stateful callbacks. :func:`resume` reads them back; :func:`check_layout` refuses
to resume over other data, which would train some examples twice and others never.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional, Sequence

import jax
import numpy as np

from funcnet import _checks as checks
from funcnet import checkpoint as ckpt
from funcnet._loop_position import LoopPosition

__all__ = ["data_layout", "check_layout", "stateful", "checkpoint_extras", "resume", "EpochSums"]


class EpochSums:
    """Running sums of an epoch's per-step metrics, what a resumed epoch's logs need.

    ``fit`` logs each metric's mean over an epoch's steps. A checkpoint taken inside an
    epoch stores these sums of the steps so far; the resumed run adds its own steps to
    them, so its epoch mean is the uninterrupted run's, bit for bit. That holds because
    the sum is sequential, in step order, in float64 (Python floats): the resumed run
    continues the very additions the uninterrupted one makes. (A pairwise float32 mean,
    NumPy's, would depend on where the epoch was cut.)

    In a checkpoint the sums have one fixed shape, whatever the metrics are called: up
    to ``MAX_METRICS`` names of up to ``MAX_NAME`` UTF-8 bytes each, as rows of a uint8
    array. So resuming needs no knowledge of the step's metrics before it runs.
    """

    MAX_METRICS = 64
    MAX_NAME = 64

    def __init__(self, keys: Sequence[str], sums: Sequence[float], count: int):
        self.keys, self.sums, self.count = tuple(keys), tuple(sums), int(count)

    @classmethod
    def zeros(cls, keys: Sequence[str]) -> "EpochSums":
        return cls(keys, [0.0] * len(keys), 0)

    @classmethod
    def of(cls, host) -> "EpochSums":
        """Zero sums over the metrics of fetched steps ``host`` (``_rows.StepRows``),
        ``loss`` first."""
        keys = () if not host else ("loss",) + tuple(k for k in host.keys() if k != "loss")
        return cls.zeros(keys)

    def plus(self, host) -> "EpochSums":
        """These sums with the fetched step metrics ``host`` (``_rows.StepRows``, in step
        order) added; a step's value is its mean over devices (pmap) and elements, in
        the metric's dtype, as NumPy's ``mean`` of that step's array."""
        sums = list(self.sums)
        if host:
            for i, key in enumerate(self.keys):
                values = host.column(key).mean(axis=1).astype(np.float64)
                # cumsum adds in order, one float64 addition at a time: the same sums as a
                # Python loop (np.sum would add pairwise, and differ with where epochs split)
                sums[i] = float(np.cumsum(np.concatenate(([sums[i]], values)))[-1])
        return EpochSums(self.keys, sums, self.count + len(host))

    def means(self) -> dict:
        return {k: s / self.count for k, s in zip(self.keys, self.sums)} if self.count else {}

    def tree(self) -> dict:
        """The checkpoint entry: NumPy arrays of fixed shapes, which both backends store
        as they are. ``count`` -1: these metrics do not fit it (too many, or a name too
        long), so the resumed epoch's means will cover its resumed steps only."""
        keys = np.zeros((self.MAX_METRICS, self.MAX_NAME), np.uint8)
        sums = np.zeros(self.MAX_METRICS, np.float64)
        names = [k.encode() for k in self.keys]
        if len(names) > self.MAX_METRICS or any(len(n) > self.MAX_NAME for n in names):
            return {"count": np.int64(-1), "keys": keys, "sums": sums}
        for i, (name, value) in enumerate(zip(names, self.sums)):
            keys[i, : len(name)] = np.frombuffer(name, np.uint8)
            sums[i] = value
        return {"count": np.int64(self.count), "keys": keys, "sums": sums}

    @classmethod
    def empty_tree(cls) -> dict:
        """A target of :meth:`tree`'s shapes, for a restore."""
        return cls((), (), 0).tree()

    @classmethod
    def from_tree(cls, tree) -> Optional["EpochSums"]:
        """The sums a checkpoint holds, or None when it could not hold them."""
        count = int(tree["count"])
        if count < 0:
            return None
        rows = np.asarray(tree["keys"], np.uint8)
        keys = [bytes(row).rstrip(b"\0").decode() for row in rows]
        n = sum(1 for k in keys if k)
        return cls(keys[:n], [float(v) for v in np.asarray(tree["sums"])[:n]], count)


def data_layout(data=None) -> dict:
    """What a loop position (batches into an epoch) means in ``data``, as int64 scalars
    for the checkpoint: its ``batch_size``, ``n``, ``drop_remainder``, ``shuffle`` and
    shuffle seed (``rng``), for data that says what it is made of (a
    :class:`funcnet.data.DeviceData`, a :class:`funcnet.data.Batches`); -1 everywhere
    for None, data that does not (``_sources`` asks, and fills in a host pipeline's
    batch size from its first batch)."""
    layout = {k: np.int64(-1) for k in ("batch_size", "n", "drop_remainder", "shuffle", "seed")}
    if data is not None:
        rng = data.rng
        if not data.shuffle:
            seed = -1
        elif checks.is_int(rng):
            seed = int(rng) % 2**62
        elif isinstance(rng, jax.Array):  # a key: its bits, folded into 62 bits
            bits = (
                np.asarray(jax.random.key_data(rng) if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng)
                .astype(np.uint64)
                .ravel()
            )
            seed = int(sum(int(b) << (32 * i) for i, b in enumerate(bits[:2]))) % 2**62
        else:
            seed = -1  # a numpy Generator: its state moves on, nothing fixed to compare
        layout.update(
            batch_size=np.int64(data.batch_size),
            n=np.int64(data.n),
            drop_remainder=np.int64(data.drop_remainder),
            shuffle=np.int64(data.shuffle),
            seed=np.int64(seed),
        )
    return layout


_LAYOUT_FIX = {
    "batch_size": "batch size",
    "n": "number of examples",
    "drop_remainder": "drop_remainder",
    "shuffle": "shuffle",
    "seed": "shuffle seed (rng=)",
}


def check_layout(resumed, layout, where="train_data") -> None:
    """A resumed loop position counts batches of the data it was saved with: with other
    data, skipping that many batches would train some examples twice and others never."""
    if resumed is None:
        return
    saved = {k: int(v) for k, v in resumed["data"].items()}
    for key, what in _LAYOUT_FIX.items():
        now = int(layout[key])
        if saved[key] != -1 and now != -1 and saved[key] != now:
            raise ValueError(
                f"fit: resume_from= holds a run saved with {where} of {key}={saved[key]}, but "
                f"this fit's {where} has {key}={now}. The checkpoint's position counts "
                f"batches of the saved data, so resuming with another {what} would train some "
                f"examples of the epoch twice and others never. Resume with {key}={saved[key]}, "
                f"or start a new run (another directory)."
            )


def stateful(callbacks, train_state):
    """``(key, callback)`` for each callback with a checkpoint state; keys keep order."""
    return [
        (f"{i}_{type(cb).__name__}", cb)
        for i, cb in enumerate(callbacks)
        if cb.checkpoint_state(train_state) is not None
    ]


def checkpoint_extras(callbacks, layout, train_state, epoch_sums: Optional[EpochSums] = None) -> dict:
    """The checkpoint's entries beside the train state and position: the data layout,
    the callbacks' states and the sums of the current epoch's metrics so far (none yet:
    ``epoch_sums`` None)."""
    return {
        "data": dict(layout),
        "callbacks": {key: cb.checkpoint_state(train_state) for key, cb in stateful(callbacks, train_state)},
        "epoch_metrics": (EpochSums.empty_tree() if epoch_sums is None else epoch_sums.tree()),
    }


def resume(resume_from, missing_ok, train_state, extras):
    """``(train_state, position, run id, restored extras or None)`` to start from: the
    latest finite checkpoint of ``resume_from`` (a directory or a Checkpointer), or
    ``train_state`` and a new run. ``extras`` is the target of the data layout and the
    callbacks' states (see :func:`checkpoint_extras`)."""
    if resume_from is None:
        return train_state, LoopPosition(), ckpt.new_run_id(), None
    checkpointer = ckpt.checkpointer_for(resume_from, where="fit(resume_from=...)")
    step = checkpointer.latest_step(finite_only=True)
    if step is None:
        steps = checkpointer.all_steps()
        if steps:
            raise FloatingPointError(
                f"fit: resume_from={_shown(resume_from)} holds only non-finite checkpoints "
                f"(steps {steps}); there is no good state to resume from. Start a new run "
                f"(a new directory) or restore one explicitly with restore(..., step=)."
            )
        if missing_ok:
            return train_state, LoopPosition(), ckpt.new_run_id(), None
        raise FileNotFoundError(
            f"fit: resume_from={_shown(resume_from)} holds no checkpoint "
            f"({_listing(checkpointer.directory)}). Check the path (and the backend: an orbax "
            f"directory needs resume_from=OrbaxCheckpointer(path)), or pass "
            f"options=FitOptions(missing_ok=True) to start from scratch when there is none yet."
        )
    base = LoopPosition().checkpoint_tree(train_state)
    try:
        restored = _restore_extras(checkpointer, step, base, extras)
    except ckpt.CheckpointMismatchError as e:
        try:  # a checkpoint saved before fit stored the data layout and callback states
            restored = {**checkpointer.restore(base, step=step), "data": None}
        except ckpt.CheckpointMismatchError:
            raise ValueError(
                f"fit: resume_from={_shown(resume_from)} does not fit this fit's train state "
                f"and callbacks (callbacks with state: "
                f"{sorted(extras['callbacks']) or 'none'}). Resume with the same model, "
                f"optimizer and callbacks as the saved run. The checkpoint says: {e}"
            ) from None
    position = LoopPosition(int(restored["epoch"]), int(restored["batch_in_epoch"]))
    run_id = checkpointer.info(step).run_id or ckpt.new_run_id()
    if restored["data"] is None:
        warnings.warn(
            f"fit: the checkpoint in resume_from={_shown(resume_from)} holds no data "
            f"layout or callback states (an older funcnet wrote it): the batch size "
            f"is not checked and callbacks start afresh.",
            RuntimeWarning,
            stacklevel=3,
        )
        return restored["train_state"], position, run_id, None
    return restored["train_state"], position, run_id, restored


def _restore_extras(checkpointer, step, base, extras) -> dict:
    """The checkpoint with its extras; one saved without the epoch's metric sums (an
    earlier funcnet) restores with ``epoch_metrics`` None: the resumed epoch's logged
    means then cover the resumed steps only."""
    try:
        return checkpointer.restore({**base, **extras}, step=step)
    except ckpt.CheckpointMismatchError:
        without = {k: v for k, v in extras.items() if k != "epoch_metrics"}
        return {**checkpointer.restore({**base, **without}, step=step), "epoch_metrics": None}


def _shown(resume_from) -> str:
    return repr(str(resume_from)) if isinstance(resume_from, (str, os.PathLike)) else repr(resume_from)


def _listing(directory) -> str:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return f"{directory} does not exist"
    except NotADirectoryError:
        return f"{directory} is a file, not a directory"
    if not names:
        return f"{directory} is empty"
    more = f", ... ({len(names)} entries)" if len(names) > 10 else ""
    return f"{directory} contains: {', '.join(names[:10])}{more}"
