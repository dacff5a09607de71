"""funcnet.xla: the compiler options funcnet compiles its steps with, the jit that applies
them, and what layers choose under it (Conv: one XLA convolution on CPU)."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet
from funcnet import data, xla
from funcnet.layers import Conv, Dense, Flatten
from funcnet.train import Aux, TrainState
from funcnet.loop import FitOptions

# This file also checks fit(devices=N), the deprecated pmap placement, which still works.
pytestmark = pytest.mark.filterwarnings(r"ignore:fit\(devices=:DeprecationWarning")

CPU = jax.default_backend() == "cpu"
needs_cpu = pytest.mark.skipif(not CPU, reason="the options are CPU options")


@needs_cpu
def test_cpu_options_keep_convolutions_off_ynnpack_and_yield_to_xla_flags(monkeypatch):
    opts = xla.compiler_options()
    assert opts == {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"
    }
    opts["changed"] = 1
    assert "changed" not in xla.compiler_options()  # a new dict each time
    assert xla.compiler_options("gpu") == {} and xla.compiler_options("tpu") == {}

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    args = (jnp.ones((8, 12, 12, 32)), jnp.ones((5, 5, 32, 64)))
    plain = jax.jit(conv).lower(*args).compile().as_text()
    tuned = jax.jit(conv, compiler_options=xla.compiler_options()).lower(*args).compile().as_text()
    # jaxlib 0.10 sends this convolution to YNNPACK (one thread); the options keep it XLA's
    assert "__ynn_fusion" in plain and "__ynn_fusion" not in tuned
    # ... while reductions (BatchNorm's statistics) stay on YNNPACK: without REDUCE in the
    # option XLA's own loops took them, 7-12x slower (benchmarks/ynn_probe.py)
    stats = lambda x: jnp.sum(x, axis=(0, 1, 2))  # noqa: E731
    for options in ({}, xla.compiler_options()):
        compiled = jax.jit(stats, compiler_options=options).lower(args[0]).compile()
        assert "__ynn_fusion" in compiled.as_text(), options
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type=")
    assert xla.compiler_options() == {}  # the user's own flag wins


@needs_cpu
def test_cpu_options_leave_a_program_without_convolutions_bit_identical():
    """Why fit's default may take the options only where a step convolves: elsewhere
    they compile to the same kernels (a dense step with LayerNorm, dropout and Adam)."""
    from funcnet.layers import Dropout, LayerNorm, Relu
    from funcnet.train import make_train_step

    net = funcnet.serial(Dense(64), Relu, Dropout(0.1), LayerNorm(), Dense(10))
    opt = optax.adam(1e-3)

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0], rng=rng, train=True)
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 32))
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((16, 10)).astype(np.float32))
    plain, tuned = ts, ts
    for _ in range(3):
        plain = jax.jit(make_train_step(loss_fn, opt))(plain, batch)[0]
        tuned = xla.jit(make_train_step(loss_fn, opt))(tuned, batch)[0]
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(tuned.params)):
        np.testing.assert_array_equal(a, b)


def _convolutions(compiled_text: str) -> int:
    return len(re.findall(r"= \S+ convolution\(", compiled_text))


@needs_cpu
def test_conv_auto_takes_one_xla_convolution_under_xla_jit_and_agrees():
    """LeNet's conv2 (batch 128, 12x12x32): under jax.jit "auto" runs it in 4 pieces of 32
    examples, under xla.jit as one convolution; values and gradients agree."""
    init, apply = Conv(64, (5, 5))
    _, params, state = init(jax.random.key(0), (-1, 12, 12, 32))
    x = jax.random.normal(jax.random.key(1), (128, 12, 12, 32))

    def loss(p, x):
        return jnp.sum(apply(p, state, x)[0] ** 2)

    grad = jax.value_and_grad(loss, argnums=(0, 1))
    plain, tuned = jax.jit(grad), xla.jit(grad)
    assert _convolutions(jax.jit(lambda p, x: apply(p, state, x)[0]).lower(params, x).compile().as_text()) == 4
    assert _convolutions(xla.jit(lambda p, x: apply(p, state, x)[0]).lower(params, x).compile().as_text()) == 1
    (v1, g1), (v2, g2) = plain(params, x), tuned(params, x)
    np.testing.assert_allclose(v1, v2, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-3 * float(jnp.abs(b).max()))


def test_traced_with_options_only_inside_xla_jit():
    seen = []

    def f(x):
        seen.append(xla.traced_with_options())
        return x + 1

    assert float(xla.jit(f)(1.0)) == 2.0 and float(jax.jit(f)(1.0)) == 2.0
    f(1.0)
    assert seen == [CPU, False, False] and not xla.traced_with_options()
    with pytest.raises(ZeroDivisionError):  # reset however the trace ends
        xla.jit(lambda x: 1 // 0)(1.0)
    assert not xla.traced_with_options()
    donated = xla.jit(lambda x: x * 2, donate_argnums=0)  # jax.jit's arguments pass through
    assert donated(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]


def test_an_xla_jit_function_works_inside_other_traces():
    """Compiler options are for the outermost jit only; inside jit, grad, scan and vmap
    the function is an ordinary jitted one."""
    f = xla.jit(lambda x: x * 2)
    x = jnp.arange(3.0)
    assert jax.jit(f)(x).tolist() == [0.0, 2.0, 4.0]
    assert jax.grad(lambda v: f(v).sum())(x).tolist() == [2.0, 2.0, 2.0]
    assert jax.lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0].tolist() == [0, 4, 8]
    assert jax.vmap(f)(x[:, None]).ravel().tolist() == [0.0, 2.0, 4.0]
    assert jax.eval_shape(f, x).shape == (3,) and f.lower(x).compile() is not None
    with pytest.raises(ValueError, match="not top-level at all"):  # its own errors pass
        xla.jit(lambda v: (_ for _ in ()).throw(ValueError("not top-level at all")))(x)


@pytest.mark.devices(4)
def test_fit_compiles_with_the_options_asked_for_but_not_under_pmap():
    net = funcnet.serial(Conv(2, (3, 3)), Flatten, Dense(2))
    opt = optax.sgd(0.1)
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, 6, 6, 1))
    seen = []

    def loss_fn(params, state, batch, rng):
        seen.append(xla.traced_with_options())
        out, state = net.apply(params, state, batch)
        return jnp.mean(out**2), Aux(state=state)

    x = np.ones((16, 6, 6, 1), np.float32)
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        data.DeviceData(x, 8),
        progress=False,
        options=FitOptions(compiler_options=xla.compiler_options()),
    )
    assert seen and any(seen) == CPU  # the steps; fit's checks trace the loss outside them
    seen.clear()
    funcnet.fit(
        ts,
        loss_fn,
        opt,
        lambda e: data.batches(x, 8),
        progress=False,
        devices=2,
        options=FitOptions(compiler_options=xla.compiler_options()),
    )
    assert seen and not any(seen)


def test_unsplit_fusions_adds_its_pass_to_those_already_skipped(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    skip = "xla_disable_hlo_passes"
    assert xla.unsplit_fusions(backend="cpu") == {skip: "cpu-parallel-task-assigner"}
    given = {skip: "a, b", "other": 1}
    assert xla.unsplit_fusions(given, backend="cpu") == {skip: "a,b,cpu-parallel-task-assigner", "other": 1}
    assert given == {skip: "a, b", "other": 1}  # not changed
    assert xla.unsplit_fusions({skip: "cpu-parallel-task-assigner"}, backend="cpu") == {
        skip: "cpu-parallel-task-assigner"
    }
    # a compiler option replaces the flag's list, so the one added to starts from it
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_disable_hlo_passes=mine")
    assert xla.unsplit_fusions(backend="cpu") == {skip: "mine,cpu-parallel-task-assigner"}
    assert xla.unsplit_fusions({"other": 1}, backend="gpu") == {"other": 1}  # no such pass there


@needs_cpu
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="XLA:CPU splits fusions over 2 or more CPUs only")
def test_unsplit_fusions_keeps_each_loop_fusion_whole_with_the_same_bits():
    """The shuffled batch's gather and the weight update of a small MLP's SGD step, in a
    scan as fit's device loop runs them: XLA:CPU splits both over the cores (its cost
    model counts the gather's whole operand), and with the option neither."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((20_000, 784), dtype=np.float32))
    w = jnp.asarray(rng.standard_normal((784, 64), dtype=np.float32) * 0.01)
    order = jnp.asarray(rng.permutation(20_000)[:640].reshape(20, 32).astype(np.int32))

    def epoch(w, order):
        def body(w, idx):
            g = jax.grad(lambda w: jnp.mean(jnp.tanh(x[idx] @ w) ** 2))(w)
            return w - 0.1 * g, None

        return jax.lax.scan(body, w, order)[0]

    split = jax.jit(epoch).lower(w, order).compile()
    whole = jax.jit(epoch, compiler_options=xla.unsplit_fusions()).lower(w, order).compile()
    parts = re.compile(r'"outer_dimension_partitions":\["')
    assert parts.search(split.as_text()) and not parts.search(whole.as_text())
    np.testing.assert_array_equal(split(w, order), whole(w, order))
