"""The suite's own set-up: XLA flags a jaxlib does not know are dropped, not fatal; a backend
that cannot start is reported with XLA's words; the torch stand-in skips, never passes."""

import json
import os
import platform
import subprocess
import sys

import pytest

import conftest
from helpers import torch_ref


def test_a_flag_this_jaxlib_does_not_know_is_dropped_and_the_rest_kept(monkeypatch):
    bogus = "--xla_funcnet_no_such_flag=true"
    ok, err = conftest._backend_starts(bogus)
    assert not ok and "Unknown flag" in err and bogus in err  # XLA aborts on it ...
    monkeypatch.setattr(conftest, "_SPEED_FLAGS", ("--xla_backend_optimization_level=0", bogus))
    monkeypatch.setenv("XLA_FLAGS", "")
    assert conftest._known_flags() == "--xla_backend_optimization_level=0"  # ... we drop it


def test_a_backend_that_cannot_start_stops_the_run_with_xlas_message(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_users_own_typo=1")  # not ours to drop
    with pytest.raises(
        pytest.UsageError,
        match=r"(?s)backend does not start.*"
        r"--xla_users_own_typo=1",
    ):
        conftest._known_flags()


def test_the_flags_this_run_kept_are_in_the_environment():
    kept = os.environ["FUNCNET_TEST_XLA_FLAGS"].split()
    assert set(kept) <= set(conftest._SPEED_FLAGS)
    assert "--xla_backend_optimization_level=0" in kept  # every jaxlib so far knows it
    assert f"--xla_force_host_platform_device_count={conftest.DEVICES}" in os.environ["XLA_FLAGS"]


def test_the_torch_stand_in_resolves_names_and_skips_at_the_first_use():
    missing = torch_ref._Missing("torch")
    assert repr(missing.nn.functional.gelu) == ("<torch.nn.functional.gelu: torch is not installed>")
    with pytest.raises(pytest.skip.Exception, match="the test calls torch.nn.Linear"):
        missing.nn.Linear(3, 4)
    with pytest.raises(pytest.skip.Exception, match=torch_ref.SKIP_REASON.split(":")[0]):
        with missing.no_grad():
            pass
    with pytest.raises(pytest.skip.Exception, match="subclasses torch.nn.Module"):

        class Net(missing.nn.Module):
            pass

    # A test's `except Exception` cannot turn the missing reference into a pass.
    with pytest.raises(pytest.skip.Exception):
        try:
            missing.tensor([1.0])
        except Exception:
            pass


def _programs():
    """New functions each call (so no lowering is cached): a gradient, a scan, a
    custom_vjp, a convolution and an integer gather (float64: the caller's enable_x64)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def clip(x):
        return jnp.clip(x, -1, 1)

    clip.defvjp(lambda x: (clip(x), x), lambda x, g: (g * (jnp.abs(x) < 1),))
    conv = lambda x: jax.lax.conv_general_dilated(x[None, None], x[None, None, :3, :3], (1, 1), "SAME")
    return [
        (jax.grad(lambda x: jnp.sum(jnp.tanh(x) ** 2)), jnp.ones((3, 4))),
        (lambda x: jax.lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(4), x), jnp.ones((3, 4))),
        (jax.grad(lambda x: clip(x).sum()), jnp.ones(5)),
        (conv, jnp.ones((6, 6))),
        (lambda i: jnp.arange(10)[i], jnp.array([1, 3])),
    ]


def test_reused_mlir_contexts_lower_the_same_modules(monkeypatch):
    """conftest reuses MLIR contexts only on a jax that does not itself, and the modules it
    lowers with a reused context are the ones a fresh context gives, character for character."""
    import jax
    from jax._src.interpreters import mlir

    assert conftest.REUSES_MLIR_CONTEXTS == (not hasattr(mlir, "_thread_local_context"))
    if not conftest.REUSES_MLIR_CONTEXTS:
        assert not hasattr(mlir.make_ir_context, "fresh")  # jax's own reuse, untouched
        return
    made = [mlir.make_ir_context() for _ in range(conftest._CONTEXT_REUSES + 1)]
    assert len(set(map(id, made))) == 2  # one context per ten lowerings, then a new one
    lower = lambda: [jax.jit(f).lower(x).as_text() for f, x in _programs()]
    reused = lower() + lower()  # twice: past one context's ten uses
    monkeypatch.setattr(mlir, "make_ir_context", mlir.make_ir_context.fresh)
    fresh = lower()
    assert reused == fresh + fresh
    with jax.enable_x64(True):
        monkeypatch.undo()
        reused = lower()
        monkeypatch.setattr(mlir, "make_ir_context", mlir.make_ir_context.fresh)
        assert reused == lower()


# What a default build has for each of conftest's speed flags.
_DEFAULT_BUILD = {
    "--xla_backend_optimization_level=0": ("xla_backend_optimization_level", 3),
    "--xla_cpu_use_fusion_emitters=false": ("xla_cpu_use_fusion_emitters", True),
}


def _cpu_has_fma():
    try:
        with open("/proc/cpuinfo") as info:
            return " fma " in f" {info.read()} ".replace("\n", " ")
    except OSError:
        return False


@pytest.mark.skipif(not conftest.ON_CPU, reason="the speed flags are XLA:CPU's")
@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="FMA is turned off with --xla_cpu_max_isa=AVX, an x86 ISA"
)
def test_the_speed_flags_change_no_bit_but_where_fmas_form():
    """conftest's docstring, checked: XLA's optimised HLO is the same at either LLVM level,
    and with FMA instructions off the suite's flags give a default build's bits; with them,
    only the last bits move (a product and a sum fused into one rounding, or not)."""
    assert set(_DEFAULT_BUILD) == set(conftest._SPEED_FLAGS)  # a new flag needs its default here
    defaults = dict(_DEFAULT_BUILD[f] for f in os.environ["FUNCNET_TEST_XLA_FLAGS"].split())
    script = os.path.join(os.path.dirname(__file__), "helpers", "xla_builds.py")
    env = dict(os.environ, XLA_FLAGS=os.environ["XLA_FLAGS"] + " --xla_cpu_max_isa=AVX")
    run = subprocess.run(
        [sys.executable, script, json.dumps(defaults)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    no_fma = json.loads(run.stdout.splitlines()[-1])
    assert all(no_fma["same_hlo"]) and all(no_fma["same_bits"]), no_fma

    from helpers import xla_builds

    fma = xla_builds.compare(defaults)  # this process: FMA where the CPU has it
    assert all(fma["same_hlo"]) and fma["largest"] < 1e-5, fma
    if _cpu_has_fma():  # the builds do differ, so the bits above were compared, not cached
        assert not all(fma["same_bits"]), f"no FMA difference any more: revisit conftest's docstring ({fma})"
