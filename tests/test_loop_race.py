"""fit's race between XLA:CPU's loop fusions split over the cores and unsplit
(``funcnet.loop._race.Raced``, ``funcnet.xla.unsplit_fusions``): which program each
call runs, when it races at all, and that fit computes the same bits whichever wins."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import data, xla
from funcnet.layers import Dense, Relu
from funcnet.loop import FitOptions
from funcnet.loop import _placement, _race
from funcnet.train import Aux, TrainState

CPU = jax.default_backend() == "cpu"


class _Clock:
    """A clock the fake programs advance by what each call costs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _programs(clock, costs):
    """Two fake dispatch programs: ``costs[name] = (seconds to compile it, then per
    step)``; each records its calls and returns its argument tagged with its name. The
    first is compiled by the prospect, the second when it is built."""
    calls = []

    def program(name):
        def run(x, n):
            clock.now += costs[name][1] * n
            calls.append((name, n))
            return (name, x)

        return run

    first, second = program("split"), program("unsplit")

    def prospect(args):
        clock.now += costs["split"][0]

        def build():
            clock.now += costs["unsplit"][0]
            return second

        return build, None

    return first, prospect, calls


def _raced(costs, steps_left=10_000):
    clock = _Clock()
    first, prospect, calls = _programs(clock, costs)
    raced = _race.Raced(first, prospect, lambda args: args[1], steps_left, names=("split", "unsplit"), clock=clock)
    return raced, calls


def test_races_both_in_turns_then_keeps_the_faster():
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, 0.006)})
    calls_made = 2 + 2 * _race.TIMED + 2
    outs = [raced(i, 50) for i in range(calls_made)]
    order = [name for name, _ in calls]
    # split compiles and runs, unsplit the same, then turns until each has TIMED timed calls
    assert order[: 2 + 2 * _race.TIMED] == ["split", "split", "unsplit", "unsplit"] + ["split", "unsplit"] * (
        _race.TIMED - 1
    )
    assert order[2 + 2 * _race.TIMED :] == ["unsplit"] * (calls_made - 2 - 2 * _race.TIMED)
    assert [x for _, x in outs] == list(range(calls_made))  # every call's result passed through
    assert raced.verdict == "unsplit: 6 ms a step (unsplit) against 10 ms (split)"


@pytest.mark.parametrize(
    "unsplit_per_step,kept", [(0.0099, "split"), (0.012, "split"), (0.0096, "unsplit")], ids=["tie", "slower", "faster"]
)
def test_keeps_xlas_default_unless_the_other_is_clearly_faster(unsplit_per_step, kept):
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, unsplit_per_step)})
    for i in range(2 + 2 * _race.TIMED + 4):
        raced(i, 50)
    assert calls[-1][0] == kept and raced.verdict.startswith(kept)


def test_a_run_too_short_to_repay_a_second_compilation_never_builds_it():
    # 1 s to compile, 10 ms a step: PAYS x 1 s of steps must be left after the second call
    needed = int(_race.PAYS * 1.0 / 0.010)
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, 0.005)}, steps_left=needed + 50)
    for i in range(10):
        raced(i, 50)
    assert {name for name, _ in calls} == {"split"}
    assert raced.verdict == (
        f"not raced: {needed - 50} steps left at 10 ms would not repay a second compilation (~1 s)"
    )
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, 0.005)}, steps_left=needed + 150)
    for i in range(10):
        raced(i, 50)
    assert "unsplit" in {name for name, _ in calls}


def test_steps_left_unknown_means_no_race_and_other_shapes_go_to_the_default():
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, 0.001)}, steps_left=None)
    raced(0, 50)  # nothing asked: not even the prospect
    assert calls == [("split", 50)] and raced.verdict == "not raced: the steps left are not known"
    raced, calls = _raced({"split": (1.0, 0.010), "unsplit": (1.0, 0.001)})
    raced(jnp.zeros(3), 50)
    raced(jnp.zeros(4), 50)  # another program (an odd batch): the default, untimed
    assert [name for name, _ in calls] == ["split", "split"] and len(raced.calls["first"]) == 1
    raced = _race.Raced(lambda x: x + 1, lambda args: (None, "no gain"), lambda args: 1, 10_000)
    assert raced(1) == 2 and raced(2) == 3 and raced.verdict == "not raced: no gain"


def _mlp(rows=256):
    net = funcnet.serial(Dense(16), Relu, Dense(2))
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 8))

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0])
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    return ts, loss_fn, opt, (x, rng.standard_normal((rows, 2)).astype(np.float32))


def _fit_recording(monkeypatch, compiler_options="auto", margin=None, **kw):
    """fit on the MLP, racing from the start (``PAYS`` 0), with every ``Raced`` kept."""
    made = []

    class Recorded(_race.Raced):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(_placement, "Raced", Recorded)
    monkeypatch.setattr(_race, "PAYS", 0)
    if margin is not None:
        monkeypatch.setattr(_race, "MARGIN", margin)
    # 40,000 rows: XLA:CPU's cost model counts the batch gather's whole operand, and splits it
    ts, loss_fn, opt, arrays = _mlp(40_000)
    fitted, _ = funcnet.fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData(arrays, 1000, shuffle=True, rng=0),
        epochs=2,
        progress=False,
        options=FitOptions(steps_per_dispatch=2, compiler_options=compiler_options, **kw),
    )
    return fitted, made


@pytest.mark.skipif(not CPU, reason="fit races only on CPU")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="XLA:CPU splits fusions over 2 or more CPUs only")
@pytest.mark.parametrize("margin,winner", [(float("inf"), "unsplit"), (0.0, "split")])
def test_fit_trains_to_the_same_bits_whichever_program_wins(monkeypatch, caplog, margin, winner):
    """The race's programs are XLA's default and the same step with the loop fusions
    unsplit; fit's result is the unraced run's bit for bit whichever it keeps."""
    with caplog.at_level(logging.INFO, logger="funcnet.loop"):
        raced_fit, made = _fit_recording(monkeypatch, margin=margin)
    (raced,) = made  # the device loop's program: the only one fit races here
    assert all(len(c) == _race.TIMED + 1 for c in raced.calls.values())
    assert raced.verdict.startswith(winner) and f"train step's program: {winner}" in caplog.text
    plain, none = _fit_recording(monkeypatch, compiler_options={})
    assert none == []  # options given: no race
    for a, b in zip(jax.tree.leaves(raced_fit.params), jax.tree.leaves(plain.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not CPU, reason="fit races only on CPU")
def test_fit_does_not_race_given_options_or_a_host_pipeline_of_unknown_length(monkeypatch):
    for options in (None, {}, xla.compiler_options()):
        assert _fit_recording(monkeypatch, compiler_options=options)[1] == []
    made = []
    monkeypatch.setattr(_placement, "Raced", lambda *a, **k: made.append(a) or a[0])
    ts, loss_fn, opt, (x, y) = _mlp()
    funcnet.fit(ts, loss_fn, opt, [(x[:8], y[:8])], epochs=2, progress=False)
    assert made == []


@pytest.mark.skipif(not CPU, reason="XLA:CPU's pass")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="XLA:CPU splits fusions over 2 or more CPUs only")
def test_fit_races_only_programs_whose_split_fusions_are_all_small():
    unsplit = xla.unsplit_fusions()
    double = jax.jit(lambda x: x * 2 + 1)
    build, why_not = _placement._unsplit_prospect(double, unsplit, (jnp.ones((4, 4)),))
    assert build is None and why_not == "XLA:CPU splits none of its loop fusions"
    build, why_not = _placement._unsplit_prospect(double, unsplit, (jnp.ones((1024, 1024)),))
    assert build is None and "splits a loop fusion of 4,194,304 bytes" in why_not
    # a shuffled batch's gather from 40,000 rows: split for the operand it counts, 32 KB out
    rows, idx = jnp.ones((40_000, 256)), jnp.arange(32)
    gather = jax.jit(lambda x, i: x[i] * 2)
    build, why_not = _placement._unsplit_prospect(gather, unsplit, (rows, idx))
    assert why_not is None and xla.split_fusions(build()) == {}
    np.testing.assert_array_equal(build()(rows, idx), gather(rows, idx))
