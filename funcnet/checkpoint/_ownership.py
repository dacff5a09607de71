"""The run-ownership policy the checkpoint backends share: which run a directory belongs to,
which run a new checkpoint is saved under, and which steps ``keep=`` may delete."""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import jax
import numpy as np

from funcnet.errors import CheckpointOwnershipError

__all__ = ["CheckpointInfo", "new_run_id", "PROCESS_RUN_ID", "host", "owner_for_save", "steps_to_rotate"]


class CheckpointInfo(NamedTuple):
    """What a checkpoint's header says about it, without loading its arrays.

    ``run_id`` is ``None`` for checkpoints written before funcnet recorded it;
    they count as finite (the flag did not exist either).
    """

    step: int
    run_id: Optional[str]
    finite: bool
    path: Path


def new_run_id() -> str:
    """A fresh run id (host, time-ordered uuid). Every process of a multi-process run
    gets the same one: process 0's, broadcast, because all of them save together."""
    rid = uuid.uuid4()
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        raw = np.frombuffer(rid.bytes, np.uint8).astype(np.int32)
        rid = uuid.UUID(bytes=bytes(np.asarray(multihost_utils.broadcast_one_to_all(raw)).astype(np.uint8).tolist()))
    return f"{host()}-{rid.hex[:16]}"


# The run id of saves that name none: one per process (see save's ``run_id``).
PROCESS_RUN_ID = f"{socket.gethostname()[:32]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def host() -> str:
    """This host's name as it may appear in a file name."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64]


def owner_for_save(
    where: str,
    directory: str | os.PathLike,
    infos: Dict[int, CheckpointInfo],
    step: int,
    run_id: Optional[str],
    *,
    overwrite: bool = False,
) -> str:
    """The run id a new checkpoint of ``step`` is saved under (the rule of :func:`save`'s
    ``run_id``, shared by the backends), or :class:`CheckpointOwnershipError`.

    ``infos`` are the directory's readable checkpoints by step; the newest one owns it.
    """
    mine = run_id or PROCESS_RUN_ID
    if not infos or overwrite:
        return mine
    newest = infos[max(infos)]
    if newest.run_id == mine:
        return mine
    if step > newest.step and (run_id is None or newest.run_id is None):
        # Continuing: an anonymous save after every step (the same script restarted
        # after a crash), or a run taking over checkpoints written before run ids.
        return newest.run_id if run_id is None and newest.run_id else mine
    who = f"run {run_id!r}" if run_id else "this process's run (no run_id given)"
    raise CheckpointOwnershipError(
        f"{where}: {directory} holds the checkpoints of another run ({newest.run_id!r}, steps "
        f"{sorted(infos)}), not of {who}. Saving there would mix the two runs and let keep= "
        f"delete one of them. Either resume from it (fit(..., resume_from=...) continues that "
        f"run), pick a new directory for this run, or pass overwrite=True to replace that "
        f"run's checkpoints."
    )


def steps_to_rotate(infos: Dict[int, CheckpointInfo], step: int, run_id: str, keep: Optional[int]) -> List[int]:
    """The steps ``keep=`` deletes once ``step`` is written (shared by the backends): the
    run's own, older than ``step``, beyond its ``keep`` newest, never the newest finite
    checkpoint in the directory (``infos``, the new one included)."""
    if keep is None:
        return []
    older = sorted(s for s, i in infos.items() if s < step and i.run_id == run_id)
    finite = [s for s, i in infos.items() if i.finite]
    protected = max(finite) if finite else None
    return [s for s in older[: max(len(older) - (keep - 1), 0)] if s != protected]
