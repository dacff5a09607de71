"""Runs the benchmark workloads and writes a markdown report.

    python -m benchmarks.run [--quick] [--only NAME[:PEER] ...] [--threads N] [--rounds R] [--out BENCHMARKS.md]

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
import subprocess
import sys
import time
from typing import Dict, List, Optional

from benchmarks import common
from benchmarks.workloads import WORKLOADS, Workload, by_name

RESULT_TAG = "BENCHMARK_RESULT_JSON:"
# Variables that change the numbers; the report records those that are set.
ENV_RECORDED = ("XLA_FLAGS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX",
                "LD_PRELOAD", "OMP_NUM_THREADS", "JAX_ENABLE_X64")
CHILD_TIMEOUT_S = 1800


# --------------------------------------------------------------------------- #
# Child side
# --------------------------------------------------------------------------- #

def _child(spec: Dict) -> None:
    cpus = spec["cpus"]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # before jax/torch create their thread pools
    workload = by_name()[spec["workload"]]
    case = dict(workload.cases[spec["case"]])
    if spec["quick"]:
        case.update({k[len("quick_"):]: v for k, v in case.items() if k.startswith("quick_")})
    peer = next(p for p in workload.peers if p.name == spec["peer"])
    cfg = {"quick": spec["quick"], "threads": len(cpus)}
    if "torch" in peer.name:
        import torch
        torch.set_num_threads(len(cpus))
    module, fn = peer.target.split(":")
    result = getattr(importlib.import_module(module), fn)(peer.name, cfg, case)
    if "torch" not in peer.name and "torch" in sys.modules:
        result.setdefault("extra", {})["warning"] = "torch was imported by a JAX peer"
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- #
# Parent side
# --------------------------------------------------------------------------- #

def _run_child(workload: Workload, case_index: int, peer, args, cpus: List[int]) -> Dict:
    spec = {"workload": workload.name, "case": case_index, "peer": peer.name,
            "quick": args.quick, "cpus": cpus}
    env = dict(os.environ)
    n = str(len(cpus))
    env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n,
               JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONHASHSEED="0")
    flags = " ".join(f for f in (env.get("XLA_FLAGS", ""), args.xla_flags, peer.xla_flags) if f)
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CHILD_TIMEOUT_S} s"}
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            result["process_wall_s"] = wall
            if flags:
                result["xla_flags"] = flags
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    last = next((l for l in reversed(tail) if l.strip()), "no output")
    return {"error": last[-300:], "stderr_tail": "\n".join(tail[-25:])}


def _merge(previous: Optional[Dict], new: Dict) -> Dict:
    """One peer's results over rounds: repetitions pooled, extras from the first good round."""
    if previous is None or "values" not in previous:
        return dict(new) if "values" in new or previous is None else previous
    if "values" not in new:
        return previous
    return {**previous, "values": previous["values"] + new["values"]}


def _print_result(case, peer, r, workload) -> None:
    if "values" in r:
        s = common.summary(r["values"])
        print(f"  [{case['name']}] {peer.name:22s} median {_fmt_time(s['median'])} "
              f"(min {_fmt_time(s['min'])}, max {_fmt_time(s['max'])}, n={s['n']}) {workload.unit}",
              flush=True)
    else:
        print(f"  [{case['name']}] {peer.name:22s} ERROR: {r['error']}", flush=True)


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def _table(workload: Workload, case: Dict, results: Dict[str, Dict]) -> List[str]:
    ref = results.get(workload.reference, {})
    ref_med = common.summary(ref["values"])["median"] if "values" in ref else None
    head = ["peer", f"median {workload.unit}", "min", "max"]
    if workload.throughput:
        head.append(workload.throughput)
    head.append(f"{workload.reference} ÷ peer (time)")
    head += [c[1] for c in workload.columns]
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
        rows.append("| " + " | ".join(cells) + " |")
    check = _check(workload, results)
    if check:
        rows.append("")
        rows.append(check)
    return rows


def _check(workload: Workload, results: Dict[str, Dict]) -> Optional[str]:
    """Peers start from the same weights and data, so ``workload.check`` must agree."""
    if not workload.check:
        return None
    vals = {p: r["extra"][workload.check] for p, r in results.items()
            if "extra" in r and isinstance(r["extra"].get(workload.check), (int, float))}
    if len(vals) < 2:
        return None
    lo, hi = min(vals.values()), max(vals.values())
    spread = (hi - lo) / max(abs(lo), abs(hi), 1e-12)
    ok = spread <= workload.check_rtol and all(math.isfinite(v) for v in vals.values())
    word = "OK" if ok else "MISMATCH"
    return (f"Consistency check ({workload.check}, same init and data for every peer): {word}, "
            f"relative spread {spread:.1e} (tolerance {workload.check_rtol:.0e}).")


def _selected(only: List[str]):
    wanted: Dict[str, Optional[set]] = {}
    for item in only:
        name, _, peer = item.partition(":")
        if name not in by_name():
            raise SystemExit(f"--only: unknown workload {name!r}; choose from {', '.join(by_name())}.")
        if peer:
            known = {p.name for p in by_name()[name].peers}
            if peer not in known:
                raise SystemExit(f"--only: workload {name!r} has no peer {peer!r}; peers: {', '.join(known)}.")
            if wanted.get(name, set()) is not None:
                wanted.setdefault(name, set()).add(peer)
        else:
            wanted[name] = None
    for w in WORKLOADS:
        if not only or w.name in wanted:
            peers = [p for p in w.peers if not only or wanted[w.name] is None or p.name in wanted[w.name]]
            yield w, peers


def _header(args, cpus, command: str) -> List[str]:
    cpu = common.cpu_info()
    versions = common.package_versions()
    lines = ["# funcnet benchmarks", ""]
    if args.quick:
        lines += ["**QUICK MODE** (`--quick`): few steps and repetitions, a smoke check of the harness, "
                  "not a benchmark.", ""]
    lines += [
        f"Command: `{command}`  ",
        f"Date: {datetime.datetime.now().isoformat(timespec='seconds')}  ",
        f"Machine: {cpu['model']}, {cpu['logical_cpus']} logical CPUs "
        f"({cpu['usable_cpus']} usable), ISA: {', '.join(cpu['isa']) or 'n/a'}; {cpu['platform']}  ",
        f"Threads: every peer process pinned to CPUs {cpus} ({len(cpus)} threads): CPU affinity "
        f"(sizes XLA's thread pool), OMP/MKL_NUM_THREADS and torch.set_num_threads({len(cpus)}).  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + "  ",
        f"Extra XLA_FLAGS: `{args.xla_flags}`  " if args.xla_flags else "Extra XLA_FLAGS: none  ",
        "Environment: " + (", ".join(f"`{k}={os.environ[k]}`" for k in ENV_RECORDED if k in os.environ)
                           or "no allocator/XLA variables set") + "  ",
        "",
        f"Each (workload, case, peer) runs in a fresh process, one at a time, {args.rounds} "
        f"time(s), in alternating peer order. Times are medians over all repetitions after a "
        f"warm-up that includes compilation; min and max are shown. "
        "Ratio = reference median time ÷ peer median time (> 1: the reference is slower). "
        "Synthetic MNIST-shaped data, already on the device: no data loading is timed.",
        "",
    ]
    return lines


def _epilog() -> str:
    names = "\n".join(f"  {w.name:15s} {w.title}" for w in WORKLOADS)
    return (f"workloads (NAME for --only; --list also shows their peers):\n{names}\n\n"
            "examples:\n"
            "  python -m benchmarks.run --only fit                  # one workload, every peer\n"
            "  python -m benchmarks.run --only mlp dispatch cnn fit precision --out /tmp/part.md\n"
            "  python -m benchmarks.run --only cnn:funcnet cnn:torch --rounds 3\n\n"
            "--out writes a report of the selected workloads only (with the header: machine,\n"
            "versions, command); to refresh part of BENCHMARKS.md, write elsewhere and paste\n"
            "the sections in.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0],
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few steps and reps: a smoke check")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME[:PEER]",
                        help="workloads (optionally workload:peer) to run; default: all")
    parser.add_argument("--out", default=None, help="markdown report to write (e.g. BENCHMARKS.md)")
    parser.add_argument("--json", default=None, help="also dump raw results as JSON here")
    parser.add_argument("--threads", type=int, default=None, help="CPUs per peer process (default: all usable)")
    parser.add_argument("--xla-flags", default="", help="extra XLA_FLAGS for every peer process")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every peer this many times, alternating the order (default 2); "
                             "repetitions are pooled")
    parser.add_argument("--list", action="store_true", help="list workloads and peers, then exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        _child(json.loads(args.child))
        return 0
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name}: {w.title}")
            for p in w.peers:
                print(f"    {p.name:22s} {p.note}{' [XLA_FLAGS ' + p.xla_flags + ']' if p.xla_flags else ''}")
        return 0

    usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    threads = args.threads or len(usable)
    if not 1 <= threads <= len(usable):
        raise SystemExit(f"--threads must be between 1 and {len(usable)}, got {threads}.")
    cpus = usable[:threads]
    command = "python -m benchmarks.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    lines = _header(args, cpus, command.strip())
    raw = []
    for workload, peers in _selected(args.only):
        print(f"\n== {workload.title}", flush=True)
        lines += [f"## {workload.title}", ""]
        if workload.notes:
            lines += [workload.notes, ""]
        for ci, case in enumerate(workload.cases):
            results: Dict[str, Dict] = {}
            for rnd in range(args.rounds):
                # Odd rounds run the peers in reverse order, so no peer always goes first
                # (between processes, this machine's timings drift by 10-20 %).
                for peer in (peers if rnd % 2 == 0 else peers[::-1]):
                    r = _run_child(workload, ci, peer, args, cpus)
                    raw.append({"workload": workload.name, "case": case["name"], "peer": peer.name,
                                "round": rnd, **r})
                    results[peer.name] = _merge(results.get(peer.name), r)
                    _print_result(case, peer, r, workload)
            table = [f"### {case['name']}", ""] + _table(workload, case, results) + [""]
            print("\n".join(table), flush=True)
            lines += table
        notes = [f"- `{p.name}`: {p.note}" + (f" (XLA_FLAGS `{p.xla_flags}`)" if p.xla_flags else "")
                 for p in peers if p.note or p.xla_flags]
        if notes:
            lines += ["Peers:", ""] + notes + [""]
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines).rstrip() + "\n")
        print(f"\nwrote {args.out}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
