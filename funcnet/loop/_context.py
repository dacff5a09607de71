"""What callbacks see of a run (:class:`FitContext`) and what only the loop keeps (``_Run``).

The two are apart so that a callback can read and set only the public surface: the
loop's scratchpad (the latest metrics on the device, the data layout a checkpoint
records, the resumed checkpoint's extras, the epoch's metric sums) lives in the run
record, which the context holds a reference to but does not show.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax

from funcnet.loop._resume import EpochSums
from funcnet.train import TrainState

__all__ = ["FitContext"]


class _Run:
    """The loop's private record of one ``fit`` run, next to its :class:`FitContext`.

    Attributes:
      loop: the placement holding the train state (``_placement._OneDevice`` or a subclass).
      ctx: the run's :class:`FitContext`.
      last: the latest dispatch's metrics on the device, and the row to read (None: the
        metrics are one step's; ``(metrics, None)`` under pmap is one row per replica).
      data_layout: what the position counts in (``_resume.data_layout``).
      resumed: what ``resume_from``'s checkpoint holds beside the state, if any.
      float16: ``() -> bool``, whether the loss computes in float16, asked only once a
        loss is non-finite (a trace, no device work); ``batch_spec`` the shapes it traces with
        (the data source's ``batch_spec``, else the first batch's, recorded by the source).
      optimizer_note: ``step -> str``, what the non-finite-loss message adds when the
        optimizer (a NaN learning rate) is the cause (``_checks.optimizer_note``); asked once.
      carried: the resumed run's part of the current epoch's metric sums
        (:class:`funcnet.loop._resume.EpochSums`; None in other epochs).
      epoch_fetch: the epoch loop's fetch of its steps' metrics from an entry (a step, or a
        dispatch) on, ``fetch(start) -> (host dicts, end)`` (``_epoch._StepRecord.fetch``).
      epoch_folded: how far checkpoints have folded the epoch's metrics in,
        ``(entries, steps, sums)``, so each save fetches only the steps since the last one.
      step_s: seconds per step over the last epoch's dispatches after its first (None
        before one ended), from which the next epoch's dispatch length is chosen
        (``_epoch._grown``).
    """

    def __init__(self, loop):
        self.loop = loop
        self.ctx = FitContext(self)
        self.last = None
        self.data_layout: dict = {}
        self.resumed = None
        self.float16: Callable[[], bool] = lambda: False
        self.batch_spec = None
        self.optimizer_note: Callable[[int], str] = lambda step: ""
        self.carried: Optional[EpochSums] = None
        self.epoch_fetch: Callable = lambda start: ([], 0)
        self.epoch_folded: tuple = (0, 0, None)
        self.step_s: Optional[float] = None


class FitContext:
    """What callbacks see: the loop's position and a way to stop it.

    ``train_state`` is the current state on the host's default device (replicas
    are collapsed to one); reading it forces the pending steps to finish.

    Attributes:
      epoch: the epoch being trained (0-based); during ``on_epoch_end``, the next one,
        where a checkpoint taken then resumes (the hook's ``epoch`` argument is the
        epoch that ended).
      batch_in_epoch: batches of the current epoch trained on so far.
      step: global steps taken so far (counted on the host; ``host_step`` too).
      history: the epoch logs so far.
      stop_training: set it to True to end the run after the current epoch.
      run_id: the id :class:`funcnet.callbacks.Checkpoint` saves under.
      loss_was_nonfinite: True once fit has seen a NaN/inf loss.
      planned_steps: the run's last global step, when known.

    Examples:
      >>> from funcnet import fit
      >>> from funcnet.callbacks import Callback
      >>> from funcnet.layers import Dense
      >>> net, opt = Dense(1), optax.sgd(0.1)
      >>> def loss_fn(params, state, x, rng):
      ...     return jnp.mean(net.apply(params, state, x)[0] ** 2), funcnet.Aux(state=state)
      >>> ts = TrainState.create(net, opt, jax.random.key(0), (-1, 2))
      >>> class StopAfterOne(Callback):
      ...     log_keys = ()
      ...     def on_epoch_end(self, ctx, epoch, logs):
      ...         print(epoch, ctx.epoch, ctx.step, sorted(ctx.step_metrics))
      ...         ctx.stop_training = True
      >>> data = [np.ones((4, 2), np.float32)] * 3
      >>> _, history = fit(ts, loss_fn, opt, data, epochs=5, callbacks=[StopAfterOne()],
      ...                  progress=False)
      0 1 3 ['loss']
      >>> len(history)
      1
    """

    def __init__(self, run: _Run):
        self._run = run  # the loop's record of this run; nothing a callback reads
        self.stop_training = False
        self.epoch = 0
        self.batch_in_epoch = 0
        self.history: list = []
        self.host_step = 0  # steps taken, counted on the host (reading the device would sync)
        self.run_id: Optional[str] = None  # what Checkpoint saves under (see funcnet.checkpoint.save)
        self.loss_was_nonfinite = False  # set once fit has seen a NaN/inf loss
        self.planned_steps: Optional[int] = None  # the run's last global step, when known
        # fit sets it: train_state -> the checkpoint entries beside the train state and
        # position (the data layout, the callbacks' states) that Checkpoint saves.
        self.checkpoint_extras: Optional[Callable] = None

    def wait(self) -> None:
        """Blocks until every step dispatched so far has finished on the device."""
        jax.block_until_ready(self._run.loop.state)

    @property
    def step_metrics(self) -> dict:
        """The latest step's metrics as Python floats (``loss``, ``grad_norm``, ...);
        reading them waits for that step. ``{}`` before the first step."""
        if self._run.last is None:
            return {}
        metrics, row = self._run.last
        host = jax.device_get(metrics)
        if row is not None:
            host = {k: v[row] for k, v in host.items()}
        else:
            host = self._run.loop.first(host)  # pmap: one replica's value
        return {k: float(v) for k, v in host.items()}

    @property
    def train_state(self) -> TrainState:
        return self._run.loop.host_state()

    def replace_train_state(self, train_state: TrainState) -> None:
        """Continues (or ends) the run from ``train_state`` instead, placed as the
        loop's own state is (e.g. ``EarlyStopping(restore_best=True)`` at the end)."""
        self._run.loop.replace(train_state)

    @property
    def step(self) -> int:
        return self.host_step
