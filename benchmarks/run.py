"""Runs the benchmark workloads and writes a markdown report.

    python -m benchmarks.run [--quick] [--only NAME[:PEER] ...] [--threads N] [--rounds R] [--out BENCHMARKS.md]
    python -m benchmarks.run --platform gpu [--rounds 1 --reps 2] [--only ...]   # on a GPU

Every (workload, case, peer) runs in its own child process (``python -m benchmarks.run
--child ...``), one after the other, so no two frameworks share a process or run at the
same time. Each child is pinned to the same ``--threads`` CPUs (default: all usable CPUs):

* its CPU affinity is set to the first N usable CPUs before jax or torch is imported;
  XLA sizes its Eigen thread pool from the affinity mask (jax-ml/jax#1539), so XLA uses N;
* ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` are N and PyTorch peers call
  ``torch.set_num_threads(N)``.

Each peer times several repetitions after a warm-up (which contains the compilation) and
the report gives the median with min and max. Ratios are time ratios: reference peer's
median time / this peer's median time (> 1: the reference, usually funcnet, is slower).
``--quick`` shrinks step counts and repetitions for a smoke check; its numbers are not
benchmarks.

``--platform gpu`` runs the GPU tier on the machine's GPU: JAX children with
``JAX_PLATFORMS=cuda`` and ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, PyTorch peers on
``cuda`` (model and batches moved there once, ``torch.cuda.synchronize()`` before every clock
read); no CPU affinity is set (XLA:GPU compiles on host threads, the kernels run on the
GPU), the OMP/MKL thread counts stay as on CPU (they bound torch's few host-side ops). The
tier (:mod:`benchmarks.workloads`: ``Peer.platforms``) leaves out the peers that mean
nothing on one GPU and adds bfloat16 peers. Float32 matmuls: XLA's default precision on
NVIDIA GPUs is TF32, torch's is full float32; ``--f32-matmul tf32`` (the default) sets
torch to TF32 as well (``torch.set_float32_matmul_precision("high")``), ``highest`` sets
both to full float32; every result records its peer's setting. ``--tier gpu`` with
``--platform cpu`` rehearses the GPU tier on the CPU (its numbers mean nothing).

Workloads and peers are listed in :mod:`benchmarks.workloads`; ``--list`` prints them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from benchmarks import common
from benchmarks.workloads import WORKLOADS, Workload, by_name, cases_on, peers_on, title_on

RESULT_TAG = "BENCHMARK_RESULT_JSON:"
# Variables that change the numbers; the report records those that are set.
ENV_RECORDED = (
    "XLA_FLAGS",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_ARENA_MAX",
    "LD_PRELOAD",
    "OMP_NUM_THREADS",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "CUDA_VISIBLE_DEVICES",
)
CHILD_TIMEOUT_S = 1800
# --f32-matmul -> torch.set_float32_matmul_precision: "high" is TF32 for float32 matmuls,
# what XLA does by default on NVIDIA GPUs; "highest" is full float32.
TORCH_F32 = {"tf32": "high", "highest": "highest"}


# --------------------------------------------------------------------------- #
# Child side
# --------------------------------------------------------------------------- #


def _child_case(workload: Workload, spec: Dict) -> Dict:
    """The case a child runs: ``--quick``'s ``quick_*`` values, then ``--reps`` as a cap."""
    case = dict(workload.cases[spec["case"]])
    if spec["quick"]:
        case.update({k[len("quick_") :]: v for k, v in case.items() if k.startswith("quick_")})
    if spec.get("reps"):
        for key in ("reps", "quick_reps"):
            if key in case:
                case[key] = min(case[key], spec["reps"])
    return case


def _child(spec: Dict) -> None:
    """Runs the spec's peer, or (``--same-process``) its ``peers`` one after another, and
    prints one tagged result line per peer."""
    cpus = spec["cpus"]
    device = spec.get("platform", "cpu")
    if device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # before jax/torch create their thread pools
    workload = by_name()[spec["workload"]]
    case = _child_case(workload, spec)
    cfg = {"quick": spec["quick"], "threads": len(cpus), "device": device}
    names = spec.get("peers") or [spec["peer"]]
    if spec.get("interleave") and len(names) > 1:
        return _child_interleaved(workload, names, cfg, case, spec)
    for i, name in enumerate(names):
        if i:
            # Each peer compiles its own programs, as in a process of its own: its first
            # epoch keeps its compilation.
            import gc

            import jax

            jax.clear_caches()
            gc.collect()
        peer = next(p for p in workload.peers if p.name == name)
        t0, ticks = time.perf_counter(), common.cpu_ticks()
        result = _child_peer(peer, cfg, case, spec)
        if len(names) > 1:
            result["peer_wall_s"] = time.perf_counter() - t0
            steal = common.steal_percent(ticks, common.cpu_ticks())
            if steal is not None:
                result["cpu_steal_pct"] = steal
        print(RESULT_TAG + json.dumps({"peer": name, **result}), flush=True)


def _child_interleaved(workload: Workload, names: List[str], cfg: Dict, case: Dict, spec: Dict) -> None:
    """``--interleave``: the peers in threads of their own, taking turns (``common.Turns``):
    one timed repetition each, in ``names``' order, round and round. Each prints its result
    line while it holds the turn; one that raises prints its traceback and leaves."""
    import traceback

    turns = common.Turns(names)
    streams = sys.stdout, sys.stderr  # peers redirect them, and threads restore them out of order

    def peer_thread(name: str) -> None:
        turns.wait(name)
        try:
            peer = next(p for p in workload.peers if p.name == name)
            result = _child_peer(peer, cfg, case, spec)
            print(RESULT_TAG + json.dumps({"peer": name, "interleaved": True, **result}), file=streams[0], flush=True)
        except BaseException:
            print(f"peer {name} failed:\n{traceback.format_exc()}", file=streams[1], flush=True)
        finally:
            turns.leave(name)

    threads = [threading.Thread(target=peer_thread, args=(name,), name=name, daemon=True) for name in names]
    with common.taking_turns(turns):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    sys.stdout, sys.stderr = streams


def _child_peer(peer, cfg: Dict, case: Dict, spec: Dict) -> Dict:
    """One peer's result, in this process."""
    device = cfg["device"]
    is_torch = peer.name.startswith("torch")
    if is_torch:
        import torch

        torch.set_num_threads(cfg["threads"])
        if device == "gpu":
            torch.set_float32_matmul_precision(TORCH_F32[spec.get("f32_matmul", "tf32")])
    module, fn = peer.target.split(":")
    common.host_cpu_taken()  # this thread's, from the peer's own repetitions only
    result = getattr(importlib.import_module(module), fn)(peer.name, cfg, case)
    cpu = common.host_cpu_taken()
    if cpu and "values" in result:
        result.setdefault("extra", {})["host_cpu_ms"] = 1e3 * statistics.median(cpu)
    if not is_torch and "torch" in sys.modules:
        result.setdefault("extra", {})["warning"] = "torch was imported by a JAX peer"
    if device == "gpu":  # TF32 or not: the GPU tables show it per row
        result["f32_matmul"] = _f32_matmul_setting(is_torch)
    return result


def _f32_matmul_setting(is_torch: bool) -> str:
    """This process's float32 matmul setting, as the report prints it (child side)."""
    if is_torch:
        from benchmarks.common import torch_f32_settings

        t = torch_f32_settings()
        return (
            f"torch {t.get('float32_matmul_precision')} (matmul.allow_tf32="
            f"{t.get('matmul.allow_tf32')}, cudnn.allow_tf32={t.get('cudnn.allow_tf32')})"
        )
    import jax

    value = jax.config.jax_default_matmul_precision
    return f"jax {value or 'default'}"


# --------------------------------------------------------------------------- #
# Parent side
# --------------------------------------------------------------------------- #


def _child_env(args, cpus: List[int]) -> Dict[str, str]:
    """The environment of every child: thread counts, the platform, the matmul precision."""
    env = dict(os.environ)
    n = str(len(cpus))
    env.update(
        OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0"
    )
    if args.platform == "gpu":
        # One child at a time has the GPU: it takes memory as it needs it, as the tests do.
        env.update(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        if args.f32_matmul == "highest":
            env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    else:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def _shares_a_process(peer) -> bool:
    """Whether ``--same-process`` may run ``peer`` beside others: JAX peers with the run's
    XLA flags. A torch peer, or one with flags of its own, keeps a process to itself."""
    return not peer.name.startswith("torch") and not peer.xla_flags


def _process_groups(peers, same_process: bool) -> List[List]:
    """The peers of one round, as the processes that run them, in order: one each, or
    (``same_process``) the sharing peers together where the first of them stands."""
    if not same_process:
        return [[p] for p in peers]
    shared = [p for p in peers if _shares_a_process(p)]
    groups: List[List] = []
    for p in peers:
        if not _shares_a_process(p):
            groups.append([p])
        elif p is shared[0]:
            groups.append(shared)
    return groups


def _run_child(workload: Workload, case_index: int, peers, args, cpus: List[int]) -> List[Dict]:
    """One child process running ``peers`` (a list, in order; one peer unless
    ``--same-process``): each peer's result, an error in place of any it did not report."""
    spec = {
        "workload": workload.name,
        "case": case_index,
        "peers": [p.name for p in peers],
        "quick": args.quick,
        "cpus": cpus,
        "platform": args.platform,
        "reps": args.reps,
        "f32_matmul": args.f32_matmul,
        "interleave": getattr(args, "interleave", False),
    }
    env = _child_env(args, cpus)
    # Peers that share a process have no flags of their own (_shares_a_process).
    flags = " ".join(f for f in (env.get("XLA_FLAGS", ""), args.xla_flags, peers[0].xla_flags) if f)
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", json.dumps(spec)]
    t0, ticks = time.perf_counter(), common.cpu_ticks()
    try:
        stdout, stderr = _communicate(cmd, env, args.child_timeout)
    except subprocess.TimeoutExpired:
        return [{"error": f"timed out after {args.child_timeout:.0f} s"} for _ in peers]
    wall = time.perf_counter() - t0
    steal = common.steal_percent(ticks, common.cpu_ticks())
    reported = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG) :])
            reported[result.pop("peer")] = result
    tail = (stderr or stdout).strip().splitlines()
    last = next((l for l in reversed(tail) if l.strip()), "no output")
    failed = {"error": last[-300:], "stderr_tail": "\n".join(tail[-25:])}
    out = []
    for peer in peers:
        result = reported.get(peer.name)
        if result is None:
            out.append(dict(failed))
            continue
        result["process_wall_s"] = wall
        if steal is not None:
            result.setdefault("cpu_steal_pct", steal)  # a shared process measured each peer's own
        if flags:
            result["xla_flags"] = flags
        if len(peers) > 1:
            result["process_peers"] = spec["peers"]
        out.append(result)
    return out


def _communicate(cmd: List[str], env: Dict[str, str], timeout: float):
    """``(stdout, stderr)`` of ``cmd`` run in a session of its own. On a timeout or a
    Ctrl-C the whole session is killed: a peer's own children (torch.compile's compile
    workers) would otherwise outlive it, hold its pipes and, on a GPU, the device."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        start_new_session=True,
    )
    try:
        return proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise


def _merge(previous: Optional[Dict], new: Dict) -> Dict:
    """One peer's results over rounds: repetitions pooled, extras from the first good round,
    and ``rounds``: each round's median (None where it failed) and CPU steal, in order."""
    rounds = (previous or {}).get("rounds", []) + [_round(new)]
    if previous is None or "values" not in previous:
        merged = dict(new) if "values" in new or previous is None else dict(previous)
    elif "values" not in new:
        merged = dict(previous)
    else:
        merged = {**previous, "values": previous["values"] + new["values"]}
    merged["rounds"] = rounds
    return merged


def _round(result: Dict) -> Dict:
    median = common.summary(result["values"])["median"] if "values" in result else None
    return {
        "median": median,
        "cpu_steal_pct": result.get("cpu_steal_pct"),
        "values": result.get("values") if result.get("interleaved") else None,  # for the turn-by-turn pairs
    }


def _print_result(case, peer, r, workload) -> None:
    if "values" in r:
        s = common.summary(r["values"])
        print(
            f"  [{case['name']}] {peer.name:22s} median {_fmt_time(s['median'])} "
            f"(min {_fmt_time(s['min'])}, max {_fmt_time(s['max'])}, n={s['n']}) {workload.unit}"
            + (f", CPU steal {r['cpu_steal_pct']:.0f}%" if "cpu_steal_pct" in r else ""),
            flush=True,
        )
    else:
        print(f"  [{case['name']}] {peer.name:22s} ERROR: {r['error']}", flush=True)


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def _steal_cell(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.0f}"


# A table gets a column of the CPU steal in each round when some peer lost this much (in
# percent) of the machine's CPU time to other guests of a shared VM while it ran.
STEAL_SHOWN = 5.0


def _table(workload: Workload, case: Dict, results: Dict[str, Dict], matmul: bool = False) -> List[str]:
    """The case's markdown table; ``matmul`` adds each peer's float32 matmul setting (GPU)."""
    ref = results.get(workload.reference, {})
    ref_med = common.summary(ref["values"])["median"] if "values" in ref else None
    head = ["peer", f"median {workload.unit}", "min", "max"]
    if workload.throughput:
        head.append(workload.throughput)
    head.append(f"{workload.reference} ÷ peer (time)")
    head += [c[1] for c in workload.columns]
    if matmul:
        head.append("float32 matmuls")
    # Several rounds: the ratio within each round as well, where the two ran minutes apart
    # (the pooled medians mix rounds, and this machine drifts between them).
    per_round = len(ref.get("rounds", [])) > 1
    if per_round:
        head.append(f"{workload.reference} ÷ peer per round")
    # Interleaved: the ratio turn by turn, its median and 95% interval (common.median_ci),
    # which says whether a difference of a few percent is the peers' or the machine's.
    paired = any(rd.get("values") for rd in ref.get("rounds", []))
    if paired:
        head.append(f"{workload.reference} ÷ peer, turn by turn: median [95% CI] (pairs)")
    steals = [rd["cpu_steal_pct"] or 0 for r in results.values() for rd in r.get("rounds", [])]
    steal = max(steals, default=0) >= STEAL_SHOWN
    if steal:
        head.append("CPU steal per round (%)")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for peer in workload.peers:
        r = results.get(peer.name)
        if r is None:
            continue
        if "values" not in r:
            rows.append(f"| {peer.name} | unavailable: {r.get('error', '?')} |" + " |" * (len(head) - 2))
            continue
        s = common.summary(r["values"])
        cells = [peer.name, _fmt_time(s["median"]), _fmt_time(s["min"]), _fmt_time(s["max"])]
        if workload.throughput:
            cells.append(f"{1.0 / s['median']:.2f}")
        cells.append(f"{ref_med / s['median']:.2f}" if ref_med else "n/a")
        extra = r.get("extra", {})
        for key, _, fmt in workload.columns:
            v = extra.get(key)
            cells.append(fmt.format(v) if isinstance(v, (int, float)) else ("" if v is None else str(v)))
        if matmul:
            cells.append(r.get("f32_matmul", ""))
        if per_round:
            pairs = zip(ref["rounds"], r.get("rounds", []))
            cells.append(", ".join(f"{a['median'] / b['median']:.2f}" for a, b in pairs if a["median"] and b["median"]))
        if paired:
            cells.append(_paired_cell(ref, r) if r is not ref else "")
        if steal:
            cells.append(", ".join(_steal_cell(rd["cpu_steal_pct"]) for rd in r.get("rounds", [])))
        rows.append("| " + " | ".join(cells) + " |")
    check = _check(workload, results)
    if check:
        rows.append("")
        rows.append(check)
    return rows


def _paired_cell(ref: Dict, r: Dict) -> str:
    """``median [low, high] (n)`` of the turn-by-turn ratios of ``ref`` to ``r``."""
    ratios = common.paired_ratios(
        [rd.get("values") for rd in ref.get("rounds", [])], [rd.get("values") for rd in r.get("rounds", [])]
    )
    return common.median_ci_text(ratios) if ratios else ""


def _check(workload: Workload, results: Dict[str, Dict]) -> Optional[str]:
    """Peers start from the same weights and data, so ``workload.check`` must agree."""
    if not workload.check:
        return None
    vals = {
        p: r["extra"][workload.check]
        for p, r in results.items()
        if "extra" in r and isinstance(r["extra"].get(workload.check), (int, float))
    }
    if len(vals) < 2:
        return None
    lo, hi = min(vals.values()), max(vals.values())
    spread = (hi - lo) / max(abs(lo), abs(hi), 1e-12)
    ok = spread <= workload.check_rtol and all(math.isfinite(v) for v in vals.values())
    word = "OK" if ok else "MISMATCH"
    return (
        f"Consistency check ({workload.check}, same init and data for every peer): {word}, "
        f"relative spread {spread:.1e} (tolerance {workload.check_rtol:.0e})."
    )


def _selected(only: List[str], tier: str = "cpu"):
    """``(workload, peers, case indices)`` to run. The tier's peers and cases, narrowed by
    ``--only``; a peer named there (``NAME:PEER``) runs whatever its tier."""
    wanted: Dict[str, Optional[List[str]]] = {}
    for item in only:
        name, _, peer = item.partition(":")
        if name not in by_name():
            raise SystemExit(f"--only: unknown workload {name!r}; choose from {', '.join(by_name())}.")
        if peer:
            known = {p.name for p in by_name()[name].peers}
            if peer not in known:
                raise SystemExit(f"--only: workload {name!r} has no peer {peer!r}; peers: {', '.join(known)}.")
            if wanted.get(name, []) is not None and peer not in wanted.get(name, []):
                wanted.setdefault(name, []).append(peer)
        else:
            wanted[name] = None
    for w in WORKLOADS:
        if only and w.name not in wanted:
            continue
        named = wanted.get(w.name)
        # named peers run in the order given (a slow one last, say); the tables keep the registry's
        peers = [next(p for p in w.peers if p.name == n) for n in named] if named else peers_on(w, tier)
        cases = cases_on(w, tier)
        if peers and cases:
            yield w, peers, cases
        elif only:
            print(f"{w.name}: nothing to run in the {tier} tier", flush=True)


def _header_info(args, cpus, command: str) -> Dict:
    """What the report header and the JSON record about this run (the machine, versions,
    settings; on the GPU tier the device as jax and torch see it, from child probes)."""
    info = {
        "command": command,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "platform": args.platform,
        "tier": args.tier,
        "quick": args.quick,
        "rounds": args.rounds,
        "same_process": args.same_process,
        "interleave": args.interleave,
        "reps_cap": args.reps,
        "machine": common.cpu_info(),
        "versions": common.package_versions(),
        "cpus": cpus,
        "xla_flags": args.xla_flags,
        "environment": {k: os.environ[k] for k in ENV_RECORDED if k in os.environ},
    }
    if "gpu" in (args.platform, args.tier):
        info["f32_matmul"] = args.f32_matmul
        if args.probe_from:  # benchmarks.gpu probed once for all its runs
            with open(args.probe_from) as f:
                info["probe"] = json.load(f)
        else:
            info["probe"] = common.device_probe(args.platform, env=_child_env(args, cpus))
        info["device"] = common.device_summary(info["probe"])
    return info


def _header(info: Dict) -> List[str]:
    cpu, cpus = info["machine"], info["cpus"]
    lines = ["# funcnet benchmarks" + (" (GPU tier)" if info["tier"] == "gpu" else ""), ""]
    if info["quick"]:
        lines += [
            "**QUICK MODE** (`--quick`): few steps and repetitions, a smoke check of the harness, not a benchmark.",
            "",
        ]
    if info["tier"] != info["platform"]:
        lines += [
            f"**REHEARSAL**: the {info['tier']} tier's peers run on the {info['platform']}; "
            "the numbers say nothing about either.",
            "",
        ]
    lines += [
        f"Command: `{info['command']}`  ",
        f"Date: {info['date']}  ",
        f"Machine: {cpu['model']}, {cpu['logical_cpus']} logical CPUs "
        f"({cpu['usable_cpus']} usable), ISA: {', '.join(cpu['isa']) or 'n/a'}; {cpu['platform']}  ",
    ]
    if info["platform"] == "gpu":
        lines.append(
            f"Threads: no CPU affinity set; OMP/MKL_NUM_THREADS and torch.set_num_threads"
            f"({len(cpus)}) bound the host-side thread pools. JAX_PLATFORMS=cuda, "
            "XLA_PYTHON_CLIENT_PREALLOCATE=false.  "
        )
    else:
        lines.append(
            f"Threads: every peer process pinned to CPUs {cpus} ({len(cpus)} threads): CPU affinity "
            f"(sizes XLA's thread pool), OMP/MKL_NUM_THREADS and torch.set_num_threads({len(cpus)}).  "
        )
    if "device" in info:
        lines += [
            f"Device: {info['device']['device']}  ",
            f"CUDA: {info['device']['cuda']}  ",
            "Float32 matmuls: " + _f32_words(info) + "  ",
        ]
    lines += [
        "Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()) + "  ",
        f"Extra XLA_FLAGS: `{info['xla_flags']}`  " if info["xla_flags"] else "Extra XLA_FLAGS: none  ",
        "Environment: "
        + (", ".join(f"`{k}={v}`" for k, v in info["environment"].items()) or "no allocator/XLA variables set")
        + "  ",
        "",
        (
            f"Each round, a case's JAX peers share one fresh process and take turns, one "
            f"timed repetition each, round and round (torch peers and peers with XLA flags "
            f"of their own in processes of their own), {info['rounds']} round(s), in "
            f"alternating peer order"
            if info.get("interleave")
            else f"Each round, a case's JAX peers run one after another in one fresh process "
            f"(torch peers and peers with XLA flags of their own in processes of their own), "
            f"{info['rounds']} round(s), in alternating peer order"
            if info.get("same_process")
            else f"Each (workload, case, peer) runs in a fresh process, one at a time, {info['rounds']} "
            f"time(s), in alternating peer order"
        )
        + (f", at most {info['reps_cap']} repetitions each" if info["reps_cap"] else "")
        + ". Times are medians over all repetitions after a "
        "warm-up that includes compilation; min and max are shown. "
        "Ratio = reference median time ÷ peer median time (> 1: the reference is slower). "
        "Synthetic MNIST-shaped data, already on the device: no data loading is timed.",
        "",
    ]
    return lines


def _f32_words(info: Dict) -> str:
    """The header's sentence on float32 matmul precision (TF32 or not, for jax and torch)."""
    if info["platform"] != "gpu":
        return "full float32 (CPU defaults; TF32 and --f32-matmul concern GPUs only)."
    if info["f32_matmul"] == "highest":
        return (
            "full float32 for both: JAX_DEFAULT_MATMUL_PRECISION=highest, "
            "torch.set_float32_matmul_precision('highest')."
        )
    return (
        "TF32 for both: jax at XLA's default precision (jax_default_matmul_precision unset: "
        "TF32 on NVIDIA GPUs from Ampere on), torch set to match with "
        "torch.set_float32_matmul_precision('high') (matmul.allow_tf32; cuDNN's convolutions "
        "allow TF32 by default). Each row's setting is in its 'float32 matmuls' column."
    )


def _epilog() -> str:
    names = "\n".join(f"  {w.name:15s} {w.title}" for w in WORKLOADS)
    return (
        f"workloads (NAME for --only; --list also shows their peers):\n{names}\n\n"
        "examples:\n"
        "  python -m benchmarks.run --only fit                  # one workload, every peer\n"
        "  python -m benchmarks.run --platform gpu --rounds 1 --reps 2 --only mlp gpt\n"
        "  python -m benchmarks.run --platform cpu --tier gpu --quick --only mlp  # rehearsal\n"
        "  python -m benchmarks.run --only mlp dispatch cnn fit precision --out /tmp/part.md\n"
        "  python -m benchmarks.run --only cnn:funcnet cnn:torch --rounds 3\n\n"
        "--out writes a report of the selected workloads only (with the header: machine,\n"
        "versions, command); to refresh part of BENCHMARKS.md, write elsewhere and paste\n"
        "the sections in."
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__.split("\n")[0],
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="few steps and reps: a smoke check")
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="NAME[:PEER]",
        help="workloads (optionally workload:peer) to run; default: all",
    )
    parser.add_argument("--out", default=None, help="markdown report to write (e.g. BENCHMARKS.md)")
    parser.add_argument("--json", default=None, help="also dump raw results as JSON here")
    parser.add_argument("--threads", type=int, default=None, help="CPUs per peer process (default: all usable)")
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for every peer process")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="run every peer this many times, alternating the order (default 2); repetitions are pooled",
    )
    parser.add_argument(
        "--platform",
        choices=("cpu", "gpu"),
        default="cpu",
        help="where the peers run (default cpu; gpu: JAX on CUDA, torch on cuda)",
    )
    parser.add_argument(
        "--tier",
        choices=("cpu", "gpu"),
        default=None,
        help="which peers and cases (workloads.py's platforms; default: --platform's)",
    )
    parser.add_argument("--reps", type=int, default=None, help="at most this many timed repetitions per peer and round")
    parser.add_argument(
        "--f32-matmul",
        choices=tuple(TORCH_F32),
        default="tf32",
        help="on a GPU: float32 matmuls as TF32 for jax and torch (default: XLA's "
        "default, torch set to match) or full float32 (highest)",
    )
    parser.add_argument(
        "--child-timeout",
        type=float,
        default=CHILD_TIMEOUT_S,
        help=f"seconds before a peer's process is stopped (default {CHILD_TIMEOUT_S})",
    )
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="each round, run a case's JAX peers one after another in one process (torch "
        "peers and peers with XLA flags of their own still alone): the per-round ratios "
        "then compare peers that ran in the same process",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="--same-process, the peers taking turns: each round, one timed repetition "
        "(an epoch, or a timed call) of each peer in turn, round and round, so that the "
        "machine's drift falls on all of them alike",
    )
    parser.add_argument("--list", action="store_true", help="list workloads and peers, then exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-from", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tier = args.tier or args.platform
    args.same_process = args.same_process or args.interleave

    if args.child:
        _child(json.loads(args.child))
        return 0
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name}: {w.title}")
            for p in w.peers:
                tiers = "" if len(p.platforms) > 1 else f" [{p.platforms[0]} tier only]"
                print(f"    {p.name:22s} {p.note}{' [XLA_FLAGS ' + p.xla_flags + ']' if p.xla_flags else ''}{tiers}")
        return 0

    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    threads = args.threads or len(usable)
    if not 1 <= threads <= len(usable):
        raise SystemExit(f"--threads must be between 1 and {len(usable)}, got {threads}.")
    cpus = usable[:threads]
    words = argv if argv is not None else sys.argv[1:]
    command = "python -m benchmarks.run " + " ".join(shlex.quote(a) for a in words)
    info = _header_info(args, cpus, command.strip())
    lines = _header(info)
    if "device" in info:
        print(f"device: {info['device']['device']}\nCUDA: {info['device']['cuda']}", flush=True)
    raw: List[Dict] = []
    interrupted = False
    for workload, peers, case_indices in _selected(args.only, args.tier):
        section, interrupted = _run_workload(workload, peers, case_indices, args, cpus, info, raw)
        lines += section
        if interrupted:
            break
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines).rstrip() + "\n")
        print(f"\nwrote {args.out}")
    if args.json:
        _write_json(args.json, info, raw)
    return 130 if interrupted else 0


def _run_workload(
    workload: Workload, peers, case_indices: List[int], args, cpus: List[int], info: Dict, raw: List[Dict]
):
    """The workload's report section and whether a Ctrl-C (or benchmarks.gpu's stage
    timeout, a SIGINT) stopped it; ``raw`` gets every child's result as it comes."""
    title = title_on(workload, args.tier)
    print(f"\n== {title}", flush=True)
    lines = [f"## {title}", ""]
    if workload.notes:
        lines += [workload.notes, ""]
    interrupted = False
    for ci in case_indices:
        case = workload.cases[ci]
        results: Dict[str, Dict] = {}
        # A case may leave out peers that have nothing to run for it (a framework's own
        # version of another network).
        case_peers = [p for p in peers if p.name not in case.get("skip_peers", ())]
        try:
            for rnd in range(args.rounds):
                # Odd rounds run the peers in reverse order, so no peer always goes first
                # (between processes, this machine's timings drift by 10-20 %).
                order = case_peers if rnd % 2 == 0 else case_peers[::-1]
                for group in _process_groups(order, args.same_process):
                    for peer, r in zip(group, _run_child(workload, ci, group, args, cpus)):
                        raw.append(
                            {"workload": workload.name, "case": case["name"], "peer": peer.name, "round": rnd, **r}
                        )
                        results[peer.name] = _merge(results.get(peer.name), r)
                        _print_result(case, peer, r, workload)
                    if args.json:  # after every process: a run stopped midway keeps what it measured
                        _write_json(args.json, info, raw)
        except KeyboardInterrupt:
            interrupted = True
        table = [f"### {case['name']}", ""]
        if interrupted:
            table += ["**Interrupted**: the run was stopped here; peers missing below did not run.", ""]
        table += _table(workload, case, results, matmul=args.platform == "gpu") + [""]
        print("\n".join(table), flush=True)
        lines += table
        if interrupted:
            break
    notes = [
        f"- `{p.name}`: {p.note}" + (f" (XLA_FLAGS `{p.xla_flags}`)" if p.xla_flags else "")
        for p in peers
        if p.note or p.xla_flags
    ]
    if notes:
        lines += ["Peers:", ""] + notes + [""]
    return lines, interrupted


def _write_json(path: str, info: Dict, raw: List[Dict]) -> None:
    """``{"header": ..., "results": [...]}``, replaced whole (written aside, then renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"header": info, "results": raw}, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    # SIGTERM as Ctrl-C: the running peer's session is killed and the report written
    # (benchmarks.gpu stops an overrunning stage with SIGINT, then SIGTERM).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
