"""Smoke test of the benchmark harness: the funcnet workloads run a step and give finite numbers.

Each peer is called in-process on tiny cases; the first-step loss of funcnet is compared
with an independent peer (hand-written JAX, a NumPy loop, lax.conv) that starts from the
same weights and data.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import (
    center_loss,
    cnn,
    fit_nets,
    gather_probe,
    gpt,
    key_probe,
    mlp,
    pmap,
    sharding_memory,
    softmax_output,
)
from benchmarks import gpu as gpu_tier
from benchmarks import run as bench_run
from benchmarks.workloads import WORKLOADS, Peer, by_name, cases_on, peers_on
from helpers.torch_ref import HAVE_TORCH, SKIP_REASON

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
    ref_dx, ref_dw = jax.vjp(
        lambda x, W: jax.lax.conv_general_dilated(x, W, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        x,
        W,
    )[1](dy)
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


@pytest.mark.parametrize(
    "net,peers",
    [
        ("flax-cnn", ("fit-device", "flax")),
        # The device loop runs on the GPT: around a convolution, at the suite's LLVM
        # optimisation level 0 (conftest.py), LeNet's 20 looped steps took ~30 s.
        ("lenet", ("fit-device-options", "jit-loop")),
        ("gpt", ("fit", "fit-device-loop", "fit-device-quiet")),
    ],
)
def test_fit_nets_peers_train_each_network(net, peers):
    case = dict(net=net, batch=4, steps=10, reps=1, quick_steps=10, quick_reps=1)
    for peer in peers:
        if peer == "flax":
            pytest.importorskip("flax", reason="the flax peer needs the bench extra")
        _finite(fit_nets.run(peer, dict(CFG, quick=True), case))


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


@pytest.mark.devices(4)
def test_pmap_matches_jit():
    case = dict(sizes=(784, 8, 10), batch=16, steps=1, reps=1)
    ours = pmap.run("pmap-4", CFG, case)  # conftest provides 4 CPU devices
    mesh = pmap.run("jit-mesh-4", CFG, case)
    ref = pmap.run("jit-1", CFG, case)
    _finite(ours)
    _finite(mesh)
    assert ours["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)
    assert mesh["extra"]["loss_first"] == pytest.approx(ref["extra"]["loss_first"], rel=1e-5)


@pytest.mark.devices(2)
def test_gpt_peers_start_from_the_same_loss():
    """funcnet's GPT (split over two devices), the hand-written JAX GPT and the PyTorch GPT
    load the same weights and see the same batch: the same first loss. (The Scan form equals
    the unrolled one in tests/test_models_gpt.py.)"""
    if not HAVE_TORCH:
        pytest.skip(f"{SKIP_REASON}; the reference peer here is PyTorch's GPT")
    case = dict(n_layer=2, n_head=2, n_embd=16, block=8, batch=4, steps=1, reps=1)
    results = {
        peer: fn(peer, CFG, case)
        for peer, fn in (("funcnet-2dev", gpt.run_funcnet), ("jax", gpt.run_jax), ("torch", gpt.run_torch))
    }
    ref = results["torch"]["extra"]["loss_first"]
    assert ref == pytest.approx(math.log(gpt.VOCAB), abs=0.1)
    for peer, r in results.items():
        _finite(r)
        assert r["extra"]["loss_first"] == pytest.approx(ref, rel=1e-5), peer


@pytest.mark.devices(4)
def test_sharding_memory_runs_its_three_layouts_on_tiny_models():
    """benchmarks/sharding_memory.py (BENCHMARKS.md's memory table) on tiny models, in
    this process's 4 devices: every layout trains to the same loss, FSDP holds about a
    quarter of the replicated state per device, and the table has a row for each."""
    rows = sharding_memory._child(4, ["mlp", "gpt"], steps=1, tiny=True)
    assert [(r["model"], r["layout"]) for r in rows] == [
        (m, layout) for m in ("mlp", "gpt") for layout in ("replicated", "fsdp", "2d")
    ]
    for r in rows:
        assert r["devices"] == 4 and 0 < r["params"] < 50_000, r
        assert math.isfinite(r["loss"]) and r["step_ms_median"] > 0, r
        assert r["compiled_argument_bytes"] is None or r["compiled_argument_bytes"] > 0, r
        base = next(b for b in rows if b["model"] == r["model"] and b["layout"] == "replicated")
        assert r["loss"] == pytest.approx(base["loss"], rel=1e-4), r
        assert r["ratio_to_replicated"] == pytest.approx(r["state_bytes_per_device"] / base["state_bytes_per_device"])
        if r["layout"] == "replicated":
            assert r["ratio_to_replicated"] == 1.0
        elif r["layout"] == "fsdp":  # the target, held even by the tiny models
            assert r["ratio_to_replicated"] <= 1.1 / 4, r
        else:  # 2-D: the tiny GPT keeps more leaves whole (0.32 when measured)
            assert r["ratio_to_replicated"] < 0.4, r
    table = sharding_memory._table(rows).splitlines()
    assert len(table) == 2 + len(rows) and table[2].startswith("| 4 | mlp (")


def test_gather_probe_step_case_times_make_train_step_beside_the_hand_scan(monkeypatch, capsys):
    """benchmarks/gather_probe.py's ``step`` case (BENCHMARKS.md, workload 6's run Z notes)
    on 3,200 rows: both peers run their one-dispatch scans, and the line gives the
    ratio of each round."""
    monkeypatch.setattr(gather_probe, "N", 3200)
    monkeypatch.setattr(gather_probe, "STEPS", 3200 // gather_probe.BATCH // gather_probe.K * gather_probe.K)
    peers = gather_probe._step_epochs(
        jnp.asarray(np.random.default_rng(0).standard_normal((3200, gather_probe.FEATURES), dtype=np.float32)),
        jnp.asarray(np.arange(3200, dtype=np.int32) % 10),
    )
    assert sorted(peers) == ["scan", "train_step"]
    assert all(peers[p]() > 0 for p in peers)
    gather_probe.main(["--rounds", "2", "--cases", "step"])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("step: train_step ") and "train_step / scan per round" in line, line
    assert len(line.split("per round ")[1].split(",")[0].split()) == 2, line


def test_key_probe_drops_an_unused_fold_in_and_keeps_an_unused_split(monkeypatch, capsys):
    """benchmarks/key_probe.py (BENCHMARKS.md, workload 6's runs AF-AI) on 3,200 rows: each
    peer's line, and the programs behind its claim: the unused ``fold_in`` compiles to the
    count's program, the unused split and the drawn keys to more fusions."""
    monkeypatch.setattr(key_probe, "N", 3200)
    key_probe.main(["--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    fusions = {tuple(ln.split()[:2]): int(ln.split()[-1]) for ln in lines}
    assert len(lines) == 12 and set(fusions) == {(c, p) for c in ("split", "unsplit") for p in key_probe.PEERS}
    for c in ("split", "unsplit"):
        assert fusions[c, "fold"] == fusions[c, "count"]
        assert fusions[c, "split"] > fusions[c, "count"] and fusions[c, "fold-drawn"] > fusions[c, "count"]


# --------------------------------------------------------------------------- #
# The GPU tier (benchmarks/gpu.py, benchmarks.run --platform gpu): what can be checked
# without a GPU - the tier's registry, the parsers, the budget, and a rehearsal on CPU.
# --------------------------------------------------------------------------- #


def test_gpu_tier_leaves_out_the_cpu_device_peers_and_has_the_gpu_peers():
    assert peers_on(by_name()["pmap"], "gpu") == []
    gpt_gpu = [p.name for p in peers_on(by_name()["gpt"], "gpu")]
    assert "funcnet-2dev" not in gpt_gpu and "funcnet-2dev-loop" not in gpt_gpu
    assert [p.name for p in peers_on(by_name()["mlp"], "cpu")][-1] == "torch"  # CPU tier as before
    for peers in (gpu_tier.GPU_PEERS, gpu_tier.REHEARSAL_PEERS):
        for name, wanted in peers.items():
            tier = {p.name for p in peers_on(by_name()[name], "gpu")}
            assert set(wanted) <= tier, (name, set(wanted) - tier)
    (gpt_case,) = [by_name()["gpt"].cases[i] for i in cases_on(by_name()["gpt"], "gpu")]
    assert (gpt_case["n_layer"], gpt_case["n_embd"], gpt_case["block"], gpt_case["batch"]) == (6, 384, 256, 64)
    assert gpu_tier.GPU_PEERS["gpt"][-1] == "torch-compile"  # a slow compile cuts no other peer
    # named peers run in the order given; the tier's defaults otherwise
    [(w, peers, cases)] = list(bench_run._selected(["gpt:torch-compile", "gpt:funcnet"], "gpu"))
    assert [p.name for p in peers] == ["torch-compile", "funcnet"] and cases == [2]
    assert [w.name for w, _, _ in bench_run._selected([], "gpu")].count("pmap") == 0


def test_run_child_settings_for_the_gpu_tier():
    args = bench_run.argparse.Namespace(platform="gpu", f32_matmul="tf32")
    env = bench_run._child_env(args, [0])
    assert env["JAX_PLATFORMS"] == "cuda" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "JAX_DEFAULT_MATMUL_PRECISION" not in env or os.environ.get("JAX_DEFAULT_MATMUL_PRECISION")
    args.f32_matmul = "highest"
    assert bench_run._child_env(args, [0])["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
    args.platform = "cpu"
    assert bench_run._child_env(args, [0])["JAX_PLATFORMS"] == "cpu"
    spec = {"case": 2, "quick": True, "reps": 1}
    case = bench_run._child_case(by_name()["gpt"], spec)
    assert (case["n_layer"], case["batch"], case["reps"]) == (1, 4, 1)
    spec = {"case": 2, "quick": False, "reps": 2}
    assert bench_run._child_case(by_name()["gpt"], spec)["reps"] == 2


def test_cpu_steal_is_read_from_proc_stat_and_shown_per_round(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 10 0 0 40 7 0\ncpu0 1 2 3\n")
    before = bench_run.common.cpu_ticks(str(stat))
    assert before == (40, 1000)  # guest time is inside user's, not added again
    stat.write_text("cpu  300 0 50 900 10 0 0 240 7 0\n")
    assert bench_run.common.steal_percent(before, bench_run.common.cpu_ticks(str(stat))) == pytest.approx(40.0)
    assert bench_run.common.cpu_ticks(str(tmp_path / "missing")) is None
    assert bench_run.common.steal_percent(None, before) is None

    workload = by_name()["fit"]
    case = workload.cases[0]

    def merged(*rounds):
        out = None
        for values, steal in rounds:
            r = {"values": values, "extra": {}} if values else {"error": "crashed"}
            out = bench_run._merge(out, {**r, "cpu_steal_pct": steal})
        return out

    fit_device = merged(([1.0, 3.0], 0.4), ([4.0], 31.0))
    assert fit_device["values"] == [1.0, 3.0, 4.0]
    assert fit_device["rounds"] == [
        {"median": 2.0, "cpu_steal_pct": 0.4, "values": None},  # not interleaved: no pairs
        {"median": 4.0, "cpu_steal_pct": 31.0, "values": None},
    ]
    jax_ = merged(([1.0], 1.0), (None, None))  # its second round failed
    table = bench_run._table(workload, case, {"fit-device": fit_device, "jax": jax_})
    assert table[0].endswith(
        "| fit-device ÷ peer (time) | 1st epoch incl. compile (s) | host thread CPU an epoch (ms) "
        "| fit-device ÷ peer per round | CPU steal per round (%) |"
    )
    assert table[2].startswith("| fit-device | 3.000 s |") and table[2].endswith("| 1.00, 1.00 | 0, 31 |")
    assert table[3].startswith("| jax | 1.000 s |") and table[3].endswith("| 2.00 | 1, ? |")
    # one round, no steal worth showing: neither column
    table = bench_run._table(workload, case, {"fit-device": merged(([1.0], 0.4)), "jax": merged(([2.0], 4.9))})
    assert "per round" not in table[0]


def test_median_ci_is_the_sign_test_interval():
    median_ci = bench_run.common.median_ci
    # n = 9: P(Binomial(9, 1/2) < 2) = 10/512 <= 2.5% < P(< 3) = 46/512, so x_(2) .. x_(8)
    assert median_ci([9, 1, 8, 2, 7, 3, 6, 4, 5]) == (5, 2, 8)
    # n = 5 cannot reach 95% (the widest interval, x_(1) .. x_(5), covers 1 - 2/32)
    assert median_ci([1, 2, 3, 4, 5]) == (3, None, None)
    # n = 6: 1/64 <= 2.5%, so x_(1) .. x_(6)
    assert median_ci([6, 5, 4, 3, 2, 1]) == (3.5, 1, 6)
    # n = 120: P(B < 49) = 1.8% <= 2.5% < P(B < 50), so x_(49) .. x_(72), here 48 .. 71
    assert median_ci(range(120))[1:] == (48, 71)


def test_interleaved_tables_pair_the_peers_turn_by_turn():
    workload = by_name()["fit"]
    case = workload.cases[0]

    def merged(*rounds, interleaved=True):
        out = None
        for values in rounds:
            r = {"values": values, "extra": {}, "interleaved": interleaved} if values else {"error": "crashed"}
            out = bench_run._merge(out, r)
        return out

    # the machine drifts 2x between turns, the same for both: each pair's ratio is 0.9
    drift = [1.0, 2.0, 1.5, 1.0, 2.0, 1.5, 1.0, 2.0, 1.5]
    fit_device = merged([0.9 * d for d in drift[:5]], [0.9 * d for d in drift[5:]], [0.9])
    peer = merged(drift[:5], drift[5:], None)  # its third round failed: that round has no pairs
    table = bench_run._table(workload, case, {"fit-device": fit_device, "jax": peer})
    assert table[0].endswith("| fit-device ÷ peer, turn by turn: median [95% CI] (pairs) |")
    assert table[3].startswith("| jax |") and table[3].endswith("| 0.900 [0.900, 0.900] (9) |"), table[3]
    assert table[2].endswith("|  |")  # fit-device against itself: no cell
    few = bench_run._table(workload, case, {"fit-device": merged([0.9, 1.8]), "jax": merged([1.0, 2.0])})
    assert few[3].endswith("| 0.900 [too few pairs] (2) |"), few[3]
    alone = {"fit-device": merged([1.0], [1.0], interleaved=False), "jax": merged([2.0], [2.0], interleaved=False)}
    apart = bench_run._table(workload, case, alone)
    assert "turn by turn" not in apart[0]  # peers in processes of their own: nothing to pair


def test_same_process_groups_the_jax_peers_and_keeps_the_rest_alone():
    peers = {p.name: p for w in WORKLOADS for p in w.peers}
    jax_a, jax_b, torch_ = peers["fit-device"], peers["jax-scan"], Peer("torch", "m:f")
    flagged = Peer("funcnet-flags", "m:f", xla_flags="--xla_cpu_enable_fast_math=false")
    order = [jax_a, torch_, jax_b, flagged]
    assert bench_run._process_groups(order, False) == [[p] for p in order]
    assert bench_run._process_groups(order, True) == [[jax_a, jax_b], [torch_], [flagged]]
    assert bench_run._process_groups(order[::-1], True) == [[flagged], [jax_b, jax_a], [torch_]]


def test_one_child_process_reports_each_of_its_peers(tmp_path):
    """``--same-process``: one child runs both peers and reports each, with its own steal
    reading, in the order asked; a peer it never reached gets the child's error."""
    workload = by_name()["center_loss"]
    args = bench_run.argparse.Namespace(
        quick=True, platform="cpu", reps=1, f32_matmul="tf32", xla_flags="", child_timeout=300
    )
    cpus = sorted(os.sched_getaffinity(0))[:1]
    results = bench_run._run_child(workload, 0, workload.peers[::-1], args, cpus)
    assert len(results) == 2
    for result in results:
        _finite(result)
        assert result["process_peers"] == ["python-loop", "funcnet"] and "peer_wall_s" in result
    assert results[0]["extra"]["loss"] == pytest.approx(results[1]["extra"]["loss"], rel=1e-4)
    missing = Peer("no-such-peer", "benchmarks.center_loss:run")
    results = bench_run._run_child(workload, 0, [missing], args, cpus)
    assert "error" in results[0]


def test_turns_alternate_the_timed_repetitions_and_leave_the_waits_unclocked():
    """``--interleave``'s turns: peers in threads run their timed repetitions one by one in
    turn (``measure``'s calls, ``epoch_clock``'s epochs), a finished peer leaves the
    rotation, and the time a peer waits for its turn is in none of its figures."""
    import threading
    import time
    import types

    from benchmarks import common

    log = []
    ctx = types.SimpleNamespace(train_state=types.SimpleNamespace(params=jnp.zeros(1)))
    clocks = {}

    def timed(name, reps, sleep):
        return lambda: common.measure(lambda: (log.append(name), time.sleep(sleep)), reps)

    def fit_like():
        clock = clocks["c"] = common.epoch_clock()
        clock.on_train_begin(ctx)
        for _ in range(3):
            log.append("c")
            clock.on_epoch_end(ctx, 0, {})

    peers = {"a": timed("a", 3, 0.2), "b": timed("b", 1, 0.0), "c": fit_like}
    turns = common.Turns(list(peers))
    figures = {}

    def thread(name):
        turns.wait(name)
        try:
            figures[name] = peers[name]()
        finally:
            turns.leave(name)

    threads = [threading.Thread(target=thread, args=(n,), name=n) for n in peers]
    with common.taking_turns(turns):
        for t in threads[::-1]:  # started in any order, they run in the rotation's
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert log == ["a", "b", "c", "a", "c", "a", "c"]
    assert len(figures["a"]) == 3 and min(figures["a"]) >= 0.2
    # each of c's epochs is its own turn: a's 0.2 s between them is not in them
    assert len(clocks["c"].epochs) == 3 and max(clocks["c"].epochs) < 0.1
    assert common._TURNS is None
    # outside turns (the main thread, or no rotation) measure just times
    assert len(common.measure(lambda: None, 2)) == 2


def test_an_interleaved_child_reports_each_of_its_peers(capsys):
    """``--interleave``'s child side, in this process: both peers run in turns and each
    reports its result line."""
    import json

    workload = by_name()["center_loss"]
    spec = {"case": 0, "quick": True, "reps": 2}
    case = bench_run._child_case(workload, spec)
    names = [p.name for p in workload.peers]
    bench_run._child_interleaved(workload, names, dict(CFG, quick=True, device="cpu"), case, spec)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith(bench_run.RESULT_TAG)]
    results = {r.pop("peer"): r for r in (json.loads(l[len(bench_run.RESULT_TAG) :]) for l in lines)}
    assert sorted(results) == sorted(names)
    for result in results.values():
        assert result["interleaved"] is True
        _finite(result)
    a, b = results.values()
    assert a["extra"]["loss"] == pytest.approx(b["extra"]["loss"], rel=1e-4)


def test_gpu_bf16_peers_start_from_the_float32_loss():
    """The GPU tier's bfloat16 funcnet peers (run here on CPU) load the shared weights: their
    first loss is the float32 one to bfloat16 rounding."""
    case = dict(sizes=(784, 16, 10), batch=8, opt="adam", lr=1e-3, reps=1, quick_reps=1, quick_steps=3)
    cfg = dict(CFG, quick=True, device="cpu")
    f32 = mlp.run("funcnet", cfg, case)["extra"]["loss_first"]
    bf16 = mlp.run("funcnet-bf16", cfg, case)
    _finite(bf16)
    assert bf16["extra"]["loss_first"] == pytest.approx(f32, rel=2e-2)
    conv = cnn.run("funcnet-bf16", dict(CFG, device="cpu"), dict(batch=4, lr=1e-3, steps=1, reps=1))
    _finite(conv)


def test_gpu_pytest_summary_parser():
    parse = gpu_tier.parse_pytest_summary
    s = parse("....s.\n===== 12 passed, 3 skipped, 1 warning in 45.67s =====\n")
    assert s["counts"] == {"passed": 12, "skipped": 3, "warnings": 1} and s["seconds"] == 45.67
    assert s["line"] == "12 passed, 3 skipped, 1 warning in 45.67s" and not s["interrupted"]
    s = parse("F.\n1 failed, 5 passed, 2 errors in 83.45s (0:01:23)\n")
    assert s["counts"] == {"failed": 1, "passed": 5, "errors": 2} and s["seconds"] == 83.45
    assert parse("no tests ran in 0.01s")["counts"] == {}
    s = parse("..\n!!!!!!!!!! KeyboardInterrupt !!!!!!!!!!\n==== 2 passed in 10.00s ====")
    assert s["interrupted"] and s["counts"] == {"passed": 2}
    assert parse("ImportError: no module named jax\n") is None


def test_gpu_training_log_parser():
    """The example's lines (with and without mfu) and nanoGPT's, among lines to ignore."""
    text = """note: --rng=torch with --dropout=0.2: ...
number of parameters: 10.65M
dtype: bfloat16 matrix products, float32 weights
compile: 31.6 s
step 0: train loss 4.2874, val loss 4.2823
iter 0: loss 4.2654, time 29830.12ms, mfu -100.00%
iter 100: loss 2.3456, time 25.10ms, mfu 12.34%
iter 200: loss 2.1000, time 24.90ms
iter 300: loss 1.9000, time 30.00ms, mfu 10.00%
step 500: train loss 1.6012, val loss 1.8023
saving checkpoint to out
training took 80.5 s
"""
    parsed = gpu_tier.parse_training_log(text)
    assert parsed["params_m"] == 10.65 and parsed["compile_s"] == 31.6
    assert parsed["training_s"] == 80.5
    assert parsed["evals"] == [
        {"step": 0, "train_loss": 4.2874, "val_loss": 4.2823},
        {"step": 500, "train_loss": 1.6012, "val_loss": 1.8023},
    ]
    assert [i["iter"] for i in parsed["iters"]] == [0, 100, 200, 300]
    assert parsed["iters"][0]["mfu_pct"] == -100.0 and parsed["iters"][2]["mfu_pct"] is None
    s = gpu_tier.summarize_training(parsed)
    assert (s["last_step"], s["val_loss"], s["median_ms_per_iter"]) == (500, 1.8023, 25.10)
    assert s["median_mfu_pct"] == pytest.approx(11.17)  # the first interval is left out
    empty = gpu_tier.summarize_training(gpu_tier.parse_training_log("Traceback ..."))
    assert empty["val_loss"] is None and empty["median_ms_per_iter"] is None
    assert gpu_tier.rejected_flag("error: unrecognized arguments: --dtype=float32", "--dtype")


def test_gpu_budget_keeps_the_later_stages_reserves():
    names = [n for n, *_ in gpu_tier.PLAN]
    plan = gpu_tier.plan_timeouts(480, names)
    reserves = sum(s["reserve"] for s in plan if not s["optional"])
    assert reserves < 480 * 0.7  # room for the stages to take more than their reserves
    assert gpu_tier.stage_timeout(plan, 0, 480) == plan[0]["cap"]
    i = names.index("gpt")  # late in the run: its timeout leaves the Shakespeare run its reserve
    assert gpu_tier.stage_timeout(plan, i, 150) == pytest.approx(150 - plan[i + 1]["reserve"])
    opt = names.index("shakespeare-f32")
    assert plan[opt]["optional"] and gpu_tier.stage_timeout(plan, opt, 60) is None
    assert gpu_tier.stage_timeout(plan, opt, 400) == plan[opt]["cap"]
    half = gpu_tier.plan_timeouts(240, ["suite"])
    assert half == [dict(plan[1], cap=plan[1]["cap"] / 2, reserve=plan[1]["reserve"] / 2)]
    assert gpu_tier._selected_stages("workloads,device") == ["device", "mlp", "cnn", "fit", "gpt", "fit-nets"]
    with pytest.raises(SystemExit):
        gpu_tier._selected_stages("bogus")


def test_gpu_shakespeare_stage_reruns_without_a_refused_dtype_flag(tmp_path, monkeypatch):
    """Where the example does not know --dtype, the stage says so, runs it without the
    flag, and the float32 stage is skipped (it would repeat the same run)."""
    calls = []
    log = "compile: 2.0 s\nstep 0: train loss 4.2, val loss 4.3\niter 0: loss 4.2, time 9.0ms\n"

    def fake_run(cmd, env, timeout, log_path, prefix="", cwd=None):
        calls.append(list(cmd))
        if any(c.startswith("--dtype") for c in cmd):
            return {
                "rc": 2,
                "seconds": 0.1,
                "timed_out": False,
                "output": "usage: ...\nerror: unrecognized arguments: --dtype=bfloat16\n",
            }
        return {"rc": 0, "seconds": 1.0, "timed_out": False, "output": log}

    monkeypatch.setattr(gpu_tier, "run_command", fake_run)
    ctx = gpu_tier.Ctx(
        out=str(tmp_path), rehearse=True, nanogpt_dir=None, env={"JAX_PLATFORMS": "cpu"}, results={"stages": {}}
    )
    rec = gpu_tier._run_stage(ctx, "shakespeare-bf16", 100)
    assert len(calls) == 2 and not any(c.startswith("--dtype") for c in calls[1])
    assert rec["status"] == "ok" and rec["dtype_flag"].startswith("rejected")
    assert rec["summary"]["val_loss"] == 4.3 and rec["summary"]["compile_s"] == 2.0
    ctx.results["stages"]["shakespeare-bf16"] = rec
    assert gpu_tier._run_stage(ctx, "shakespeare-f32", 100)["status"] == "skipped"


def test_gpu_rehearsal_records_every_stage(tmp_path):
    """``python -m benchmarks.gpu --rehearse`` on the stages that run children of every kind
    (the probes, pytest, a benchmarks.run workload) and one skipped for want of nanoGPT:
    each stage recorded with a status, the JSON and the report written. (The whole
    rehearsal, Shakespeare runs included, takes about 2 minutes on a 2-core VM.)"""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NANOGPT_DIR"}
    out = tmp_path / "gpu"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu",
            "--rehearse",
            "--stages",
            "device,suite,mlp,nanogpt",
            "--out",
            str(out),
            "--nanogpt-dir",
            str(tmp_path / "none"),
        ],
        cwd=gpu_tier.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "gpu-results.json").read_text())
    stages = results["stages"]
    assert list(stages) == ["device", "suite", "mlp", "nanogpt"] and results["rehearse"]
    assert all(s["status"] in ("ok", "partial", "failed", "timeout", "skipped") for s in stages.values())
    assert stages["device"]["status"] == "ok"
    assert stages["device"]["probe"]["jax"]["backend"] == "cpu"
    assert stages["suite"]["status"] == "ok" and stages["suite"]["summary"]["counts"]["passed"] >= 1
    mlp_rec = stages["mlp"]
    assert mlp_rec["status"] == ("ok" if HAVE_TORCH else "partial"), mlp_rec
    timed = {p["peer"]: p for p in mlp_rec["peers"] if "median_s" in p}
    assert "funcnet-bf16" in timed and math.isfinite(timed["funcnet-bf16"]["loss_first"])
    assert stages["nanogpt"]["status"] == "skipped"
    report = (out / "gpu-report.md").read_text()
    assert "| mlp | " in report and "REHEARSAL" in report and "## 1. MNIST MLP" in report
    assert (out / "logs" / "suite.log").exists() and (out / "workloads" / "mlp.json").exists()


def test_gpu_suite_stage_runs_without_pytest_xdist():
    """A GPU machine may lack pytest-xdist: the suite stage drops pyproject's "-n auto", and
    the conftest's xdist hook is optional, so pytest starts without the plugin."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "tests/test_layers_dense.py",
        ],
        cwd=gpu_tier.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = gpu_tier.parse_pytest_summary(proc.stdout)
    assert proc.returncode == 0 and summary["counts"]["passed"] >= 1, proc.stdout[-2000:]


def test_paired_reads_the_turns_of_an_interleaved_json(tmp_path, capsys):
    import json

    from benchmarks import paired

    case = by_name()["fit"].cases[1]["name"]

    def entry(peer, rnd, values, interleaved=True):
        where = {"workload": "fit", "case": case, "peer": peer, "round": rnd}
        return {**where, "values": values, "interleaved": interleaved}

    drift = [1.0, 2.0, 1.5, 1.2, 1.8, 1.1, 1.3]
    results = [entry("fit-device", 0, drift), entry("jax", 0, [d / 0.95 for d in drift])]
    results += [entry("fit-device", 1, drift[:3]), entry("jax", 1, [d / 0.95 for d in drift[:3]])]
    results += [entry("jax-scan", 0, drift, interleaved=False)]  # in a process of its own: no pairs
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"header": {}, "results": results}))
    paired.main([str(path)])
    out = capsys.readouterr().out
    assert "fit-device ÷ peer, turn by turn" in out and "jax" in out and "0.950 [0.950, 0.950] (10)" in out, out
    assert "jax-scan" not in out


def test_measure_keeps_each_repetitions_cpu_time_on_its_own_thread():
    import threading
    import time

    common = bench_run.common
    common.host_cpu_taken()
    common.measure(lambda: sum(range(300_000)), 3)  # ~5-10 ms of this thread's CPU each
    busy = common.host_cpu_taken()
    common.measure(lambda: time.sleep(0.03), 3)  # waiting, as a peer blocked on its device
    idle = common.host_cpu_taken()
    assert len(busy) == 3 and min(busy) > 1e-3, busy
    assert len(idle) == 3 and max(idle) < 0.01, idle
    assert common.host_cpu_taken() == []  # taken once
    other = threading.Thread(target=common.measure, args=(lambda: sum(range(300_000)), 2))
    other.start()
    other.join()
    assert common.host_cpu_taken() == []  # another peer's thread keeps its own
