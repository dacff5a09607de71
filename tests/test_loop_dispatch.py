"""How fit dispatches and compiles its steps: for a step with a convolution on CPU no
device loop (XLA:CPU runs convolutions far slower inside one) and funcnet's compiler
options (convolutions on XLA's multi-threaded kernels); otherwise a loop and plain
``jax.jit``; the programs are exactly a hand-written loop's with the same options."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import data, xla
from funcnet.layers import Conv, ConvTranspose, Dense, Flatten, Relu
from funcnet.loop import _fit as loop
from funcnet.train import Aux, TrainState, make_train_step
from funcnet.loop import FitOptions

CPU = jax.default_backend() == "cpu"


def _setup(net, in_shape):
    opt = optax.sgd(0.05, momentum=0.9)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, *in_shape))

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, *in_shape)).astype(np.float32)
    return ts, loss_fn, opt, x


CNN = (funcnet.serial(Conv(3, (3, 3), padding="SAME"), Relu, Flatten, Dense(2)), (6, 6, 1))
MLP = (funcnet.serial(Flatten, Dense(8), Relu, Dense(2)), (6, 6, 1))
DECONV = (funcnet.serial(ConvTranspose(2, (2, 2)), Flatten, Dense(2)), (3, 3, 1))


def _steps_per_dispatch(monkeypatch, net_shape, steps_per_dispatch=None, **fit_kwargs):
    """The steps per dispatch fit chose (what it passed to its compile)."""
    seen = []
    compile_ = loop._compile

    def spy(*args, **kwargs):
        seen.append(args[6])  # steps_per_dispatch
        return compile_(*args, **kwargs)

    monkeypatch.setattr(loop, "_compile", spy)
    ts, loss_fn, opt, x = _setup(*net_shape)
    y = np.zeros((len(x), 2), np.float32)
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        fit_kwargs.pop("train_data", data.DeviceData((x, y), 8)),
        progress=False,
        options=FitOptions(log_every=4, steps_per_dispatch=steps_per_dispatch),
        **fit_kwargs,
    )
    return seen[0]


@pytest.mark.parametrize(
    "net_shape,looped", [(CNN, not CPU), (DECONV, not CPU), (MLP, True)], ids=["conv", "conv-transpose", "mlp"]
)
def test_default_loops_on_the_device_except_convolutions_on_cpu(monkeypatch, net_shape, looped):
    assert _steps_per_dispatch(monkeypatch, net_shape) == (4 if looped else 1)
    # the host pipeline's stacked batches follow the same rule
    x = np.zeros((32, *net_shape[1]), np.float32)
    batches = lambda e: data.batches((x, np.zeros((32, 2), np.float32)), 8)  # noqa: E731
    assert _steps_per_dispatch(monkeypatch, net_shape, train_data=batches) == (4 if looped else 1)
    # asked for, the loop runs whatever the step holds
    assert _steps_per_dispatch(monkeypatch, net_shape, steps_per_dispatch=2) == 2


def test_convolution_rule_reads_the_step_and_counts_what_it_cannot_trace_as_without():
    ts, loss_fn, _, x = _setup(*CNN)
    batch = (x[:8], np.zeros((8, 2), np.float32))
    assert loop._convolves_on_cpu(ts, loss_fn, [batch]) == CPU
    assert not loop._convolves_on_cpu(ts, loss_fn, iter([batch]))  # read-once data: not traced

    def needs_pmap(params, state, batch, rng):  # untraceable outside its step
        return jax.lax.pmean(loss_fn(params, state, batch, rng)[0], "batch"), Aux()

    assert not loop._convolves_on_cpu(ts, needs_pmap, [batch])
    ts, loss_fn, _, x = _setup(*MLP)
    assert not loop._convolves_on_cpu(ts, loss_fn, [batch])


@pytest.mark.parametrize("net_shape", [CNN, MLP], ids=["cnn", "mlp"])
@pytest.mark.parametrize("options", ["auto", None, "funcnet"])
def test_fit_steps_are_the_hand_written_loops_programs(options, net_shape):
    """fit (one step per dispatch, host batches) ends where a hand-written loop over the
    same step does, bit for bit: by default (``"auto"``) a loop over ``funcnet.xla.jit``
    for the CNN on CPU and over ``jax.jit`` otherwise; with ``compiler_options=None``
    over ``jax.jit``; with options given, over ``funcnet.xla.jit`` with those."""
    ts, loss_fn, opt, x = _setup(*net_shape)
    y = np.random.default_rng(1).standard_normal((len(x), 2)).astype(np.float32)
    batches = lambda e: data.batches((x, y), 8, shuffle=True, rng=0, epoch=e)  # noqa: E731
    fit_opts = xla.compiler_options() if options == "funcnet" else options
    fitted, _ = funcnet.fit(
        ts,
        loss_fn,
        opt,
        batches,
        epochs=2,
        progress=False,
        options=FitOptions(steps_per_dispatch=1, compiler_options=fit_opts),
    )
    hand_opts = {
        None: {},
        "funcnet": xla.compiler_options(),
        "auto": xla.compiler_options() if net_shape is CNN and CPU else {},
    }[options]
    step = xla.jit(make_train_step(loss_fn, opt), options=hand_opts)
    hand = ts
    for epoch in range(2):
        for b in batches(epoch):
            hand = step(hand, b)[0]
    for a, b in zip(jax.tree.leaves(fitted.params), jax.tree.leaves(hand.params)):
        np.testing.assert_array_equal(a, b)
    if net_shape is CNN and CPU and options != "funcnet":  # the options change the CNN's rounding
        other = xla.jit(make_train_step(loss_fn, opt), options={} if hand_opts else None)
        hand = ts
        for epoch in range(2):
            for b in batches(epoch):
                hand = other(hand, b)[0]
        assert any(np.any(p != q) for p, q in zip(jax.tree.leaves(fitted.params), jax.tree.leaves(hand.params)))


def test_fit_traces_layers_for_the_options_it_compiles_with():
    """Conv's "auto" kernels follow fit's compiler options: XLA's one convolution under
    funcnet's CPU option (fit's default for this CNN on CPU), the plain program's
    otherwise; an unrelated option does not switch them."""
    net, shape = CNN
    seen = []

    def loss_fn(params, state, batch, rng):
        seen.append(xla.traced_with_options())
        out, state = net.apply(params, state, batch)
        return jnp.mean(out**2), Aux(state=state)

    ts = TrainState.create(net, optax.sgd(0.1), jax.random.key(0), (-1, *shape))
    x = np.ones((16, *shape), np.float32)
    for options, inside in [
        ("auto", CPU),
        (None, False),
        (xla.compiler_options(), CPU),
        ({"xla_embed_ir_in_executable": True}, False),
    ]:
        seen.clear()
        funcnet.fit(
            ts,
            loss_fn,
            optax.sgd(0.1),
            data.DeviceData(x, 8),
            progress=False,
            options=FitOptions(compiler_options=options),
        )
        assert seen and any(seen) == inside, (options, seen)


def test_compiler_options_must_be_auto_a_dict_or_none():
    ts, loss_fn, opt, x = _setup(*MLP)
    with pytest.raises(TypeError, match=r"compiler_options must be 'auto', a dict .* got str 'fast'"):
        funcnet.fit(
            ts, loss_fn, opt, [(x, x[:, :2, 0, 0])], progress=False, options=FitOptions(compiler_options="fast")
        )


@pytest.mark.parametrize(
    "source,steps_per_dispatch",
    [("device", 4), ("device", 1), ("host", 4)],
    ids=["device-loop", "device-one-per-dispatch", "host-loop"],
)
def test_fit_traces_the_train_step_once(source, steps_per_dispatch):
    """The step is traced once for its program: the loop over several steps takes the
    shapes of its metrics from the same trace as its body (tracing a big model's step
    again was a second or more of fit's start). Counted on the optimizer's update, which
    only the train step calls; 32 examples in batches of 8, so there is no last, smaller
    batch with a program of its own."""
    ts, loss_fn, opt, x = _setup(*MLP)
    traced = []

    def update(grads, opt_state, params=None):
        traced.append(1)
        return opt.update(grads, opt_state, params)

    counted = optax.GradientTransformation(opt.init, update)
    y = np.zeros((len(x), 2), np.float32)
    train_data = (
        data.DeviceData((x, y), 8, shuffle=True, rng=0)
        if source == "device"
        else (lambda e: data.batches((x, y), 8, shuffle=True, rng=0, epoch=e))
    )
    funcnet.fit(
        ts,
        loss_fn,
        counted,
        train_data,
        epochs=2,
        progress=False,
        options=FitOptions(log_every=4, steps_per_dispatch=steps_per_dispatch),
    )
    assert len(traced) == 1, f"the train step was traced {len(traced)} times"


def test_dispatch_length_doubles_within_its_bound_time_and_every_steps():
    from funcnet.loop._epoch import DISPATCH_S, _grown

    assert _grown(4, 64, [], None) == 4  # nothing measured yet
    assert _grown(4, 64, [], 1e-9) == 64  # never past the bound
    step = DISPATCH_S / 20  # 16 steps fit in DISPATCH_S, 32 do not
    assert _grown(4, 64, [], step) == 16
    assert _grown(4, 64, [24], step) == 8  # 16 does not divide 24: a checkpoint would fall inside
    assert _grown(4, 64, [], DISPATCH_S) == 4  # long steps: never below k
    assert _grown(4, 4, [], 1e-9) == 4  # an explicit steps_per_dispatch has bound k


def test_only_the_default_in_one_process_may_grow(monkeypatch):
    assert loop._dispatch_bound(None, 50) == 800
    assert loop._dispatch_bound(50, 50) == 50  # asked for: kept
    assert loop._dispatch_bound(None, 1) == 1  # one step per dispatch has no loop to grow
    # processes that each timed their own steps would cut epochs apart, and their
    # collectives would no longer pair up
    monkeypatch.setattr(loop.jax, "process_count", lambda: 2)
    assert loop._dispatch_bound(None, 50) == 50


class _Ends(funcnet.callbacks.Callback):
    """The global step after each dispatch (fit calls on_step_end once per dispatch)."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, ctx, step):
        self.steps.append(step)

    every_steps = None  # not a per-step callback: fit still runs several steps per dispatch


def _dispatch_lengths(ends, per_epoch):
    lengths, prev = [], 0
    for step in ends:
        lengths.append((prev // per_epoch, step - prev))
        prev = step
    return lengths


@pytest.mark.parametrize("seconds,grown", [(1e9, 64), (0.0, 4)], ids=["short-steps", "long-steps"])
def test_short_steps_run_longer_dispatches_from_the_second_epoch_with_the_same_bits(monkeypatch, seconds, grown):
    """fit's default over a DeviceData: log_every steps per dispatch in the first epoch,
    then as long as DISPATCH_S allows (set here to always or never), up to 16x; the
    params are those of one step per dispatch, bit for bit."""
    from funcnet.loop import _epoch

    monkeypatch.setattr(_epoch, "DISPATCH_S", seconds)
    ts, loss_fn, opt, _ = _setup(*MLP)
    rng = np.random.default_rng(2)
    x = (0.3 * rng.standard_normal((512, 6, 6, 1))).astype(np.float32)
    y = (0.3 * rng.standard_normal((512, 2))).astype(np.float32)
    source = data.DeviceData((x, y), 4, shuffle=True, rng=0)  # 128 steps an epoch
    ends = _Ends()
    fitted, _ = funcnet.fit(
        ts, loss_fn, opt, source, epochs=3, progress=False, callbacks=[ends], options=FitOptions(log_every=4)
    )
    lengths = _dispatch_lengths(ends.steps, 128)
    assert {n for e, n in lengths if e == 0} == {4}
    assert {n for e, n in lengths if e > 0} == {grown}
    one, _ = funcnet.fit(ts, loss_fn, opt, source, epochs=3, progress=False, options=FitOptions(steps_per_dispatch=1))
    for a, b in zip(jax.tree.leaves(fitted.params), jax.tree.leaves(one.params)):
        np.testing.assert_array_equal(a, b)


def test_grown_dispatches_still_end_at_every_checkpoint_and_not_when_k_is_given(monkeypatch, tmp_path):
    from funcnet.loop import _epoch

    monkeypatch.setattr(_epoch, "DISPATCH_S", 1e9)
    ts, loss_fn, opt, _ = _setup(*MLP)
    x = (0.3 * np.random.default_rng(3).standard_normal((256, 6, 6, 1))).astype(np.float32)
    source = data.DeviceData((x, np.zeros((256, 2), np.float32)), 4)  # 64 steps an epoch
    ends = _Ends()
    saves = funcnet.callbacks.Checkpoint(str(tmp_path / "ckpt"), every_steps=24, every_epochs=None, keep=10)
    funcnet.fit(
        ts, loss_fn, opt, source, epochs=3, progress=False, callbacks=[ends, saves], options=FitOptions(log_every=4)
    )
    lengths = _dispatch_lengths(ends.steps, 64)
    assert {n for e, n in lengths if e == 0} == {4} and max(n for _, n in lengths) == 8  # 8 divides 24
    assert set(range(24, 3 * 64, 24)) <= set(ends.steps)
    ends = _Ends()
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        source,
        epochs=3,
        progress=False,
        callbacks=[ends],
        options=FitOptions(log_every=4, steps_per_dispatch=4),
    )
    assert {n for _, n in _dispatch_lengths(ends.steps, 64)} == {4}


def _transfers(monkeypatch, run):
    """``run()``'s result and the device arrays it read back through ``jax.device_get``."""
    leaves = []
    device_get = jax.device_get

    def counting(tree):
        leaves.extend(a for a in jax.tree.leaves(tree) if isinstance(a, jax.Array))
        return device_get(tree)

    monkeypatch.setattr(jax, "device_get", counting)
    try:
        return run(), leaves
    finally:
        monkeypatch.setattr(jax, "device_get", device_get)


def test_one_step_per_dispatch_reads_its_metrics_back_in_a_few_transfers(monkeypatch):
    """With one step per dispatch over a DeviceData (fit's default for a convolution on
    CPU), each step's metrics stay the step's own scalars and the epoch's end reads them
    back stacked, a transfer per group of steps: one array per metric and step, each read
    on its own, was ~40 us of host time a step on CPU while the device waited. The
    metrics are the same as a loop's on the device."""
    ts, loss_fn, opt, x = _setup(*MLP)
    x = np.concatenate([x] * 5)  # 160 rows: 80 steps of 2
    y = np.zeros((len(x), 2), np.float32)
    logs = {}
    for k in (1, 4):
        (_, logs[k]), leaves = _transfers(
            monkeypatch,
            lambda: funcnet.fit(
                jax.tree.map(jnp.copy, ts),
                loss_fn,
                opt,
                data.DeviceData((x, y), 2, shuffle=True, rng=0),
                progress=False,
                options=FitOptions(log_every=4, steps_per_dispatch=k),
            ),
        )
        if k == 1:
            assert 0 < len(leaves) <= 8, len(leaves)  # 80 steps, 1 metric: 2 groups of 64
    assert [h["loss"] for h in logs[1]] == [h["loss"] for h in logs[4]]


@pytest.mark.devices(4)
def test_a_mesh_reads_its_step_metrics_back_in_a_few_transfers(monkeypatch):
    """On a mesh a host pipeline's steps (one per dispatch) return global arrays, which
    the epoch's end reads back stacked as on one device: a transfer per group of steps,
    not one per metric and step (~9 us of host time each on a 4-device CPU mesh). The
    epoch's metrics are those of reading every step on its own, and of one device."""
    from funcnet import distributed
    from funcnet.loop import _placement

    ts, loss_fn, opt, x = _setup(*MLP)
    x = np.concatenate([x] * 10)  # 320 rows: 80 steps of 4, one row per device
    y = np.zeros((len(x), 2), np.float32)

    def run(**where):
        return funcnet.fit(
            jax.tree.map(jnp.copy, ts),
            loss_fn,
            opt,
            lambda epoch: data.batches((x, y), 4, shuffle=True, rng=0, epoch=epoch),
            epochs=2,
            progress=False,
            options=FitOptions(log_every=4),
            **where,
        )[1]

    mesh = distributed.data_mesh(4)
    stacked, leaves = _transfers(monkeypatch, lambda: run(mesh=mesh))
    assert 0 < len(leaves) <= 2 * 4, len(leaves)  # 2 epochs of 80 steps, 1 metric
    with monkeypatch.context() as m:
        m.setattr(_placement._OnMesh, "fetched", lambda self, steps: _placement.StepRows.of(jax.device_get(steps)))
        apart, leaves = _transfers(monkeypatch, lambda: run(mesh=mesh))
    assert len(leaves) >= 2 * 80
    assert [h["loss"] for h in stacked] == [h["loss"] for h in apart]
    np.testing.assert_allclose([h["loss"] for h in stacked], [h["loss"] for h in run()], rtol=1e-5)


def test_a_checkpoint_mid_epoch_reads_the_steps_since_the_last_in_a_few_transfers(monkeypatch):
    """What a checkpoint mid-epoch stores of the epoch's metrics (the steps since the
    previous one) is read as the epoch's end reads them: stacked, a transfer per group
    of steps, the same values as reading each step alone."""
    import types

    from funcnet.loop import _epoch, _placement

    record = _epoch._StepRecord(types.SimpleNamespace(loop=_placement._OneDevice()))
    for i in range(70):
        record.add_step({"loss": jnp.float32(i), "acc": jnp.float32(-i)}, i + 1)
    (rows, end), leaves = _transfers(monkeypatch, lambda: record.fetch(5))
    assert end == 70 and len(rows) == 65
    assert 0 < len(leaves) <= 4, len(leaves)  # 65 steps, 2 metrics: 2 groups of 64, an array per metric
    alone = _placement.StepRows.of(jax.device_get(record.entries[5:]))
    for key in ("loss", "acc"):
        np.testing.assert_array_equal(rows.column(key), alone.column(key))
    np.testing.assert_array_equal(rows.column("loss")[:, 0], np.arange(5, 70, dtype=np.float32))


def test_the_next_epochs_order_is_placed_while_this_epochs_steps_run_and_none_past_the_last(monkeypatch):
    """Over a DeviceData fit computes and places epoch e + 1's order once epoch e's
    dispatches are queued, before it waits for their metrics (host work the device would
    otherwise idle through between epochs), and uses that order: the same batches as
    the host iterating the same DeviceData (epoch -> its batches), bit for bit. No order
    is drawn for an epoch that never runs."""
    asked = []
    order = data.DeviceData.order

    def recorded(self, epoch):
        asked.append(epoch)
        return order(self, epoch)

    monkeypatch.setattr(data.DeviceData, "order", recorded)
    seen_at_end = []

    class AtEnd(funcnet.callbacks.Callback):
        def on_epoch_end(self, ctx, epoch, logs):
            seen_at_end.append((epoch, sorted(set(asked))))

    ts, loss_fn, opt, _ = _setup(*MLP)
    rng = np.random.default_rng(4)
    x = (0.3 * rng.standard_normal((66, 6, 6, 1))).astype(np.float32)
    y = (0.3 * rng.standard_normal((66, 2))).astype(np.float32)
    source = data.DeviceData((x, y), 4, shuffle=True, rng=0)  # 16 steps and a batch of 2
    fitted, _ = funcnet.fit(ts, loss_fn, opt, source, epochs=3, progress=False, callbacks=[AtEnd()])
    assert [s for e, s in seen_at_end] == [[0, 1], [0, 1, 2], [0, 1, 2]]
    assert set(asked) == {0, 1, 2}  # steps_per_epoch asks for epoch 0's too
    monkeypatch.setattr(data.DeviceData, "order", order)
    hosted, _ = funcnet.fit(ts, loss_fn, opt, lambda epoch: source(epoch), epochs=3, progress=False)
    for a, b in zip(jax.tree.leaves(fitted.params), jax.tree.leaves(hosted.params)):
        np.testing.assert_array_equal(a, b)
