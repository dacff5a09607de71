"""The :class:`Checkpointer` interface ``fit`` and the ``Checkpoint`` callback use, its npz
backend, and the choice of backend by name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Protocol, runtime_checkable

import jax
import numpy as np

from funcnet import _checks as checks
from funcnet.checkpoint._npz import all_steps, info, is_prng_key, latest_step, restore, save
from funcnet.checkpoint._orbax import OrbaxCheckpointer
from funcnet.checkpoint._ownership import CheckpointInfo

__all__ = ["Checkpointer", "NpzCheckpointer", "checkpointer_for"]


@runtime_checkable
class Checkpointer(Protocol):
    """One checkpoint directory behind one backend: :class:`NpzCheckpointer` (this
    package's npz format, no dependency) or :class:`OrbaxCheckpointer`
    (sharded, asynchronous).

    ``run_id`` names the run whose checkpoints this writes (see :func:`save`);
    ``fit`` sets it. ``every_process_saves`` says whether every process calls
    ``save`` (each writing its own shards) or only process 0 writes. ``save`` may
    return before the files are written; ``wait`` blocks until they are, and
    ``close`` waits and releases the backend.
    """

    directory: Path
    run_id: Optional[str]
    every_process_saves: bool

    def save(self, step: int, tree: Any, *, finite: Optional[bool] = None) -> None: ...
    def restore(self, target: Any, step: Optional[int] = None) -> Any: ...
    def latest_step(self, *, finite_only: bool = False) -> Optional[int]: ...
    def all_steps(self, *, finite_only: bool = False) -> List[int]: ...
    def info(self, step: Optional[int] = None) -> CheckpointInfo: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...


class NpzCheckpointer:
    """:class:`Checkpointer` over :func:`save`/:func:`restore`: one ``ckpt-<step>.npz``
    per step, written synchronously (atomically) by process 0 only.

    A state sharded over a mesh (:func:`funcnet.sharding.shard_params`) is gathered
    whole into process 0's host memory to be written (and placed back with its
    shardings on restore). That is fine for what fits one host; past
    ``max_gather_bytes`` the save refuses, as it does for a state split across
    processes (no one host holds it all): use the orbax backend
    (``backend="orbax"``), which writes each process's shards where they lie.

    Args:
      directory: the checkpoint directory.
      keep: ``keep=`` of :func:`save`.
      run_id: the run the checkpoints belong to, as for :func:`save`.
      overwrite: write into another run's directory, as for :func:`save`.
      max_gather_bytes: the largest sharded state to gather (default 2 GiB; None:
        no limit).
    """

    every_process_saves = False

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        keep: Optional[int] = None,
        run_id: Optional[str] = None,
        overwrite: bool = False,
        max_gather_bytes: Optional[int] = 2**31,
    ) -> None:
        if keep is not None:
            keep = checks.positive_int("NpzCheckpointer", "keep (or None)", keep)
        if max_gather_bytes is not None:
            max_gather_bytes = checks.non_negative_int("NpzCheckpointer", "max_gather_bytes", max_gather_bytes)
        self.directory, self.keep, self.run_id = Path(directory), keep, run_id
        self.overwrite = checks.flag("NpzCheckpointer", "overwrite", overwrite)
        self.max_gather_bytes = max_gather_bytes

    def save(self, step, tree, *, finite=None) -> None:
        _check_gatherable(tree, self.max_gather_bytes)
        if jax.process_index() == 0:
            save(
                self.directory,
                jax.device_get(tree),
                step,
                keep=self.keep,
                run_id=self.run_id,
                finite=finite,
                overwrite=self.overwrite,
            )

    def restore(self, target, step=None):
        return restore(self.directory, target=target, step=step)

    def latest_step(self, *, finite_only=False):
        return latest_step(self.directory, finite_only=finite_only)

    def all_steps(self, *, finite_only=False):
        return all_steps(self.directory, finite_only=finite_only)

    def info(self, step=None) -> CheckpointInfo:
        return info(self.directory, step)

    def wait(self) -> None:
        pass  # saves are synchronous

    def close(self) -> None:
        pass

    def __repr__(self):
        return f"NpzCheckpointer({str(self.directory)!r}, keep={self.keep})"


def _check_gatherable(tree, limit: Optional[int]) -> None:
    """Refuses, with the way out, a sharded state the npz backend cannot or should not
    gather to one host."""
    split = [
        x
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array) and not x.sharding.is_fully_replicated and len(x.sharding.device_set) > 1
    ]
    if not split:
        return
    if any(not x.is_fully_addressable for x in split):
        raise ValueError(
            "NpzCheckpointer.save: the state is sharded across processes, and the "
            "npz backend writes one file from process 0, which does not hold the "
            "other processes' shards. Use the orbax backend (Checkpoint(..., "
            "backend='orbax') or funcnet.checkpoint.OrbaxCheckpointer): "
            "each process writes its own shards."
        )
    total = sum(
        int(np.prod(x.shape)) * x.dtype.itemsize
        for x in jax.tree.leaves(tree)
        if hasattr(x, "dtype") and not is_prng_key(x)
    )
    if limit is not None and total > limit:
        raise ValueError(
            f"NpzCheckpointer.save: the state is sharded over a mesh and the npz "
            f"backend would gather all {total / 2**20:.0f} MiB of it into this "
            f"host's memory, past max_gather_bytes={limit}. Use the orbax backend "
            f"(backend='orbax'), which writes each device's shards without "
            f"gathering, or raise max_gather_bytes."
        )


def checkpointer_for(
    target: str | os.PathLike | Checkpointer,
    *,
    backend: str = "npz",
    keep: Optional[int] = None,
    overwrite: bool = False,
    where: str = "checkpointer_for",
) -> Checkpointer:
    """``target`` itself if it is a :class:`funcnet.checkpoint.Checkpointer`, else the
    ``backend`` (``"npz"`` or ``"orbax"``) checkpointer of the directory ``target``."""
    if isinstance(target, Checkpointer):
        return target
    backend = checks.one_of(where, "backend", backend, ("npz", "orbax"))
    if backend == "orbax":
        return OrbaxCheckpointer(target, keep=keep, overwrite=overwrite)
    return NpzCheckpointer(target, keep=keep, overwrite=overwrite)
