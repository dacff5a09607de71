"""The GPU tier in one command, within a time budget.

    python -m benchmarks.gpu [--out DIR] [--budget-s 480] [--stages ...] [--nanogpt-dir PATH]
    python -m benchmarks.gpu --rehearse      # the same stages on the CPU, tiny (seconds)

Run from the repository root (``PYTHONPATH=.`` is enough: nothing is installed). Stages, in
order, each in child processes with a timeout of its own; a stage that fails or runs out of
time is recorded as such and the next one runs:

1. ``device``: the GPU as jax and torch see it (device kind and name, compute capability),
   CUDA and cuDNN versions, jax/jaxlib/torch versions, the float32 matmul defaults
   (XLA's TF32 on NVIDIA GPUs, torch's ``allow_tf32``), ``nvidia-smi``'s line.
2. ``suite``: the test suite's GPU line, ``JAX_PLATFORMS=cuda python -m pytest`` on a fast
   subset of files (layers, attention, train, loop, precision, export; ``-n 4`` where
   pytest-xdist is installed); its summary line is kept.
3. ``mlp``, ``cnn``, ``fit``, ``gpt``: workloads 1, 3, 6 and 9 through ``benchmarks.run
   --platform gpu`` (one round, at most 2 timed repetitions per peer), one
   ``benchmarks.run`` per workload; the peers are :data:`GPU_PEERS`.
4. ``shakespeare-bf16``: ``examples/shakespeare_char.py`` at nanoGPT's GPU configuration
   for 2000 iterations, bfloat16; its ``step``/``iter``/``compile`` lines are parsed.
5. ``nanogpt`` (only with a nanoGPT checkout, ``--nanogpt-dir``, and torch): nanoGPT's own
   ``train.py`` on the same configuration (bfloat16, ``compile=True``), same parsing.
6. ``shakespeare-f32``: the example again in float32, if the budget still allows.
7. ``fit-nets``: workload 6b (``fit`` on the Flax CNN, LeNet and the GPT, with and without
   the loop on the device, against a bare loop), if the budget still allows.

Everything goes to ``DIR/gpu-results.json`` and ``DIR/gpu-report.md`` (rewritten after
every stage, so a run stopped from outside keeps what it measured), the children's output
to ``DIR/logs/``. ``DIR`` defaults to ``$OUT`` where set, else ``runs/gpu``.

Budget: each stage has a cap and a reserve (the least worth starting it with), both
scaled by ``--budget-s / 480``; a stage's timeout is its cap, or less where the stages
after it need their reserves. Optional stages (nanoGPT, float32) run only on what is left.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Workloads 1, 3, 6 and 9 on the GPU, and their peers there (benchmarks/workloads.py), in
# the order they run: torch.compile last, so that a slow compilation cuts no other peer.
GPU_PEERS: Dict[str, Sequence[str]] = {
    "mlp": ("funcnet", "jax", "torch", "funcnet-bf16", "torch-bf16"),
    "cnn": ("funcnet", "jax-nhwc", "torch", "funcnet-bf16", "torch-bf16"),
    "fit": ("fit-device", "fit", "train-step", "jax", "jax-scan"),
    "gpt": ("funcnet", "funcnet-bf16", "funcnet-loop", "jax", "torch", "torch-bf16", "torch-compile"),
    # workload 6b: whether fit's loop on the device pays on a GPU for each family
    "fit-nets": ("fit-device", "fit-device-loop", "jit-loop"),
}
# The rehearsal runs fewer: each process costs seconds on a small CPU, and what it checks
# is this script and the GPU tier's own code paths (bfloat16 peers, the GPU-sized GPT case
# shrunk by --quick), not the peers the CPU tier runs anyway. torch.compile is left out:
# on a CPU it compiles C++ for minutes.
REHEARSAL_PEERS: Dict[str, Sequence[str]] = {
    "mlp": ("funcnet-bf16", "torch-bf16"),
    "cnn": ("funcnet-bf16", "torch-bf16"),
    "fit": ("fit-device",),
    "gpt": ("funcnet-bf16", "torch-bf16"),
    "fit-nets": ("fit-device",),
}
# A fast subset of the suite that still reaches the GPU through layers (dense, cuDNN's
# convolutions, attention), the train step, fit's loop, mixed precision, export and the
# compiler options: 8 files, 3.4 min in one process on this project's 2-core CPU VM.
SUITE_FILES = (
    "tests/test_layers_dense.py",
    "tests/test_layers_conv.py",
    "tests/test_layers_attention.py",
    "tests/test_train.py",
    "tests/test_loop.py",
    "tests/test_precision.py",
    "tests/test_inference_export.py",
    "tests/test_xla.py",
)
REHEARSAL_SUITE_FILES = ("tests/test_layers_dense.py",)
# nanoGPT's config/train_shakespeare_char.py is the example's default (6 x 384, block 256,
# batch 64, dropout 0.2); these are the run's length and logging.
SHAKESPEARE_GPU = (
    "--max-iters=2000",
    "--lr-decay-iters=2000",
    "--eval-interval=500",
    "--eval-iters=100",
    "--log-interval=100",
    "--sample-tokens=0",
)
SHAKESPEARE_REHEARSAL = (
    "--max-iters=20",
    "--lr-decay-iters=20",
    "--n-layer=1",
    "--n-embd=32",
    "--n-head=2",
    "--block-size=16",
    "--batch-size=4",
    "--eval-iters=2",
    "--eval-interval=10",
    "--log-interval=10",
    "--sample-tokens=0",
)
NANOGPT_GPU = (
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--eval_interval=500",
    "--eval_iters=100",
    "--log_interval=100",
    "--dtype=bfloat16",
    "--compile=True",
    "--always_save_checkpoint=False",
)
NANOGPT_REHEARSAL = (
    "--max_iters=20",
    "--lr_decay_iters=20",
    "--n_layer=1",
    "--n_embd=32",
    "--n_head=2",
    "--block_size=16",
    "--batch_size=4",
    "--eval_iters=2",
    "--eval_interval=10",
    "--log_interval=10",
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--always_save_checkpoint=False",
)

# name, cap (s), reserve (s), optional - for a 480 s budget, scaled with --budget-s.
# Estimates for one H100 (guesses: nothing has been measured on a GPU yet), 5-7 s per
# process start: device ~15 s; suite 60-120 s; mlp and cnn ~35 s (5 processes each);
# fit ~65 s (10 processes); gpt ~130 s (compilation, torch.compile's above all); the
# 2000-iteration Shakespeare run ~60-100 s in bfloat16. Mandatory reserves add up to
# 315 s; a stage that times out may overrun by its 25 s of stop grace, so 480 s leaves
# 2 minutes of a 10-minute device call for the start and the copies.
PLAN = (
    ("device", 45, 15, False),
    ("suite", 150, 45, False),
    ("mlp", 50, 25, False),
    ("cnn", 50, 25, False),
    ("fit", 80, 35, False),
    ("gpt", 150, 60, False),
    ("shakespeare-bf16", 180, 110, False),
    ("nanogpt", 180, 100, True),
    ("shakespeare-f32", 180, 110, True),
    ("fit-nets", 90, 40, True),
)
PLAN_BUDGET_S = 480
STAGE_GROUPS = {"workloads": tuple(GPU_PEERS), "shakespeare": ("shakespeare-bf16", "shakespeare-f32")}
MIN_TIMEOUT_S = 5  # below this a stage is not started


# --------------------------------------------------------------------------- #
# Parsers (pure: unit-tested on literal strings)
# --------------------------------------------------------------------------- #

_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|warnings?|deselected)")
_PYTEST_SUMMARY = re.compile(r"^[= ]*((?:\d+ \w+(?:, )?)+|no tests ran) in ([\d.]+)s")


def parse_pytest_summary(text: str) -> Optional[Dict]:
    """pytest's last summary line (``5 passed, 1 skipped in 12.34s``, with or without the
    ``===`` frame) as ``{"line", "counts": {"passed": 5, ...}, "seconds"}``; ``None``
    without one. ``interrupted`` is set when pytest was stopped (KeyboardInterrupt)."""
    found = None
    for line in text.splitlines():
        m = _PYTEST_SUMMARY.match(line.strip())
        if m:
            found = (line.strip().strip("= ").strip(), m)
    if found is None:
        return None
    line, m = found
    counts: Dict[str, int] = {}
    for n, word in _PYTEST_COUNT.findall(m.group(1)):
        word = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[word] = counts.get(word, 0) + int(n)
    return {
        "line": line,
        "counts": counts,
        "seconds": float(m.group(2)),
        "interrupted": "KeyboardInterrupt" in text or "Interrupted:" in text,
    }


_NUM = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)"
_EVAL = re.compile(rf"step (\d+): train loss {_NUM}, val loss {_NUM}")
_ITER = re.compile(rf"iter (\d+): loss {_NUM}, time {_NUM}\s*ms(?:, mfu {_NUM}\s*%)?")
_COMPILE = re.compile(rf"^compil\w*(?: time)?\s*:\s*{_NUM}\s*s\b", re.IGNORECASE)
_TOOK = re.compile(rf"training took {_NUM}\s*s")
_PARAMS = re.compile(rf"number of parameters: {_NUM}\s*M")
_SETTING = re.compile(r"^(dtype|attention): (.+)$")  # the example says which paths it takes


def parse_training_log(text: str) -> Dict:
    """The lines examples/shakespeare_char.py and nanoGPT's train.py print, read tolerantly
    (other lines ignored): ``step N: train loss X, val loss Y`` -> ``evals``; ``iter N: loss
    X, time Yms[, mfu Z%]`` -> ``iters``; ``compile: X s`` -> ``compile_s``; ``training
    took X s``; ``number of parameters: X M``."""
    out: Dict = {"evals": [], "iters": [], "compile_s": None, "training_s": None, "params_m": None, "settings": {}}
    for raw in text.splitlines():
        line = raw.strip()
        if m := _EVAL.search(line):
            out["evals"].append(
                {"step": int(m.group(1)), "train_loss": float(m.group(2)), "val_loss": float(m.group(3))}
            )
        elif m := _ITER.search(line):
            out["iters"].append(
                {
                    "iter": int(m.group(1)),
                    "loss": float(m.group(2)),
                    "time_ms": float(m.group(3)),
                    "mfu_pct": float(m.group(4)) if m.group(4) else None,
                }
            )
        elif m := _COMPILE.search(line):
            out["compile_s"] = float(m.group(1))
        elif m := _TOOK.search(line):
            out["training_s"] = float(m.group(1))
        elif m := _PARAMS.search(line):
            out["params_m"] = float(m.group(1))
        elif m := _SETTING.match(line):
            out["settings"][m.group(1)] = m.group(2)
    return out


def summarize_training(parsed: Dict) -> Dict:
    """The figures a report shows: last train/val loss, the median ms per iteration and
    MFU over the logged intervals after the first (the first holds the compilation;
    nanoGPT's MFU is -100 % until its 5th iteration)."""
    evals, iters = parsed["evals"], parsed["iters"]
    later = [i for i in iters if i["iter"] > 0] or iters
    mfus = [i["mfu_pct"] for i in later if i["mfu_pct"] is not None and i["mfu_pct"] >= 0]
    return {
        "last_step": evals[-1]["step"] if evals else None,
        "train_loss": evals[-1]["train_loss"] if evals else None,
        "val_loss": evals[-1]["val_loss"] if evals else None,
        "median_ms_per_iter": statistics.median(i["time_ms"] for i in later) if later else None,
        "median_mfu_pct": statistics.median(mfus) if mfus else None,
        "compile_s": parsed["compile_s"],
        "training_s": parsed["training_s"],
    }


def rejected_flag(text: str, flag: str) -> bool:
    """argparse's refusal of ``flag`` (an example that does not know it yet)."""
    return "unrecognized arguments" in text and flag in text


# --------------------------------------------------------------------------- #
# Budget
# --------------------------------------------------------------------------- #


def plan_timeouts(budget_s: float, selected: Sequence[str]) -> List[Dict]:
    """The selected stages in order with their cap and reserve scaled to ``budget_s``."""
    scale = budget_s / PLAN_BUDGET_S
    return [
        {"name": n, "cap": cap * scale, "reserve": res * scale, "optional": opt}
        for n, cap, res, opt in PLAN
        if n in selected
    ]


def stage_timeout(plan: List[Dict], index: int, left_s: float) -> Optional[float]:
    """Seconds stage ``index`` may take with ``left_s`` left, keeping the reserves of the
    mandatory stages after it; ``None``: not worth starting (an optional stage also needs
    its own reserve)."""
    stage = plan[index]
    after = sum(s["reserve"] for s in plan[index + 1 :] if not s["optional"])
    room = left_s - after
    if stage["optional"] and room < stage["reserve"]:
        return None
    timeout = min(stage["cap"], room)
    return timeout if timeout >= MIN_TIMEOUT_S else None


# --------------------------------------------------------------------------- #
# Running children
# --------------------------------------------------------------------------- #


@dataclass
class Ctx:
    out: str
    rehearse: bool
    nanogpt_dir: Optional[str]
    env: Dict[str, str] = field(default_factory=dict)
    results: Dict = field(default_factory=dict)

    @property
    def platform(self) -> str:
        return "cpu" if self.rehearse else "gpu"


def child_env(rehearse: bool) -> Dict[str, str]:
    """The children's environment: the repository importable without an install, the
    platform, no pre-allocation (the default would take 75 % of the GPU per process);
    variables a surrounding pytest run set for itself are dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "FUNCNET_TEST_XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    env["JAX_PLATFORMS"] = "cpu" if rehearse else "cuda"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"  # progress lines arrive as they are printed
    return env


def run_command(
    cmd: Sequence[str], env: Dict[str, str], timeout: float, log_path: str, prefix: str = "  | ", cwd: str = ROOT
) -> Dict:
    """Runs ``cmd`` in a session of its own, its output echoed and written to ``log_path``.

    On timeout the whole process group gets SIGINT (pytest and benchmarks.run then print
    what they have), then SIGTERM, then SIGKILL: a plain kill of the child would leave its
    own children (xdist workers, benchmark peers) holding the GPU and the pipe.
    Returns ``{"rc", "seconds", "timed_out", "output"}``.
    """
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.monotonic()
    lines: List[str] = []
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )

        def pump():
            for line in proc.stdout:
                lines.append(line)
                log.write(line)
                log.flush()
                print(prefix + line.rstrip("\n"), flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
        except BaseException:  # Ctrl-C here: the children are in a session of their own
            _kill_group(proc.pid)
            raise
        _kill_group(proc.pid)  # stragglers (a worker left behind) would hold the GPU
        reader.join(timeout=10)
    return {"rc": proc.returncode, "seconds": time.monotonic() - t0, "timed_out": timed_out, "output": "".join(lines)}


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGINT, SIGTERM, then SIGKILL to ``proc``'s process group, each given a grace."""
    for sig, grace in ((signal.SIGINT, 15), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _status(run: Dict, ok: bool) -> str:
    return "timeout" if run["timed_out"] else ("ok" if ok else "failed")


# --------------------------------------------------------------------------- #
# Stages: each returns its record (a dict with "status"); none raises for a failed child
# --------------------------------------------------------------------------- #


def stage_device(ctx: Ctx, timeout: float) -> Dict:
    """Device and versions: jax's and torch's view (child processes), nvidia-smi, packages."""
    t0 = time.monotonic()
    probe = common.device_probe(ctx.platform, timeout=timeout / 2, env=ctx.env)
    with open(os.path.join(ctx.out, "device-probe.json"), "w") as f:
        json.dump(probe, f, indent=1)  # the workload runs' headers read it (no second probe)
    rec = {
        "probe": probe,
        "summary": common.device_summary(probe),
        "versions": common.package_versions(),
        "machine": common.cpu_info(),
        "nvidia_smi": _nvidia_smi(),
    }
    jax_ok = "error" not in probe.get("jax", {}) and (ctx.rehearse or probe["jax"].get("backend") == "gpu")
    rec["status"] = "ok" if jax_ok else "failed"
    if not jax_ok:
        rec["reason"] = probe.get("jax", {}).get("error") or (f"jax runs on {probe['jax'].get('backend')}, not a GPU")
    rec["seconds"] = time.monotonic() - t0
    return rec


def _nvidia_smi() -> Optional[str]:
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def stage_suite(ctx: Ctx, timeout: float) -> Dict:
    """The test suite's GPU line on :data:`SUITE_FILES` (the conftest sets the GPU's
    float32 precision, no pre-allocation, and skips the multi-device tests)."""
    xdist = importlib.util.find_spec("xdist") is not None
    files = REHEARSAL_SUITE_FILES if ctx.rehearse else SUITE_FILES
    # -o addopts= drops pyproject's "-n auto", which fails where xdist is missing
    cmd = [sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider"]
    if xdist and not ctx.rehearse:
        cmd += ["-n", "4"]
    cmd += list(files)
    run = run_command(cmd, ctx.env, timeout, os.path.join(ctx.out, "logs", "suite.log"))
    summary = parse_pytest_summary(run["output"])
    rec = {
        "status": _status(run, run["rc"] == 0),
        "rc": run["rc"],
        "seconds": run["seconds"],
        "command": _cmdline(cmd, ctx.env),
        "xdist": xdist,
        "files": list(files),
        "summary": summary,
        "log": "logs/suite.log",
    }
    if run["rc"] != 0 and not (summary and summary["counts"]):
        rec["reason"] = _last_line(run["output"])
    return rec


def stage_workload(ctx: Ctx, name: str, timeout: float) -> Dict:
    """One workload through ``benchmarks.run --platform gpu`` (the rehearsal: its GPU tier on
    the CPU, --quick), one round, at most 2 timed repetitions per peer."""
    base = os.path.join(ctx.out, "workloads", name)
    os.makedirs(os.path.dirname(base), exist_ok=True)
    peers = (REHEARSAL_PEERS if ctx.rehearse else GPU_PEERS)[name]
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--rounds",
        "1",
        "--only",
        *[f"{name}:{p}" for p in peers],
        "--out",
        base + ".md",
        "--json",
        base + ".json",
        # a peer that hangs (a torch.compile, say) leaves time to the others
        "--child-timeout",
        f"{max(20.0, 0.6 * timeout):.0f}",
    ]
    cmd += (
        ["--platform", "cpu", "--tier", "gpu", "--quick", "--reps", "1", "--threads", "1"]
        if ctx.rehearse
        else ["--platform", "gpu", "--reps", "2"]
    )
    probe = os.path.join(ctx.out, "device-probe.json")
    if os.path.exists(probe):
        cmd += ["--probe-from", probe]
    run = run_command(cmd, ctx.env, timeout, os.path.join(ctx.out, "logs", f"{name}.log"))
    rows = workload_rows(_load_json(base + ".json"))
    good = [r for r in rows if "median_s" in r]
    status = _status(run, run["rc"] == 0 and len(good) == len(rows) and bool(rows))
    if status == "failed" and good:
        status = "partial"
    rec = {
        "status": status,
        "rc": run["rc"],
        "seconds": run["seconds"],
        "command": _cmdline(cmd, ctx.env),
        "expected_peers": list(peers),
        "peers": rows,
        "log": f"logs/{name}.log",
        "report": f"workloads/{name}.md",
        "json": f"workloads/{name}.json",
    }
    if not rows and run["rc"] != 0:
        rec["reason"] = _last_line(run["output"])
    return rec


def workload_rows(data: Optional[Dict]) -> List[Dict]:
    """benchmarks.run's JSON as one row per (case, peer): median/min/max seconds, or error."""
    rows = []
    for r in (data or {}).get("results", []):
        row = {"case": r["case"], "peer": r["peer"]}
        if "values" in r:
            s = common.summary(r["values"])
            row.update(median_s=s["median"], min_s=s["min"], max_s=s["max"], n=s["n"])
            for key in ("first_step_s", "first_epoch_s", "loss_first", "progress_bar"):
                if key in r.get("extra", {}):
                    row[key] = r["extra"][key]
            if "f32_matmul" in r:
                row["f32_matmul"] = r["f32_matmul"]
        else:
            row["error"] = r.get("error", "?")
        rows.append(row)
    return rows


def stage_shakespeare(ctx: Ctx, dtype: str, timeout: float) -> Dict:
    """examples/shakespeare_char.py at nanoGPT's GPU configuration (rehearsal: tiny), with
    ``--dtype``; where the example refuses that flag, once more without it."""
    args = SHAKESPEARE_REHEARSAL if ctx.rehearse else SHAKESPEARE_GPU
    cmd = [sys.executable, "examples/shakespeare_char.py", *args, f"--dtype={dtype}"]
    t0 = time.monotonic()
    log = os.path.join(ctx.out, "logs", f"shakespeare-{dtype}.log")
    run = run_command(cmd, ctx.env, timeout, log)
    rec = {"dtype": dtype, "dtype_flag": "accepted"}
    if run["rc"] != 0 and rejected_flag(run["output"], "--dtype"):
        rec["dtype_flag"] = "rejected: the example has no --dtype yet; ran at its default dtype"
        cmd = cmd[:-1]
        run = run_command(cmd, ctx.env, timeout - (time.monotonic() - t0), log)
    parsed = parse_training_log(run["output"])
    rec.update(
        status=_status(run, run["rc"] == 0 and bool(parsed["evals"])),
        rc=run["rc"],
        seconds=time.monotonic() - t0,
        command=_cmdline(cmd, ctx.env),
        summary=summarize_training(parsed),
        parsed=parsed,
        log=f"logs/shakespeare-{dtype}.log",
    )
    if run["rc"] != 0:
        rec["reason"] = _last_line(run["output"])
    return rec


def find_nanogpt(path: Optional[str]) -> Optional[str]:
    """A nanoGPT checkout (``train.py``, ``model.py``, ``configurator.py``): ``path``, else
    ``$NANOGPT_DIR``, else ``../nanoGPT`` or ``shared/nanoGPT`` beside the repository."""
    candidates = (
        [path]
        if path
        else [
            os.environ.get("NANOGPT_DIR"),
            os.path.join(ROOT, "..", "nanoGPT"),
            os.path.join(ROOT, "shared", "nanoGPT"),
        ]
    )
    for c in candidates:
        if c and all(os.path.exists(os.path.join(c, f)) for f in ("train.py", "model.py", "configurator.py")):
            return os.path.abspath(c)
    return None


def prepare_nanogpt(src: str, work: str) -> None:
    """nanoGPT's three files and its shakespeare_char data (``prepare.py``'s encoding:
    sorted characters, the first 90 % for training) in ``work``, from funcnet's copy of the
    text: no download, and the checkout is left untouched."""
    import pickle
    import shutil

    import numpy as np

    os.makedirs(os.path.join(work, "data", "shakespeare_char"), exist_ok=True)
    for f in ("train.py", "model.py", "configurator.py"):
        shutil.copy(os.path.join(src, f), os.path.join(work, f))
    with open(os.path.join(ROOT, "data", "shakespeare_char", "input.txt"), encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(len(ids) * 0.9)
    ids[:n].tofile(os.path.join(work, "data", "shakespeare_char", "train.bin"))
    ids[n:].tofile(os.path.join(work, "data", "shakespeare_char", "val.bin"))
    with open(os.path.join(work, "data", "shakespeare_char", "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def stage_nanogpt(ctx: Ctx, timeout: float) -> Dict:
    """nanoGPT's train.py at its shakespeare_char GPU configuration (bfloat16, compiled), the
    example's peer; skipped without a checkout or without torch."""
    src = find_nanogpt(ctx.nanogpt_dir)
    if src is None:
        return {
            "status": "skipped",
            "reason": "no nanoGPT checkout (--nanogpt-dir or "
            "$NANOGPT_DIR): only funcnet's side of the Shakespeare run is measured",
        }
    if importlib.util.find_spec("torch") is None:
        return {
            "status": "skipped",
            "reason": "torch is not installed: only funcnet's side of the Shakespeare run is measured",
        }
    # A scratch directory, not DIR: nanoGPT saves a checkpoint (~120 MB at this size) that
    # has no place among the results.
    with tempfile.TemporaryDirectory(prefix="funcnet-nanogpt-") as work:
        return _nanogpt_in(ctx, src, work, timeout)


def _nanogpt_in(ctx: Ctx, src: str, work: str, timeout: float) -> Dict:
    t0 = time.monotonic()
    try:
        prepare_nanogpt(src, work)
    except Exception as e:  # noqa: BLE001 - recorded, the next stage runs
        return {
            "status": "failed",
            "reason": f"preparing nanoGPT: {type(e).__name__}: {e}",
            "seconds": time.monotonic() - t0,
        }
    # nanoGPT's train.py reads its config and data relative to the working directory
    config = [
        "batch_size=64",
        "block_size=256",
        "n_layer=6",
        "n_head=6",
        "n_embd=384",
        "dropout=0.2",
        "learning_rate=1e-3",
        "min_lr=1e-4",
        "beta2=0.99",
        "warmup_iters=100",
        "dataset='shakespeare_char'",
        "gradient_accumulation_steps=1",
    ]
    with open(os.path.join(work, "shakespeare_char_config.py"), "w") as f:
        f.write("# nanoGPT's config/train_shakespeare_char.py\n" + "\n".join(config) + "\n")
    args = NANOGPT_REHEARSAL if ctx.rehearse else NANOGPT_GPU
    cmd = [sys.executable, "train.py", "shakespeare_char_config.py", *args, f"--out_dir={os.path.join(work, 'out')}"]
    env = dict(ctx.env, PYTHONPATH=work)
    run = run_command(
        cmd, env, timeout - (time.monotonic() - t0), os.path.join(ctx.out, "logs", "nanogpt.log"), cwd=work
    )
    parsed = parse_training_log(run["output"])
    rec = {
        "status": _status(run, run["rc"] == 0 and bool(parsed["evals"])),
        "rc": run["rc"],
        "seconds": time.monotonic() - t0,
        "source": src,
        "command": _cmdline(cmd, env),
        "summary": summarize_training(parsed),
        "parsed": parsed,
        "log": "logs/nanogpt.log",
    }
    if run["rc"] != 0:
        rec["reason"] = _last_line(run["output"])
    return rec


def _cmdline(cmd: Sequence[str], env: Dict[str, str]) -> str:
    """The command as a person would type it (``python`` for this interpreter)."""
    shown = f"JAX_PLATFORMS={env['JAX_PLATFORMS']} " if "JAX_PLATFORMS" in env else ""
    return shown + " ".join("python" if c == sys.executable else shlex.quote(c) for c in cmd)


def _last_line(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][-300:] if lines else "no output"


def _load_json(path: str) -> Optional[Dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------- #


def _fmt_s(v) -> str:
    return "" if v is None else (f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s")


def _stage_result(name: str, rec: Dict) -> str:
    """One cell: what the stage found, in a few words."""
    if rec.get("reason") and rec.get("status") != "ok":
        return rec["reason"].replace("|", "/")[:200]
    if name == "device":
        return rec.get("summary", {}).get("device", "")
    if name == "suite":
        return (rec.get("summary") or {}).get("line", "no summary line")
    if "peers" in rec:
        timed = {p["peer"] for p in rec["peers"] if "median_s" in p}
        bad = [p["peer"] for p in rec["peers"] if "error" in p]
        missing = [p for p in rec.get("expected_peers", ()) if p not in timed and p not in bad]
        return (
            f"{len(timed)} of {len(rec.get('expected_peers') or rec['peers'])} peers timed"
            + (f"; failed: {', '.join(bad)}" if bad else "")
            + (f"; not run: {', '.join(missing)}" if missing else "")
        )
    if "summary" in rec:
        s = rec["summary"]
        return (
            f"val loss {s.get('val_loss')} at step {s.get('last_step')}, {s.get('median_ms_per_iter')} ms/iter (median)"
        )
    return ""


def render_report(results: Dict) -> str:
    """gpu-report.md: header, the stages' table, then each stage's figures."""
    stages = results["stages"]
    dev = stages.get("device", {})
    lines = [
        "# funcnet GPU tier" + (" (REHEARSAL on CPU: no GPU figures)" if results["rehearse"] else ""),
        "",
        f"Command: `{results['command']}`  ",
        f"Date: {results['date']}  ",
        f"Budget: {results['budget_s']:.0f} s; elapsed {results['elapsed_s']:.0f} s  ",
    ]
    if dev.get("summary"):
        lines += [f"Device: {dev['summary']['device']}  ", f"CUDA: {dev['summary']['cuda']}  "]
    if dev.get("nvidia_smi"):
        lines.append(f"nvidia-smi: {dev['nvidia_smi']}  ")
    if dev.get("versions"):
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in dev["versions"].items()) + "  ")
    probe = dev.get("probe", {})
    if probe:
        j, t = probe.get("jax", {}), probe.get("torch", {})
        lines.append(
            "Float32 matmul defaults: jax_default_matmul_precision="
            f"{j.get('jax_default_matmul_precision')} (None: XLA's default, TF32 on "
            "NVIDIA GPUs from Ampere on); torch matmul.allow_tf32="
            f"{t.get('matmul.allow_tf32')}, cudnn.allow_tf32={t.get('cudnn.allow_tf32')}. "
            "The workloads set torch to TF32 to match XLA (benchmarks.run "
            "--f32-matmul tf32); the test suite runs at float32 ('highest').  "
        )
    lines += ["", "| stage | status | time | timeout | result |", "|---|---|---|---|---|"]
    for name, rec in stages.items():
        lines.append(
            f"| {name} | {rec.get('status')} | {_fmt_s(rec.get('seconds'))} | "
            f"{_fmt_s(rec.get('timeout_s'))} | {_stage_result(name, rec)} |"
        )
    lines.append("")
    if "suite" in stages and stages["suite"].get("command"):
        s = stages["suite"]
        lines += [
            "## Test suite on the GPU (subset)",
            "",
            f"`{s['command']}`",
            "",
            f"Summary: {(s.get('summary') or {}).get('line', 'none')} (status {s['status']})",
            "",
        ]
    for name in GPU_PEERS:
        rec = stages.get(name)
        if rec and rec.get("report"):
            lines += _workload_section(results["out"], rec)
    lines += _training_section(stages, results["rehearse"])
    return "\n".join(lines).rstrip() + "\n"


def _workload_section(out: str, rec: Dict) -> List[str]:
    """benchmarks.run's own report of the workload, without its header."""
    try:
        with open(os.path.join(out, rec["report"])) as f:
            text = f.read()
    except OSError:
        return [f"(no report: {rec.get('status')}; see {rec.get('log')})", ""]
    start = text.find("\n## ")
    return [text[start + 1 :].rstrip() if start >= 0 else text.rstrip(), ""]


def _training_section(stages: Dict, rehearse: bool) -> List[str]:
    runs = [
        (n, stages[n])
        for n in ("shakespeare-bf16", "nanogpt", "shakespeare-f32")
        if n in stages and "summary" in stages[n]
    ]
    if not runs:
        return []
    title = (
        "Shakespeare, rehearsal size (1 x 32, block 16, batch 4; 20 iterations)"
        if rehearse
        else "Shakespeare at nanoGPT's GPU configuration (6 x 384, block 256, batch 64, dropout 0.2; 2000 iterations)"
    )
    lines = [
        f"## {title}",
        "",
        "| run | status | last eval | train loss | val loss | ms/iter (median) | MFU % "
        "(median) | compile (s) | training (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rec in runs:
        s = rec["summary"]
        cell = lambda v, f="{:.4f}": "" if v is None else f.format(v)  # noqa: E731
        label = name + (f" ({rec['dtype_flag']})" if rec.get("dtype_flag", "accepted") != "accepted" else "")
        lines.append(
            f"| {label} | {rec['status']} | {cell(s['last_step'], '{}')} | "
            f"{cell(s['train_loss'])} | {cell(s['val_loss'])} | "
            f"{cell(s['median_ms_per_iter'], '{:.2f}')} | {cell(s['median_mfu_pct'], '{:.2f}')} | "
            f"{cell(s['compile_s'], '{:.1f}')} | {cell(s['training_s'], '{:.1f}')} |"
        )
    lines += [
        "",
        "ms/iter: the median over the logged intervals after the first (which holds "
        "the compilation). The example's `time` is the mean over its log interval; "
        "nanoGPT's is the last iteration's alone. MFU as both print it: nanoGPT's "
        "estimate_mfu against an A100's bfloat16 peak (312 TFLOPS), whatever the GPU. "
        "Float32 runs: XLA's default precision, TF32 on NVIDIA GPUs (nanoGPT's train.py "
        "turns TF32 on too).",
        "",
    ]
    for name, rec in runs:
        for key, value in rec.get("parsed", {}).get("settings", {}).items():
            lines.append(f"- {name}, {key}: {value}")
    for name, rec in runs:
        if rec.get("command"):
            lines.append(f"- {name}: `{rec['command']}`")
    return lines + [""]


def write_outputs(ctx: Ctx) -> None:
    """gpu-results.json and gpu-report.md, each written aside and renamed into place."""
    for name, text in (
        ("gpu-results.json", json.dumps(ctx.results, indent=1, default=str)),
        ("gpu-report.md", render_report(ctx.results)),
    ):
        path = os.path.join(ctx.out, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


# --------------------------------------------------------------------------- #
# Main
# --------------------------------------------------------------------------- #


def _selected_stages(spec: Optional[str]) -> List[str]:
    names = [n for n, *_ in PLAN]
    if not spec:
        return names
    chosen = set()
    for item in spec.split(","):
        item = item.strip()
        if item in STAGE_GROUPS:
            chosen.update(STAGE_GROUPS[item])
        elif item in names:
            chosen.add(item)
        else:
            raise SystemExit(f"--stages: unknown stage {item!r}; choose from {', '.join(names + list(STAGE_GROUPS))}.")
    return [n for n in names if n in chosen]


def _run_stage(ctx: Ctx, name: str, timeout: float) -> Dict:
    if name == "device":
        return stage_device(ctx, timeout)
    if name == "suite":
        return stage_suite(ctx, timeout)
    if name in GPU_PEERS:
        return stage_workload(ctx, name, timeout)
    if name == "nanogpt":
        return stage_nanogpt(ctx, timeout)
    dtype = {"shakespeare-bf16": "bfloat16", "shakespeare-f32": "float32"}[name]
    if dtype == "float32":
        first = ctx.results["stages"].get("shakespeare-bf16", {})
        if first.get("dtype_flag", "accepted") != "accepted":
            return {
                "status": "skipped",
                "reason": "the example has no --dtype: the bfloat16 stage already ran it at its default dtype",
            }
    return stage_shakespeare(ctx, dtype, timeout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--out",
        default=None,
        help="directory for gpu-results.json, gpu-report.md and logs/ (default: $OUT, else runs/gpu)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float(PLAN_BUDGET_S),
        help=f"seconds for the whole run (default {PLAN_BUDGET_S})",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="every stage on the CPU with tiny settings: a check of this script, not a measurement",
    )
    parser.add_argument(
        "--stages",
        default=None,
        help="comma-separated stages to run (default all): " + ", ".join([n for n, *_ in PLAN] + list(STAGE_GROUPS)),
    )
    parser.add_argument(
        "--nanogpt-dir",
        default=None,
        help="a karpathy/nanoGPT checkout for the nanogpt stage (default: $NANOGPT_DIR, ../nanoGPT, shared/nanoGPT)",
    )
    args = parser.parse_args(argv)

    out = os.path.abspath(args.out or os.environ.get("OUT") or os.path.join(ROOT, "runs", "gpu"))
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "device-probe.json")):  # an earlier run's, maybe elsewhere
        os.remove(os.path.join(out, "device-probe.json"))
    ctx = Ctx(out=out, rehearse=args.rehearse, nanogpt_dir=args.nanogpt_dir, env=child_env(args.rehearse))
    t_start = time.monotonic()
    argv_shown = argv if argv is not None else sys.argv[1:]
    ctx.results = {
        "command": "python -m benchmarks.gpu " + " ".join(shlex.quote(a) for a in argv_shown),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "rehearse": args.rehearse,
        "platform": ctx.platform,
        "budget_s": args.budget_s,
        "elapsed_s": 0.0,
        "out": out,
        "stages": {},
    }
    plan = plan_timeouts(args.budget_s, _selected_stages(args.stages))
    print(
        f"[gpu] {'rehearsal on CPU' if args.rehearse else 'GPU tier'}: "
        f"{', '.join(s['name'] for s in plan)}; budget {args.budget_s:.0f} s; output in {out}",
        flush=True,
    )
    for i, stage in enumerate(plan):
        left = args.budget_s - (time.monotonic() - t_start)
        timeout = stage_timeout(plan, i, left)
        name = stage["name"]
        if timeout is None:
            rec = {
                "status": "skipped",
                "reason": f"budget: {left:.0f} s left, later stages reserved the rest" if left > 0 else "budget spent",
            }
            print(f"[gpu] {name}: skipped ({rec['reason']})", flush=True)
        else:
            print(f"[gpu] {name}: start (timeout {timeout:.0f} s, {left:.0f} s of the budget left)", flush=True)
            try:
                rec = _run_stage(ctx, name, timeout)
            except Exception as e:  # noqa: BLE001 - one stage's bug must not lose the others
                rec = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
            rec["timeout_s"] = timeout
            print(
                f"[gpu] {name}: {rec['status']} in {rec.get('seconds', 0):.1f} s - {_stage_result(name, rec)}",
                flush=True,
            )
        ctx.results["stages"][name] = rec
        ctx.results["elapsed_s"] = time.monotonic() - t_start
        write_outputs(ctx)
    print(f"[gpu] done in {ctx.results['elapsed_s']:.0f} s: {os.path.join(out, 'gpu-report.md')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
