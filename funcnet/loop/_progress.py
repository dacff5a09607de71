"""What ``fit`` shows of each epoch: the tqdm bar while it trains and the summary line after.

``fit(progress=...)`` and ``FitOptions.print_fn`` decide; the epoch loop only moves the bar.
"""

from __future__ import annotations

import math
import sys

__all__: list = []


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class _Shown:
    """What fit shows of each epoch (``fit``'s ``progress`` and ``print_fn``): a tqdm
    bar while it trains, left in place when it ends, and one summary line after it."""

    def __init__(self, progress, print_fn, epochs: int):
        self.epochs, self.print_fn = epochs, print_fn
        self.line = progress is not False
        self.tqdm = _tqdm(progress)
        self.open = None

    def bar(self, epoch: int):
        if self.tqdm is not None:
            self.open = self.tqdm(desc=f"epoch {epoch + 1}/{self.epochs}", unit="step", leave=True, dynamic_ncols=True)
        return self.open

    def close(self, bar, steps: int) -> None:
        """Closes an epoch's bar at the epoch's step count: the runners move it every
        ``log_every`` steps only, so the last ones would be missing from the bar left."""
        if bar is not None:
            bar.update(max(steps - bar.n, 0))
        self.abandon()

    def abandon(self) -> None:
        """Closes the bar where it stands (fit failed mid-epoch): one left open would push
        every later bar of the process a line down (tqdm's ``position``)."""
        if self.open is not None:
            self.open.close()
            self.open = None

    def summary(self, epoch: int, steps: int, logs: dict) -> None:
        if self.print_fn is not None:  # the caller's line, in the caller's format
            self.print_fn(" ".join(f"{k}={_fmt(v)}" for k, v in logs.items()))
        elif self.line and sys.stderr is not None:  # None: pythonw, no console at all
            print(_summary_line(epoch, self.epochs, steps, logs), file=sys.stderr, flush=True)


_NOT_IN_LINE = ("epoch", "samples_per_s", "seconds")


def _summary_line(epoch: int, epochs: int, steps: int, logs: dict) -> str:
    """``epoch 2/5: 8 steps, 0.41 s, loss=0.3125 acc=0.91 eval_acc=0.89``: the epoch's
    logs in their order (the step's metrics, ``eval_*``, then what callbacks added),
    as Keras's ``fit`` prints one line per epoch when its output is not a terminal."""
    values = " ".join(f"{k}={_fmt(v)}" for k, v in logs.items() if k not in _NOT_IN_LINE)
    return (
        f"epoch {epoch + 1}/{epochs}: {steps} step{'s' * (steps != 1)}, {logs.get('seconds', math.nan):.2f} s, {values}"
    )


def _tqdm(progress):
    """tqdm's bar class (``tqdm.auto``: a widget in a notebook) when fit draws a bar:
    tqdm installed, and ``progress=True`` or (None) output where a bar redraws."""
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if progress:
            print(
                "fit: progress=True but tqdm is not installed (pip install tqdm); showing "
                "one summary line per epoch without a progress bar.",
                file=sys.stderr,
            )
        return None
    return tqdm if progress or _interactive() else None


def _interactive() -> bool:
    """Whether a bar can redraw in place: stderr is a terminal, or fit runs in a Jupyter
    kernel, whose stderr is a pipe but where ``tqdm.auto`` draws a widget (tqdm's own
    test, in ``tqdm.autonotebook``). In a log file a bar is a line per refresh."""
    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and isatty():
        return True
    ipython = sys.modules.get("IPython")  # a kernel has imported it; fit never does
    shell = getattr(ipython, "get_ipython", lambda: None)()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
