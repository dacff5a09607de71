"""Smoke test of the benchmark harness: the funcnet workloads run a step and give finite numbers.

Each peer is called in-process on tiny cases; the first-step loss of funcnet is compared
with an independent peer (hand-written JAX, a NumPy loop, lax.conv) that starts from the
same weights and data.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import center_loss, cnn, gpt, mlp, pmap, sharding_memory, softmax_output
from benchmarks.workloads import WORKLOADS

CFG = {"quick": False, "threads": 1}


def _finite(result):
    assert result["values"] and all(math.isfinite(v) and v > 0 for v in result["values"])
    for key, value in result["extra"].items():
        if isinstance(value, float):
            assert math.isfinite(value), key


def test_registry_is_well_formed():
    names = [w.name for w in WORKLOADS]
    assert len(names) == len(set(names))
    for w in WORKLOADS:
        peers = [p.name for p in w.peers]
        assert w.reference in peers and len(peers) == len(set(peers)), w.name
        assert all(":" in p.target for p in w.peers)


def test_mlp_funcnet_matches_hand_jax():
    case = dict(sizes=(784, 16, 10), batch=8, opt="adam", lr=1e-3, reps=1, quick_reps=1, quick_steps=3)
    cfg = dict(CFG, quick=True)
    ours = mlp.run("funcnet", cfg, case)
    ref = mlp.run("jax", cfg, case)
    _finite(ours)
    assert ours["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)
    assert ours["extra"]["loss_warm"] == pytest.approx(ref["extra"]["loss_warm"], rel=1e-4)


def test_im2col_convs_match_lax_conv():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 9, 8, 3), dtype=np.float32))
    W = jnp.asarray(rng.standard_normal((5, 5, 3, 4), dtype=np.float32))
    ref = jax.lax.conv_general_dilated(x, W, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    dy = jnp.asarray(rng.standard_normal(ref.shape, dtype=np.float32))
    ref_dx, ref_dw = jax.vjp(lambda x, W: jax.lax.conv_general_dilated(
        x, W, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")), x, W)[1](dy)
    for conv in (cnn.im2col_conv, cnn.conv_im2col_vjp):  # the formulations the cnn peers use
        y, vjp = jax.vjp(conv, x, W)
        dx, dw = vjp(dy)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dx, ref_dx, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-4)
    pool_x = jnp.asarray(rng.standard_normal((2, 4, 6, 3), dtype=np.float32))
    np.testing.assert_array_equal(cnn.maxpool_reshape(pool_x), cnn.maxpool_reduce_window(pool_x))
    np.testing.assert_array_equal(cnn.maxpool_reshape_first(pool_x), cnn.maxpool_reduce_window(pool_x))
    # With ties, the first-max pool routes the gradient like select-and-scatter (reduce_window).
    tied = jnp.zeros((1, 2, 2, 1))
    grad = lambda pool: jax.grad(lambda x: pool(x).sum())(tied)
    np.testing.assert_array_equal(grad(cnn.maxpool_reshape_first), grad(cnn.maxpool_reduce_window))


def test_cnn_funcnet_one_step():
    case = dict(batch=4, lr=1e-3, steps=1, reps=1)
    ours = cnn.run("funcnet", CFG, case)
    _finite(ours)
    assert 0.5 < ours["extra"]["loss_first"] < 5.0


def test_softmax_output_matches_autodiff():
    case = dict(sizes=(784, 8, 10), batch=8, steps=1, reps=1)
    ours = softmax_output.run("softmax_output", CFG, case)
    ref = softmax_output.run("log_softmax-autodiff", CFG, case)
    _finite(ours)
    assert ours["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)


def test_center_loss_matches_python_loop():
    case = dict(batch=32, classes=5, dim=3, reps=1)
    ours = center_loss.run("funcnet", CFG, case)
    ref = center_loss.run("python-loop", CFG, case)
    _finite(ours)
    assert ours["extra"]["loss"] == pytest.approx(ref["extra"]["loss"], rel=1e-5)
    assert ours["extra"]["centers_sum"] == pytest.approx(ref["extra"]["centers_sum"], rel=1e-5, abs=1e-5)


def test_pmap_matches_jit():
    case = dict(sizes=(784, 8, 10), batch=16, steps=1, reps=1)
    ours = pmap.run("pmap-4", CFG, case)  # conftest provides 4 CPU devices
    mesh = pmap.run("jit-mesh-4", CFG, case)
    ref = pmap.run("jit-1", CFG, case)
    _finite(ours)
    _finite(mesh)
    assert ours["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)
    assert mesh["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)


def test_gpt_peers_start_from_the_same_loss():
    """funcnet's GPT (split over two devices), the hand-written JAX GPT and the PyTorch GPT
    load the same weights and see the same batch: the same first loss. (The Scan form equals
    the unrolled one in tests/test_models_gpt.py.)"""
    case = dict(n_layer=2, n_head=2, n_embd=16, block=8, batch=4, steps=1, reps=1)
    results = {peer: fn(peer, CFG, case) for peer, fn in (
        ("funcnet-2dev", gpt.run_funcnet), ("jax", gpt.run_jax), ("torch", gpt.run_torch))}
    ref = results["torch"]["extra"]["loss_first"]
    assert ref == pytest.approx(math.log(gpt.VOCAB), abs=0.1)
    for peer, r in results.items():
        _finite(r)
        assert r["extra"]["loss_first"] == pytest.approx(ref, rel=1e-5), peer


def test_sharding_memory_runs_its_three_layouts_on_tiny_models():
    """benchmarks/sharding_memory.py (BENCHMARKS.md's memory table) on tiny models, in
    this process's 4 devices: every layout trains to the same loss, FSDP holds about a
    quarter of the replicated state per device, and the table has a row for each."""
    rows = sharding_memory._child(4, ["mlp", "gpt"], steps=1, tiny=True)
    assert [(r["model"], r["layout"]) for r in rows] == [
        (m, layout) for m in ("mlp", "gpt") for layout in ("replicated", "fsdp", "2d")]
    for r in rows:
        assert r["devices"] == 4 and 0 < r["params"] < 50_000, r
        assert math.isfinite(r["loss"]) and r["step_ms_median"] > 0, r
        assert r["compiled_argument_bytes"] is None or r["compiled_argument_bytes"] > 0, r
        base = next(b for b in rows if b["model"] == r["model"] and b["layout"] == "replicated")
        assert r["loss"] == pytest.approx(base["loss"], rel=1e-4), r
        assert r["ratio_to_replicated"] == pytest.approx(
            r["state_bytes_per_device"] / base["state_bytes_per_device"])
        if r["layout"] == "replicated":
            assert r["ratio_to_replicated"] == 1.0
        elif r["layout"] == "fsdp":  # the target, held even by the tiny models
            assert r["ratio_to_replicated"] <= 1.1 / 4, r
        else:  # 2-D: the tiny GPT keeps more leaves whole (0.32 when measured)
            assert r["ratio_to_replicated"] < 0.4, r
    table = sharding_memory._table(rows).splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| 4 | mlp (")
