"""Charts of the committed benchmark results: ``python -m benchmarks.plots``.

Reads the JSON files that `python -m benchmarks.run --json` wrote (committed in
`benchmarks/`) and writes one SVG per chart to `docs/img/bench-*.svg`, shown on the
site's benchmarks page, plus `docs/img/bench-plots.json`: for each chart, its inputs and
their sha256. `tests/test_docs_site.py` recomputes the hashes, so a committed result that
changed without re-running this script fails there (the SVG bytes themselves are not
compared: they differ between matplotlib versions).

A time is the median over every repetition of every round of a (workload, case, peer),
as in `BENCHMARKS.md`; the bars' whiskers are the min and max. Output is deterministic
for a given matplotlib: no date in the metadata, a fixed `svg.hashsalt`, and matplotlib's
bundled DejaVu Sans drawn as paths.

```bash
pip install -e ".[examples]"     # matplotlib
python -m benchmarks.plots       # rewrites docs/img/bench-*.svg and bench-plots.json
```
"""

import argparse
import hashlib
import json
import os
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join("docs", "img")
MANIFEST = os.path.join(OUT_DIR, "bench-plots.json")
COMMAND = "python -m benchmarks.plots"

RUN_F = "benchmarks/results.json"
RUN_L = "benchmarks/results-2026-11-27-fit-runL.json"
RUN_M = "benchmarks/results-2026-11-27-fit-nets-runM.json"

# Each chart: its file, the JSON files it reads, and the function that draws it.
# Adding a chart here without re-running the script fails tests/test_docs_site.py.
PLOTS = {
    "bench-step-vs-torch.svg": (RUN_F,),
    "bench-fit-mlp.svg": (RUN_L,),
    "bench-fit-nets.svg": (RUN_L, RUN_M),
}


def sha256(path):
    """The sha256 (hex) of a file under the repository root."""
    with open(os.path.join(ROOT, path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest():
    """What `bench-plots.json` holds: the command, and each chart's inputs with their hashes."""
    return {
        "command": COMMAND,
        "plots": {name: {path: sha256(path) for path in inputs} for name, inputs in PLOTS.items()},
    }


def load(path):
    """The result rows of one JSON file (either the bare list or ``{header, results}``)."""
    with open(os.path.join(ROOT, path)) as f:
        data = json.load(f)
    return data["results"] if isinstance(data, dict) else data


def times(rows, workload, case_prefix):
    """``{peer: (median, min, max)}`` of one case, pooling every round's repetitions."""
    pooled = {}
    for r in rows:
        if r["workload"] == workload and r["case"].startswith(case_prefix) and r.get("values"):
            pooled.setdefault(r["peer"], []).extend(r["values"])
    return {p: (statistics.median(v), min(v), max(v)) for p, v in pooled.items()}


def _bars(ax, stats, peers, scale=1.0, highlight=("funcnet", "fit-device")):
    """Horizontal bars of the medians (times ``scale``) with min-max whiskers, top down."""
    peers = [p for p in peers if p in stats]
    med = [stats[p][0] * scale for p in peers]
    lo = [(stats[p][0] - stats[p][1]) * scale for p in peers]
    hi = [(stats[p][2] - stats[p][0]) * scale for p in peers]
    colors = ["#3f51b5" if p in highlight else "#9e9e9e" for p in peers]
    y = list(range(len(peers)))[::-1]
    ax.barh(y, med, xerr=[lo, hi], color=colors, error_kw={"ecolor": "#424242", "lw": 0.8})
    ax.set_yticks(y, peers)
    ax.grid(axis="x", color="#e0e0e0")
    ax.set_axisbelow(True)
    for yi, m, h in zip(y, med, hi):
        ax.text(m + h, yi, f" {m:.3g}", va="center", fontsize=7)


def plot_step_vs_torch(fig, rows):
    """Workloads 1-3 (run F): one training step's time per peer, PyTorch eager = 1."""
    cases = [
        (
            "mlp",
            "468",
            "1. MNIST MLP, s/epoch",
            ["funcnet", "jax", "stax", "flax-linen", "flax-nnx", "haiku", "equinox", "torch"],
        ),
        (
            "dispatch",
            "1875",
            "2. dispatch-bound MLP, s/epoch",
            ["funcnet", "jax", "stax", "flax-linen", "flax-nnx", "haiku", "equinox", "torch"],
        ),
        ("cnn", "28x28", "3. LeNet CNN, s/step", ["funcnet", "funcnet-plainjit", "jax-nhwc", "torch"]),
    ]
    axes = fig.subplots(len(cases), 1, height_ratios=[8, 8, 4])
    for ax, (workload, case, title, peers) in zip(axes, cases):
        stats = times(rows, workload, case)
        _bars(ax, stats, peers, scale=1.0 / stats["torch"][0])
        ax.axvline(1.0, color="#d32f2f", lw=0.8, ls="--")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("median time ÷ torch's")
    fig.suptitle("Training step vs PyTorch 2.13 eager\n(2-vCPU AMD EPYC, run F, 2026-11-25)", fontsize=10)


def plot_fit_mlp(fig, rows):
    """Workload 6 (run L): fit's configurations against hand-written loops, s/epoch."""
    peers = ["fit-device", "fit-device-k1", "fit", "fit-k1", "fit-thread", "train-step", "jax", "jax-scan"]
    cases = [("784-400", "784-400-100-10, b128, Adam"), ("784-64", "784-64-10, b32, SGD (dispatch-bound)")]
    axes = fig.subplots(len(cases), 1)
    for ax, (case, title) in zip(axes, cases):
        _bars(ax, times(rows, "fit", case), peers)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("median s/epoch (lower is faster)")
    fig.suptitle("6. fit end to end vs bare step loops\n(2-core Intel Xeon, run L, 2026-11-27)", fontsize=10)


def plot_fit_nets(fig, rows_l, rows_m):
    """Workload 6b: per network, every peer of run L, and run M's three-round medians.

    `fit-device-loop`, when over 3x `fit-device`'s time (12-20x on the convolutional
    networks), is left out of the bars and its time written in the panel's title, so that
    the other bars stay readable."""
    nets = [("flax-cnn", "Flax NNX's MNIST CNN"), ("lenet", "LeNet"), ("gpt", "nanoGPT's GPT")]
    peers = ["fit-device", "fit", "fit-device-plain", "fit-device-options", "jit-loop", "jit-loop-options", "flax"]
    axes = fig.subplots(len(nets), 2, width_ratios=[1, 1])
    for row, (net, title) in enumerate(nets):
        for col, (rows, run) in enumerate([(rows_l, "run L, one round"), (rows_m, "run M, three rounds")]):
            ax = axes[row][col]
            stats = times(rows, "fit-nets", net)
            loop = stats.get("fit-device-loop")
            far = loop and loop[0] > 3 * stats["fit-device"][0]
            _bars(ax, stats, peers + ([] if far else ["fit-device-loop"]), scale=1e3)
            note = f"\nfit-device-loop: {loop[0] * 1e3:.0f} ms, not drawn" if far else ""
            ax.set_title(f"{title} ({run}){note}", fontsize=9)
            ax.set_xlabel("median ms/step")
    fig.suptitle("6b. fit on the network families (2-core Intel Xeon, 2026-11-27)", fontsize=10)


def _draw(name):
    inputs = [load(p) for p in PLOTS[name]]
    draw = {
        "bench-step-vs-torch.svg": (plot_step_vs_torch, (7.5, 8)),
        "bench-fit-mlp.svg": (plot_fit_mlp, (7.5, 6)),
        "bench-fit-nets.svg": (plot_fit_nets, (9, 9)),
    }[name]
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=draw[1], layout="constrained")
    draw[0](fig, *inputs)
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=OUT_DIR, help="where the SVGs go (docs/img)")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("svg")
    # Reproducible bytes: fixed ids, no date, the font matplotlib ships.
    matplotlib.rcParams.update(
        {"svg.hashsalt": "funcnet-bench", "svg.fonttype": "path", "font.family": "DejaVu Sans", "font.size": 8}
    )
    import matplotlib.pyplot as plt

    out_dir = os.path.join(ROOT, args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    for name in PLOTS:
        fig = _draw(name)
        fig.savefig(os.path.join(out_dir, name), format="svg", metadata={"Date": None})
        plt.close(fig)
        print(f"wrote {os.path.join(args.out_dir, name)}")
    with open(os.path.join(out_dir, os.path.basename(MANIFEST)), "w") as f:
        json.dump(manifest(), f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.join(args.out_dir, os.path.basename(MANIFEST))}")


if __name__ == "__main__":
    main()
