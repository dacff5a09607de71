"""fit's choice between two compilations of one dispatch program, by timing both.

Where XLA offers a way to compile a program that gives the same bits and may run
faster or slower (:func:`funcnet.xla.unsplit_fusions`: XLA:CPU's loop fusions on one
thread each), which is faster depends on the network and the machine (0.65x to 1.13x
on the MLPs of workload 6), so ``fit`` measures it: :class:`Raced` serves its first
dispatches with both programs in turn, timed, and the rest with the faster. The
results are the same whichever wins, so nothing a run computes depends on the timing.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Callable, Optional

import jax

__all__: list = []

logger = logging.getLogger("funcnet.loop")

# Timed dispatches of each program before the choice, after each one's first (a warm-up;
# the second's also compiles it). Ten, not three: XLA:CPU's split program runs its first
# few dispatches up to 2x slower than it settles (a warm-up, cause unknown), so on the
# dispatch-bound MLP (jax 0.10.2, where split is ~20% faster) the median of three kept
# the slower program in 2 of 12 runs, of ten in none, on the same timings (BENCHMARKS.md,
# workload 6, run AJ). Twenty 50-step dispatches of ~3 ms: ~0.1 s of a long run.
TIMED = 10
# The second program is compiled only where the steps left would take at least this
# many times as long as compiling the first did: the race then costs at most ~1/PAYS of
# the run, and repays its compilation where the second is >1/PAYS faster (the MLP it
# was built for: 0.65x on jax 0.12, 0.92x on 0.10.2); a short run, a test, never races.
PAYS = 8
# The second program must be at least this much faster per step to be kept: on a tie
# XLA's default stays.
MARGIN = 0.97


class Raced:
    """A dispatch program, ``first`` (XLA's default), and another compilation of it that
    computes the same bits: called like ``first``, it serves the faster of the two.

    ``prospect(args)``, asked at the first call with its arguments, returns ``(build,
    None)`` where a race may pay, ``build()`` compiling the second program (e.g. from
    ``first.lower(*args)``), else ``(None, why not)``: then every call is ``first``'s.
    Until it has chosen, each call runs synchronously and is timed: the first two on
    ``first`` (the prospect's compilation is timed apart; the first run warms up); then,
    only where the steps left (``steps_left``, less those run since) would take ``PAYS``
    times as long as the prospect took, two on the second (built in the first of them)
    and turns until each has ``TIMED`` calls besides its first. ``steps_of(args)`` is
    the steps one call runs (a dispatch's count), so calls of different lengths compare
    per step; a call whose argument shapes differ from the first's (another program)
    goes to ``first``, untimed. ``names`` label the two in ``verdict``, which says what was chosen and why
    (also logged at INFO on the ``funcnet.loop`` logger).
    """

    def __init__(
        self,
        first: Callable,
        prospect: Callable,
        steps_of: Callable,
        steps_left: Optional[int],
        names=("first", "second"),
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.first, self.prospect, self.steps_of, self.names, self.clock = first, prospect, steps_of, names, clock
        self.build: Optional[Callable] = None
        self.second: Optional[Callable] = None
        self.left = steps_left
        self.calls: dict = {"first": [], "second": []}  # (seconds, steps) of each call
        self.signature = None
        self.compile_s = 0.0  # the prospect's time: the first program's trace and compilation
        self.chosen: Optional[Callable] = None
        self.verdict: Optional[str] = None
        if not steps_left:
            self._choose(first, "not raced: the steps left are not known")

    def __call__(self, *args):
        if self.chosen is not None:
            return self.chosen(*args)
        signature = _signature(args)
        if self.signature is None:
            self.signature = signature
            t = self.clock()
            self.build, why_not = self.prospect(args)
            self.compile_s = self.clock() - t
            if self.build is None:
                self._choose(self.first, f"not raced: {why_not}")
                return self.first(*args)
        elif signature != self.signature:
            return self.first(*args)
        which, n = self._next(), self.steps_of(args)
        t = self.clock()
        if which == "second" and self.second is None:
            self.second = self.build()
        out = getattr(self, which)(*args)
        jax.block_until_ready(out)
        self.calls[which].append((self.clock() - t, n))
        self.left -= n
        self._decide()
        return out

    def _next(self) -> str:
        """``first`` twice, the second twice, then whichever has run fewer times."""
        a, b = len(self.calls["first"]), len(self.calls["second"])
        if a < 2:
            return "first"
        return "second" if b < 2 or b < a else "first"

    def _decide(self) -> None:
        a, b = self.calls["first"], self.calls["second"]
        if len(a) == 2 and not b:
            step_s = a[1][0] / a[1][1]
            if self.left * step_s < PAYS * self.compile_s:
                self._choose(
                    self.first,
                    f"not raced: {self.left} steps left at {step_s * 1e3:.3g} ms would not repay "
                    f"a second compilation (~{self.compile_s:.2g} s)",
                )
        elif len(a) > TIMED and len(b) > TIMED:  # each one's first call left out
            fa, fb = (statistics.median(t / n for t, n in calls[1:]) for calls in (a, b))
            keep = fb < MARGIN * fa
            self._choose(
                self.second if keep else self.first,
                f"{self.names[keep]}: {fb * 1e3:.3g} ms a step ({self.names[1]}) against "
                f"{fa * 1e3:.3g} ms ({self.names[0]})",
            )

    def _choose(self, fn, verdict: str) -> None:
        self.chosen, self.verdict, self.build = fn, verdict, None
        if fn is not self.second:
            self.second = None  # a program not kept is not held either
        logger.info("fit: the train step's program: %s", verdict)


def _signature(args):
    return jax.tree.structure(args), tuple(getattr(a, "shape", None) for a in jax.tree.leaves(args))
