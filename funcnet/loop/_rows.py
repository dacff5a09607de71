"""An epoch's step metrics on the host, one array per metric (:class:`StepRows`)."""

from __future__ import annotations

import numpy as np

__all__: list = []


class StepRows:
    """The fetched metrics of consecutive steps, in step order: ``columns`` maps each
    metric to an array whose first axis is the step (then a step's own axes: the
    devices under pmap).

    A column per metric rather than a dict per step: fit sums, checks and shows these
    as arrays, and for an epoch of 1875 dispatch-bound steps the per-step dicts cost
    ~13 ms of host time to build (and more to read back into arrays). Indexing keeps
    the per-step view: ``rows[i]`` is step ``i``'s ``{metric: value}``, ``rows[a:b]``
    the rows of those steps.
    """

    __slots__ = ("columns", "n")

    def __init__(self, columns: dict, n: int):
        self.columns, self.n = columns, int(n)

    @classmethod
    def stacked(cls, chunks) -> "StepRows":
        """The rows of ``(host rows, n)`` chunks: each a dict of arrays stacked on a
        first axis of which the first ``n`` entries are steps (a device loop's rows,
        or a padded stack of steps)."""
        chunks = [(rows, n) for rows, n in chunks if n]
        if not chunks:
            return cls({}, 0)
        columns = {key: np.concatenate([np.asarray(rows[key])[:n] for rows, n in chunks]) for key in chunks[0][0]}
        return cls(columns, sum(n for _, n in chunks))

    @classmethod
    def of(cls, steps) -> "StepRows":
        """The rows of a list of per-step ``{metric: value}`` dicts on the host."""
        return cls.stacked([({key: np.asarray(v)[None] for key, v in step.items()}, 1) for step in steps])

    def __len__(self) -> int:
        return self.n

    def keys(self) -> tuple:
        return tuple(self.columns)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return StepRows({key: v[i] for key, v in self.columns.items()}, len(range(*i.indices(self.n))))
        if not -self.n <= i < self.n:
            raise IndexError(f"step {i} of {self.n}")
        return {key: v[i] for key, v in self.columns.items()}

    def column(self, key: str) -> np.ndarray:
        """Metric ``key`` of every step, ``(steps, values per step)``."""
        return self.columns[key].reshape(self.n, -1)
