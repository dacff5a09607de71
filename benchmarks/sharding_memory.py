"""Memory per device of a train state laid out three ways: replicated, FSDP and 2-D.

    python -m benchmarks.sharding_memory                    # 4 and 8 simulated CPU devices
    python -m benchmarks.sharding_memory --devices 4 --models mlp --json out.json
    python -m benchmarks.sharding_memory --devices 4 --tiny --steps 1   # a smoke run

For each device count (a child process each, since XLA reads the simulated device
count once) and each model -- an MLP of about 55 M parameters (1024 -> 4096 x 4 ->
10) and nanoGPT's GPU Shakespeare GPT (6 layers, 6 heads, 384 features, 10.7 M
parameters) -- the train state (params and Adam's two moments) is placed:

- ``replicated``: whole on every device (``distributed.replicate_on``), data parallel;
- ``fsdp``: ``sharding.fsdp_rules("data")`` on a 1-D mesh of every device;
- ``2d``: a ``("data", "model")`` mesh with 2 devices along ``model``:
  ``megatron_rules`` (MLP pairs column- then row-parallel; for the GPT its attention
  and MLP) with the other dimension split over ``data``, then ``fsdp_rules("data")``.

Reported per layout: the bytes of params + optimizer state on the fullest device,
read from the arrays' shards (``sharding.explain``), and the ratio to replicated
(FSDP's target: at most 1.1 / N); the compiled step's ``memory_analysis()`` for one
device (arguments, temporaries); and the median step time over ``--steps`` steps. On
simulated CPU devices every "device" shares the same cores and memory, so the step
times show the cost of the extra collectives, not a speed-up.

``--tiny`` swaps in models of a few thousand parameters (and ``fsdp_rules(min_size=0)``,
so that they are split at all): it checks that the harness runs (tests/test_benchmarks_smoke.py
calls :func:`_child` in-process on the test's 4 devices), its numbers measure nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _mlp(tiny: bool):
    """The MLP (``tiny``: of width 64): ``(net, input shape, batch, loss_fn, its tensor-parallel
    rules)``, the pairs of Dense column- then row-parallel."""
    import numpy as np

    import funcnet
    from funcnet import losses, sharding
    from funcnet.layers import Dense, Relu
    from funcnet.train import Aux

    width, n_in, n_batch = (64, 16, 8) if tiny else (4096, 1024, 32)
    net = funcnet.serial(Dense(width), Relu, Dense(width), Relu, Dense(width), Relu, Dense(width), Relu, Dense(10))
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(n_batch, n_in)).astype(np.float32), rng.integers(0, 10, n_batch).astype(np.int32))

    def loss_fn(params, state, b, key):
        out, state = net.apply(params, state, b[0])
        return losses.cross_entropy(out, b[1]), Aux(state=state)

    tp = sharding.megatron_rules(column=["0", "4"], row=["2", "6"], fsdp_axis="data")
    return net, (-1, n_in), batch, loss_fn, tp


def _gpt(tiny: bool):
    """nanoGPT's GPU Shakespeare GPT (``tiny``: 1 layer of 16 features), as :func:`_mlp`."""
    import numpy as np

    from funcnet import losses, sharding
    from funcnet.models import GPT
    from funcnet.train import Aux

    block, n_layer, n_head, n_embd, n_b = (8, 1, 2, 16, 8) if tiny else (64, 6, 6, 384, 16)
    net = GPT(vocab_size=65, block_size=block, n_layer=n_layer, n_head=n_head, n_embd=n_embd, bias=False)
    rng = np.random.default_rng(0)
    batch = tuple(rng.integers(0, 65, (n_b, block)).astype(np.int32) for _ in range(2))

    def loss_fn(params, state, b, key):
        logits, state = net.apply(params, state, b[0])
        return (losses.cross_entropy(logits.reshape(-1, 65), b[1].reshape(-1)), Aux(state=state))

    return net, (-1, block), batch, loss_fn, sharding.megatron_rules(fsdp_axis="data")


def _time_steps(step, state, placed_batch, mesh, steps: int):
    """The step compiled on ``mesh`` (the state donated), run once, then timed ``steps`` times:
    ``(compile seconds, memory_analysis(), step seconds, last metrics)``."""
    import jax

    with jax.set_mesh(mesh):
        jitted = jax.jit(step, donate_argnums=0)
        t0 = time.perf_counter()
        compiled = jitted.lower(state, placed_batch).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        state, m = compiled(state, placed_batch)
        jax.block_until_ready(m)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            state, m = compiled(state, placed_batch)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
    return compile_s, mem, times, m


def _child(devices: int, models, steps: int, tiny: bool = False) -> list:
    """The rows for ``devices`` devices (this process must have them): one per model and
    layout, each also printed as a JSON line."""
    import jax
    import numpy as np
    import optax

    import funcnet
    from funcnet import distributed, sharding
    from funcnet.train import TrainState, make_train_step

    min_size = 0 if tiny else 2**14  # fsdp_rules' default
    rows = []
    for name in models:
        net, shape, batch, loss_fn, tp_rules = {"mlp": _mlp, "gpt": _gpt}[name](tiny)
        opt = optax.adam(1e-4)
        ts = TrainState.create(net, opt, jax.random.key(0), shape)
        n_params = funcnet.count(ts.params)
        step = make_train_step(loss_fn, opt)
        flat = jax.make_mesh((devices,), ("data",))
        grid = jax.make_mesh((devices // 2, 2), ("data", "model"))
        layouts = {
            "replicated": (flat, lambda: distributed.replicate_on(flat, ts)),
            "fsdp": (flat, lambda: sharding.shard_params(ts, flat, sharding.fsdp_rules("data", min_size))),
            "2d": (grid, lambda: sharding.shard_params(ts, grid, tp_rules + sharding.fsdp_rules("data", min_size))),
        }
        base = None
        for layout, (mesh, place) in layouts.items():
            state = place()
            held = sharding.explain(state, print_fn=None)
            base = base or held.bytes_per_device
            placed_batch = distributed.shard_batch(mesh, batch)
            # donated: the compiled step took its buffers, and the last state is dropped there
            compile_s, mem, times, m = _time_steps(step, state, placed_batch, mesh, steps)
            del state
            rows.append(
                {
                    "devices": devices,
                    "model": name,
                    "params": n_params,
                    "layout": layout,
                    "state_bytes_per_device": held.bytes_per_device,
                    "ratio_to_replicated": held.bytes_per_device / base,
                    "target_ratio": 1.1 / devices,
                    "compiled_argument_bytes": getattr(mem, "argument_size_in_bytes", None),
                    "compiled_temp_bytes": getattr(mem, "temp_size_in_bytes", None),
                    "compile_s": compile_s,
                    "step_ms_median": 1000 * float(np.median(times)),
                    "loss": float(m["loss"]),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _table(rows) -> str:
    mib = lambda b: "-" if b is None else f"{b / 2**20:,.1f}"  # noqa: E731
    out = [
        "| devices | model (params) | layout | params+Adam per device (MiB) | ratio to "
        "replicated (target <= 1.1/N) | compiled step: arguments / temporaries (MiB) | "
        "step (ms, median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['devices']} | {r['model']} ({r['params'] / 1e6:.1f} M) | {r['layout']} | "
            f"{mib(r['state_bytes_per_device'])} | {r['ratio_to_replicated']:.3f} "
            f"({r['target_ratio']:.3f}) | {mib(r['compiled_argument_bytes'])} / "
            f"{mib(r['compiled_temp_bytes'])} | {r['step_ms_median']:.0f} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt"], choices=["mlp", "gpt"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--tiny", action="store_true", help="models of a few thousand parameters: a smoke run, not a measurement"
    )
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.models, args.steps, args.tiny)
        return
    rows = []
    for n in args.devices:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.sharding_memory",
            "--child",
            str(n),
            "--steps",
            str(args.steps),
            "--models",
            *args.models,
            *["--tiny"][: args.tiny],
        ]
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
        env.setdefault("JAX_PLATFORMS", "cpu")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print(_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"command": "python -m benchmarks.sharding_memory " + " ".join(argv or sys.argv[1:]), "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
