"""Workload 8: bfloat16 compute against float32, speed and accuracy, on the real MNIST.

Workload 1's MLP and workload 3's CNN, built from funcnet layers, trained on the MNIST
files shipped in ``data/mnist`` (not synthetic data: the accuracy cost is the point).
Peers:

* ``f32``: everything in float32.
* ``bf16``: ``funcnet.precision.apply_policy(net, "params=float32,compute=bfloat16,
  output=float32")``: float32 master weights and optimizer state, the layers compute in
  bfloat16, the loss in float32.

Both start from the same weights and see the same batches (a fixed shuffle). Timed:
seconds per step over blocks of ``steps`` steps after compilation and two warm-up
steps. After the timed blocks (``warmup + reps * steps`` steps of training in all)
the test accuracy on the 10000 test images is reported: the accuracy cost of bf16 at
the same number of steps.
"""

from __future__ import annotations

import time

from benchmarks import common


def _net(model):
    import funcnet
    from funcnet.layers import Conv, Dense, Flatten, MaxPool, Relu

    if model == "mlp":
        return funcnet.serial(Dense(400), Relu, Dense(100), Relu, Dense(10)), (-1, 784)
    return (
        funcnet.serial(
            Conv(32, (5, 5)),
            Relu,
            MaxPool((2, 2)),
            Conv(64, (5, 5)),
            Relu,
            MaxPool((2, 2)),
            Flatten,
            Dense(128),
            Relu,
            Dense(10),
        ),
        (-1, 28, 28, 1),
    )


def run(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from funcnet import datasets, losses, precision
    from funcnet.train import Aux, TrainState, make_train_step

    flat = case["model"] == "mlp"
    x, y = datasets.mnist.load("train", flatten=flat, download=False)
    x_test, y_test = datasets.mnist.load("test", flatten=flat, download=False)
    net, in_shape = _net(case["model"])
    if peer == "bf16":
        net = precision.apply_policy(net, "params=float32,compute=bfloat16,output=float32")
    opt = optax.adam(case["lr"])
    ts = TrainState.create(net, opt, jax.random.key(0), in_shape)

    def loss_fn(p, s, b, key):
        logits, s = net.apply(p, s, b[0], rng=key, train=True)
        return losses.cross_entropy(logits, b[1]), Aux(state=s)

    step = jax.jit(make_train_step(loss_fn, opt), donate_argnums=0)
    batch, steps = case["batch"], case["quick_steps"] if cfg["quick"] else case["steps"]
    reps = case["quick_reps"] if cfg["quick"] else case["reps"]
    order = np.random.default_rng(0).permutation(len(x))
    n_batches = len(x) // batch
    xs = jnp.asarray(x[order[: n_batches * batch]].reshape(n_batches, batch, *x.shape[1:]))
    ys = jnp.asarray(y[order[: n_batches * batch]].reshape(n_batches, batch))
    done = 0

    def run_steps(ts, n):
        nonlocal done
        for _ in range(n):
            ts, m = step(ts, (xs[done % n_batches], ys[done % n_batches]))
            done += 1
        return ts, m

    t0 = time.perf_counter()
    ts, m = run_steps(ts, 1)
    common.block(m)
    first = time.perf_counter() - t0
    ts, m = run_steps(ts, 2)
    common.block(m)
    holder = {"ts": ts, "m": m}

    def block():
        holder["ts"], holder["m"] = run_steps(holder["ts"], steps)
        common.block(holder["m"])

    values = [t / steps for t in common.measure(block, reps)]
    ts, m = holder["ts"], holder["m"]
    predict = jax.jit(lambda p, s, xb: jnp.argmax(net.apply(p, s, xb)[0], -1))
    correct = sum(
        int(jnp.sum(predict(ts.params, ts.state, x_test[i : i + 1000]) == y_test[i : i + 1000]))
        for i in range(0, len(x_test), 1000)
    )
    return {
        "values": values,
        "extra": {
            "first_step_s": first,
            "steps_trained": done,
            "test_acc": 100.0 * correct / len(x_test),
            "loss_last": float(m["loss"]),
        },
    }
