"""Workload 6b: ``funcnet.fit`` on the network families users train, against a
hand-written loop and, for Flax's MNIST CNN, Flax NNX itself.

Networks (cases), each on synthetic data of its shape (timing only):

* ``flax-cnn``: the CNN of Flax NNX's MNIST tutorial: conv3x3x32 SAME - dropout(0.025) -
  BatchNorm - ReLU - avgpool2 - conv3x3x64 SAME - BatchNorm - ReLU - avgpool2 - dense256 -
  dropout - ReLU - dense10; batch 128, SGD(0.05, momentum 0.9), softmax CE.
* ``lenet``: benchmark workload 3's LeNet (VALID 5x5 convolutions, max pooling), batch 128,
  Adam(1e-3).
* ``gpt``: nanoGPT's character GPT in its CPU configuration (4 layers, 4 heads, 128 wide,
  block 64, batch 12; ``funcnet.models.GPT``), AdamW(1e-3), on 64-token windows.

Peers (every fit peer but ``fit-device-quiet`` draws its tqdm bar into a null stream;
every one collects its metrics):

* ``fit``: ``fit`` with its defaults over the host pipeline ``data.batches``.
* ``fit-device``: ``fit`` with its defaults over ``data.DeviceData`` (data on the device once).
* ``fit-device-quiet``: ``fit-device`` with ``progress=False``: no bar, so no loss read
  every ``log_every`` steps; ``fit-device`` ÷ this is what the bar costs.
* ``fit-device-loop``: the same with ``steps_per_dispatch=10`` (a loop on the device: fit's
  default before 2026-11-27 for every network; now only where no convolution runs on CPU).
* ``fit-device-plain``: ``fit-device`` with ``compiler_options=None`` (plain ``jax.jit``;
  fit's default for every network before 2026-11-27 evening).
* ``fit-device-options``: ``fit-device`` with ``compiler_options=funcnet.xla.compiler_options()``
  (fit's default for the CNNs on CPU).
* ``jit-loop``: a Python loop over ``jax.jit(make_train_step(...))`` on batches already on the
  device: the same network and step with nothing of fit's around it.
* ``jit-loop-options``: the same loop over ``funcnet.xla.jit(make_train_step(...))``.
* ``flax`` (``flax-cnn`` only): the tutorial's model in ``flax.nnx`` and its ``nnx.jit`` train
  step, on the same device batches (``pip install .[bench]``).

Each fit call runs ``1 + reps`` epochs of ``steps`` steps; the first (with compilation) is
reported apart and the others are timed by a callback that blocks on the params at each
epoch's end; the loops time ``reps`` epochs likewise. Values are seconds per step.
"""

from __future__ import annotations

import contextlib
import functools
import io
import time

import numpy as np

from benchmarks import common

LOOP_K = 10  # fit-device-loop's steps per dispatch (each case's steps are a multiple)


def _flax_cnn_funcnet():
    from funcnet.combinators import serial
    from funcnet.layers import AvgPool, BatchNorm, Conv, Dense, Dropout, Flatten, Relu

    return serial(
        Conv(32, (3, 3), padding="SAME"),
        Dropout(0.025),
        BatchNorm(),
        Relu,
        AvgPool((2, 2), (2, 2)),
        Conv(64, (3, 3), padding="SAME"),
        BatchNorm(),
        Relu,
        AvgPool((2, 2), (2, 2)),
        Flatten,
        Dense(256),
        Dropout(0.025),
        Relu,
        Dense(10),
    )


def _lenet_funcnet():
    from funcnet.combinators import serial
    from funcnet.layers import Conv, Dense, Flatten, MaxPool, Relu

    return serial(
        Conv(32, (5, 5)),
        Relu,
        MaxPool((2, 2), (2, 2)),
        Conv(64, (5, 5)),
        Relu,
        MaxPool((2, 2), (2, 2)),
        Flatten,
        Dense(128),
        Relu,
        Dense(10),
    )


def _setup(case, steps):
    """``(net, optimizer, input shape, loss_fn, (x, y))`` of the case, ``steps`` batches of
    host arrays."""
    import optax

    from funcnet import losses
    from funcnet.train import Aux

    rng = np.random.default_rng(0)
    n = steps * case["batch"]
    if case["net"] == "gpt":
        from funcnet.models import GPT

        net = GPT(65, 64, n_layer=4, n_head=4, n_embd=128, bias=False)
        opt = optax.adamw(1e-3, b1=0.9, b2=0.99, weight_decay=0.1)
        text = rng.integers(0, 65, n * 65 + 1).astype(np.int32)
        starts = rng.integers(0, len(text) - 65, n)
        windows = np.stack([text[s : s + 65] for s in starts])
        xy = (windows[:, :-1], windows[:, 1:])
        in_shape = (64,)
    else:
        net = _flax_cnn_funcnet() if case["net"] == "flax-cnn" else _lenet_funcnet()
        opt = optax.sgd(0.05, momentum=0.9) if case["net"] == "flax-cnn" else optax.adam(1e-3)
        xy = (rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32))
        in_shape = (28, 28, 1)

    def loss_fn(params, state, batch, key):
        logits, state = net.apply(params, state, batch[0], rng=key, train=True)
        return losses.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[1].reshape(-1)), Aux(state=state)

    return net, opt, in_shape, loss_fn, xy


def run(peer, cfg, case):
    import jax

    from funcnet.train import TrainState

    steps = case["quick_steps"] if cfg["quick"] else case["steps"]
    net, opt, in_shape, loss_fn, (x, y) = _setup(case, steps)
    batch = case["batch"]
    reps = case["quick_reps"] if cfg["quick"] else case["reps"]
    ts = TrainState.create(net, opt, jax.random.key(0), (-1, *in_shape))
    if peer.startswith("fit"):
        seconds, first = _fit(peer, ts, loss_fn, opt, x, y, batch, reps)
    else:
        make = {"flax": _flax_epoch, "jit-loop-options": functools.partial(_jit_epoch, options=True)}
        one_epoch = make.get(peer, _jit_epoch)(ts, loss_fn, opt, x, y, batch)
        t0 = time.perf_counter()
        one_epoch()
        first = time.perf_counter() - t0
        seconds = common.measure(one_epoch, reps)
    return {"values": [s / steps for s in seconds], "extra": {"first_epoch_s": first}}


def _fit(peer, ts, loss_fn, opt, x, y, batch, reps):
    """Seconds of each of ``reps`` epochs of ``fit`` after the first, and the first's."""
    from funcnet import data, fit, xla
    from funcnet.loop import FitOptions

    if peer == "fit":
        train_data = lambda e: data.batches((x, y), batch, shuffle=True, rng=0, epoch=e)  # noqa: E731
    else:
        train_data = data.DeviceData((x, y), batch, shuffle=True, rng=0)
    clock = common.epoch_clock()
    with contextlib.redirect_stderr(io.StringIO()):
        fit(
            ts,
            loss_fn,
            opt,
            train_data,
            epochs=1 + reps,
            callbacks=[clock],
            progress=common.draws_bar(peer),
            options=FitOptions(
                log_every=LOOP_K,
                steps_per_dispatch=LOOP_K if peer == "fit-device-loop" else None,
                compiler_options={"fit-device-options": xla.compiler_options(), "fit-device-plain": None}.get(
                    peer, "auto"
                ),
            ),
        )
    epochs = clock.epochs
    return epochs[1:], epochs[0]


def _device_batches(x, y, batch):
    import jax.numpy as jnp
    from funcnet import data

    order = data.epoch_order(len(x), 0, 0)
    out = [
        (jnp.asarray(x[order[i : i + batch]]), jnp.asarray(y[order[i : i + batch]])) for i in range(0, len(x), batch)
    ]
    common.block(out)
    return out


def _jit_epoch(ts, loss_fn, opt, x, y, batch, options=False):
    import jax

    from funcnet import xla
    from funcnet.train import make_train_step

    jit = xla.jit if options else jax.jit
    step = jit(make_train_step(loss_fn, opt), donate_argnums=0)
    batches, holder = _device_batches(x, y, batch), {"ts": ts}

    def one_epoch():
        t = holder["ts"]
        for b in batches:
            t, _ = step(t, b)
        common.block(t.params)
        holder["ts"] = t

    return one_epoch


def _flax_epoch(ts, loss_fn, opt, x, y, batch):
    """Flax NNX's tutorial CNN and train step (``nnx.jit``), on the same device batches."""
    import optax
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, *, rngs):
            self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
            self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
            self.dropout1 = nnx.Dropout(0.025, rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
            self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
            self.avg_pool = functools.partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
            self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
            self.dropout2 = nnx.Dropout(0.025, rngs=rngs)
            self.linear2 = nnx.Linear(256, 10, rngs=rngs)

        def __call__(self, x):
            x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x)))))
            x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
            x = nnx.relu(self.dropout2(self.linear1(x.reshape(x.shape[0], -1))))
            return self.linear2(x)

    model = CNN(rngs=nnx.Rngs(0))
    model.train()
    optimizer = nnx.Optimizer(model, optax.sgd(0.05, momentum=0.9), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, xb, yb):
        def loss(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(xb), yb).mean()

        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    batches = _device_batches(x, y, batch)

    def one_epoch():
        for xb, yb in batches:
            value = train_step(model, optimizer, xb, yb)
        common.block(value)

    return one_epoch
