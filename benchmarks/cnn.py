"""Workload 3: a LeNet-style CNN, and the convolution formulations the investigation compares.

Network (VALID 5x5 convs, as LeNet): ``conv5x5x32 - ReLU - maxpool2 - conv5x5x64 - ReLU -
maxpool2 - flatten - dense128 - ReLU - dense10``, 28x28x1 inputs, batch 128, softmax CE,
Adam(1e-3). Every peer loads the same initial weights (PyTorch's default init, drawn once
in NumPy); channels-first peers get the transposed kernels and a dense128 kernel whose
rows are permuted to their flatten order, so all peers compute the same function and
their first-step losses agree.

Convolution formulations (NHWC, stride 1, VALID):

* :func:`xla_conv`: ``lax.conv_general_dilated`` - what funcnet's ``Conv`` and stax use.
* :func:`im2col_conv`: the ``kh*kw`` shifted views of the input concatenated on the channel
  axis, then one matmul. Autodiff gives matmuls for both gradients, plus pads/adds (the
  transpose of the slices) for the input gradient.
* :func:`conv_im2col_vjp`: the same with a ``jax.custom_vjp`` and an explicit matmul backward.
* :func:`rows_conv`, :func:`patches_conv`, :func:`conv_fastdx`: measured by
  :mod:`benchmarks.conv_probe` / in ``CONV_NOTES.md`` and not kept as peers (slower).

Max-pool formulations (2x2, stride 2): :func:`maxpool_reduce_window` (funcnet's ``MaxPool``;
its gradient is XLA's slow select-and-scatter), :func:`maxpool_reshape` and
:func:`maxpool_reshape_first` (reshape + max / argmax; elementwise gradients).
See ``benchmarks/CONV_NOTES.md`` for the findings.

On a GPU (``cfg["device"] == "gpu"``) the torch peers move the model and the batches to
``cuda`` once (NCHW, torch's default layout; cuDNN picks its kernels, ``cudnn.benchmark``
left off as in a default run) and synchronise before every clock read. The GPU tier's
``funcnet-bf16`` is funcnet's network under ``precision.apply_policy`` (float32 params,
bfloat16 compute, float32 logits); ``torch-bf16`` is the torch step under
``torch.autocast(bfloat16)``.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from benchmarks import common

K = 5  # kernel size of both convolutions


# --------------------------------------------------------------------------- #
# Convolution and pooling formulations (NHWC, HWIO)
# --------------------------------------------------------------------------- #


def _shifted(x, kh, kw):
    """``(N, H-kh+1, W-kw+1, kh*kw*C)``: patch features ordered (i, j, c), matching HWIO.

    Built in two stages (the kw column shifts, then the kh row shifts of that), which
    XLA:CPU runs ~3x faster than one concatenation of kh*kw shifted slices.
    """
    import jax.numpy as jnp

    n, h, w, c = x.shape
    ho, wo = h - kh + 1, w - kw + 1
    cols = jnp.concatenate([x[:, :, j : j + wo, :] for j in range(kw)], axis=-1)  # (N, H, Wo, kw*C)
    return jnp.concatenate([cols[:, i : i + ho] for i in range(kh)], axis=-1)


def im2col_conv(x, W):
    """VALID stride-1 conv as shifted slices + one matmul; ``W`` is HWIO."""
    kh, kw, c, o = W.shape
    return _shifted(x, kh, kw) @ W.reshape(kh * kw * c, o)


def rows_conv(x, W):
    """VALID stride-1 conv as a width-only im2col and ``kh`` matmuls summed over the rows.

    ``cols = concat_j x[:, :, j:j+Wo]`` (N, H, Wo, kw*C), then
    ``y = sum_i cols[:, i:i+Ho] @ W[i].reshape(kw*C, O)``: patches are kh times smaller
    than full im2col; autodiff gives matmuls plus shifted adds.
    """
    import jax.numpy as jnp

    kh, kw, c, o = W.shape
    n, h, w, _ = x.shape
    ho, wo = h - kh + 1, w - kw + 1
    cols = jnp.concatenate([x[:, :, j : j + wo, :] for j in range(kw)], axis=-1)
    return sum(cols[:, i : i + ho] @ W[i].reshape(kw * c, o) for i in range(kh))


def patches_conv(x, W):
    """VALID stride-1 conv as ``conv_general_dilated_patches`` + matmul.

    The patch features are ordered (c, i, j), so the HWIO kernel is moved to (I, H, W, O).
    """
    from jax import lax

    kh, kw, c, o = W.shape
    p = lax.conv_general_dilated_patches(x, (kh, kw), (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return p @ W.transpose(2, 0, 1, 3).reshape(c * kh * kw, o)


def _make_conv_im2col_vjp():
    import jax

    @jax.custom_vjp
    def conv(x, W):
        return im2col_conv(x, W)

    def fwd(x, W):
        kh, kw, c, o = W.shape
        p = _shifted(x, kh, kw)
        return p @ W.reshape(-1, o), (p, x, W)

    def bwd(res, dy):
        p, x, W = res
        kh, kw, c, o = W.shape
        dy2 = dy.reshape(-1, o)
        dW = (p.reshape(-1, p.shape[-1]).T @ dy2).reshape(W.shape)
        dp = dy @ W.reshape(-1, o).T
        # col2im: the transpose of the (linear) patch extraction, i.e. an overlap-add.
        (dx,) = jax.linear_transpose(lambda x: _shifted(x, kh, kw), x)(dp)
        return dx, dW

    conv.defvjp(fwd, bwd)
    return conv


@functools.lru_cache(maxsize=None)
def _conv_im2col_vjp():
    return _make_conv_im2col_vjp()


def conv_im2col_vjp(x, W):
    """Same as :func:`im2col_conv`, with a hand-written VJP (dW = patchesᵀ·dy, dx = col2im(dy·Wᵀ))."""
    return _conv_im2col_vjp()(x, W)


def _make_conv_fastdx():
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def conv(x, W):
        return xla_conv(x, W)

    def fwd(x, W):
        return xla_conv(x, W), (x, W)

    def bwd(res, dy):
        x, W = res
        kh, kw, c, o = W.shape
        n, ho, wo, _ = dy.shape
        # dW: XLA's own rule. dx: kh*kw matmuls (N*Ho*Wo, O) x (O, C), each added into its
        # shifted window - XLA:CPU runs this faster than its transposed convolution.
        _, vjp_w = jax.vjp(lambda W: xla_conv(x, W), W)
        (dW,) = vjp_w(dy)
        dx = jnp.zeros(x.shape, dy.dtype)
        for i in range(kh):
            for j in range(kw):
                dx = dx.at[:, i : i + ho, j : j + wo, :].add(dy @ W[i, j].T)
        return dx, dW

    conv.defvjp(fwd, bwd)
    return conv


@functools.lru_cache(maxsize=None)
def _conv_fastdx():
    return _make_conv_fastdx()


def conv_fastdx(x, W):
    """XLA's convolution forward and filter gradient; the input gradient as kh*kw shifted
    matmul-adds (VALID, stride 1, NHWC/HWIO)."""
    return _conv_fastdx()(x, W)


def xla_conv(x, W):
    from jax import lax

    return lax.conv_general_dilated(x, W, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def maxpool_reduce_window(x):
    """2x2/2 max pool (NHWC) as ``lax.reduce_window`` (funcnet's MaxPool, stax); its gradient
    is XLA's select-and-scatter."""
    import jax.numpy as jnp
    from jax import lax

    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def maxpool_reshape(x):
    """2x2/2 max pool (NHWC, even sizes) as a reshape + max; its gradient is a compare/select."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def maxpool_reshape_first(x):
    """2x2/2 max pool as reshape + argmax + one-hot select: the gradient goes to the first
    maximum of each window (torch's and select-and-scatter's tie rule), still elementwise."""
    import jax
    import jax.numpy as jnp

    n, h, w, c = x.shape
    win = x.reshape(n, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 5, 2, 4).reshape(n, h // 2, w // 2, c, 4)
    first = jax.nn.one_hot(jnp.argmax(win, axis=-1), 4, dtype=x.dtype)
    return jnp.sum(win * jax.lax.stop_gradient(first), axis=-1)


# --------------------------------------------------------------------------- #
# Weights and data
# --------------------------------------------------------------------------- #


def cnn_weights(seed: int = 0):
    """NHWC-model weights: conv kernels HWIO, dense kernels (in, out); PyTorch default init."""
    rng = np.random.default_rng(seed)
    u = common.torch_default_uniform
    return {
        "W1": u(rng, (K, K, 1, 32), K * K * 1),
        "b1": u(rng, (32,), K * K * 1),
        "W2": u(rng, (K, K, 32, 64), K * K * 32),
        "b2": u(rng, (64,), K * K * 32),
        "W3": u(rng, (4 * 4 * 64, 128), 4 * 4 * 64),
        "b3": u(rng, (128,), 4 * 4 * 64),
        "W4": u(rng, (128, 10), 128),
        "b4": u(rng, (10,), 128),
    }


def to_channels_first(w):
    """The same network for NCHW inputs: OIHW kernels, dense128 rows in (c, h, w) order."""
    out = dict(w)
    out["W1"] = w["W1"].transpose(3, 2, 0, 1).copy()
    out["W2"] = w["W2"].transpose(3, 2, 0, 1).copy()
    out["W3"] = w["W3"].reshape(4, 4, 64, 128).transpose(2, 0, 1, 3).reshape(1024, 128).copy()
    return out


# --------------------------------------------------------------------------- #
# JAX peers
# --------------------------------------------------------------------------- #


def _hand_forward(conv, pool, channels_first=False):
    import jax

    def forward(p, x):
        if channels_first:
            from jax import lax

            def conv_(x, W):
                return lax.conv_general_dilated(x, W, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))

            def pool_(x):
                return lax.reduce_window(x, -jax.numpy.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

            bias = lambda b: b[:, None, None]
        else:
            conv_, pool_, bias = conv, pool, (lambda b: b)
        x = pool_(jax.nn.relu(conv_(x, p["W1"]) + bias(p["b1"])))
        x = pool_(jax.nn.relu(conv_(x, p["W2"]) + bias(p["b2"])))
        x = x.reshape(x.shape[0], -1)
        x = jax.nn.relu(x @ p["W3"] + p["b3"])
        return x @ p["W4"] + p["b4"]

    return forward


def Im2colConv(out_chan, filter_shape):
    """A funcnet-contract Conv (VALID, stride 1, NHWC/HWIO) whose compute is :func:`im2col_conv`.

    Benchmark-local: it shows what ``funcnet.layers.Conv(..., implementation="im2col")``
    would do; params are ``{"W": HWIO, "b": (out_chan,)}`` like funcnet's Conv.
    """
    import jax
    import jax.numpy as jnp
    from funcnet import initializers
    from funcnet.core import named

    kh, kw = filter_shape

    def init(rng, input_shape):
        n, h, w, c = input_shape
        k1, k2 = jax.random.split(rng)
        params = {
            "W": initializers.torch_default()(k1, (kh, kw, c, out_chan), jnp.float32),
            "b": initializers.torch_default_bias(kh * kw * c)(k2, (out_chan,), jnp.float32),
        }
        return (n, h - kh + 1, w - kw + 1, out_chan), params, ()

    def apply(params, state, inputs, *, rng=None, train=False):
        return im2col_conv(inputs, params["W"]) + params["b"], state

    return named(f"Im2colConv({out_chan}, {filter_shape!r})", init, apply)


def _funcnet_model(weights, im2col=False, conv_impl=("auto", "auto"), bf16=False):
    import jax
    import jax.numpy as jnp
    from funcnet import precision
    from funcnet.combinators import serial
    from funcnet.layers.activations import Relu
    from funcnet.layers.conv import Conv
    from funcnet.layers.dense import Dense
    from funcnet.layers.pooling import MaxPool
    from funcnet.layers.shape import Flatten

    C1, C2 = (Im2colConv,) * 2 if im2col else [functools.partial(Conv, implementation=impl) for impl in conv_impl]
    P = lambda: MaxPool((2, 2))  # window == stride: funcnet's reshape + argmax path
    net = serial(C1(32, (K, K)), Relu, P(), C2(64, (K, K)), Relu, P(), Flatten, Dense(128), Relu, Dense(10))
    init, apply = precision.apply_policy(net, "params=float32,compute=bfloat16,output=float32") if bf16 else net
    # Only the tree structure is needed (the shared weights replace the drawn ones), so
    # init is traced abstractly rather than run op by op.
    params, state = jax.eval_shape(lambda k: init(k, (-1, 28, 28, 1))[1:], jax.random.PRNGKey(0))
    names = iter([("W1", "b1"), ("W2", "b2"), ("W3", "b3"), ("W4", "b4")])
    loaded = []
    for p in params:
        if p:
            wn, bn = next(names)
            assert p["W"].shape == weights[wn].shape, (wn, p["W"].shape, weights[wn].shape)
            p = {"W": jnp.asarray(weights[wn]), "b": jnp.asarray(weights[bn])}
        loaded.append(p)
    params = tuple(loaded)
    return params, lambda params, x: apply(params, state, x)[0]


JAX_VARIANTS = {
    # peer -> (weights builder, forward builder, channels_first)
    "jax-nhwc": lambda w: ({k: v for k, v in w.items()}, _hand_forward(xla_conv, maxpool_reduce_window), False),
    "jax-nhwc-reshapepool": lambda w: (w, _hand_forward(xla_conv, maxpool_reshape), False),
    "jax-nhwc-firstmaxpool": lambda w: (w, _hand_forward(xla_conv, maxpool_reshape_first), False),
    "jax-nchw": lambda w: (to_channels_first(w), _hand_forward(None, None, channels_first=True), True),
    "jax-im2col": lambda w: (w, _hand_forward(im2col_conv, maxpool_reduce_window), False),
    "jax-im2col-vjp": lambda w: (w, _hand_forward(conv_im2col_vjp, maxpool_reduce_window), False),
}


def _jax_peer(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    import optax

    w = cnn_weights()
    channels_first, jit = False, None
    if peer.startswith("funcnet"):
        from funcnet import xla

        conv_impl = {"funcnet-xlaconv": ("xla", "xla"), "funcnet-unchunked": ("auto", "xla")}.get(
            peer, ("auto", "auto")
        )
        params, forward = _funcnet_model(w, im2col="im2col" in peer, conv_impl=conv_impl, bf16=peer == "funcnet-bf16")
        # "funcnet" (and its bf16 form) is compiled as fit compiles its steps; the other
        # funcnet peers are the plain jax.jit policy and its alternatives
        jit = xla.jit if peer in ("funcnet", "funcnet-bf16") else None
    else:
        wts, forward, channels_first = JAX_VARIANTS[peer](w)
        params = {k: jnp.asarray(v) for k, v in wts.items()}
    carry, step = common.jax_step(params, forward, optax.adam(case["lr"]), jit)

    xs, ys = common.mnist_like_batches(case["batch"], 8, seed=1, image=True)
    if channels_first:
        xs = xs.transpose(0, 1, 4, 2, 3).copy()
    batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in zip(xs, ys)]
    jax.block_until_ready(batches)
    return _steps_benchmark(cfg, case, carry, step, batches, jax.block_until_ready, float)


def _torch_peer(peer, cfg, case):
    import torch
    from torch import nn

    w = to_channels_first(cnn_weights())
    model = nn.Sequential(
        nn.Conv2d(1, 32, K),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, K),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(1024, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    with torch.no_grad():
        for layer, (wn, bn) in zip(
            [model[0], model[3], model[7], model[9]], [("W1", "b1"), ("W2", "b2"), ("W3", "b3"), ("W4", "b4")]
        ):
            W = w[wn] if layer.weight.ndim == 4 else w[wn].T
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(W)))
            layer.bias.copy_(torch.from_numpy(w[bn]))
    device = common.torch_device(cfg)
    model = model.to(device)  # before the optimizer takes its parameters
    opt = torch.optim.Adam(model.parameters(), lr=case["lr"])
    step = common.torch_step(model, opt, common.torch_autocast(peer, device))
    xs, ys = common.mnist_like_batches(case["batch"], 8, seed=1, image=True)
    batches = [
        (torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device), torch.from_numpy(y).long().to(device))
        for x, y in zip(xs, ys)
    ]
    common.torch_sync(device)

    return _steps_benchmark(
        cfg, case, None, step, batches, lambda x: common.torch_sync(device), lambda t: float(t.item())
    )


def _steps_benchmark(cfg, case, carry, step, batches, sync, to_float):
    """Compile + first step, two warm-up steps, then ``reps`` blocks of ``steps`` steps.

    Values are seconds per step (block time / steps).
    """
    nb = len(batches)
    t0 = time.perf_counter()
    carry, loss = step(carry, *batches[0])
    sync(loss)
    first_step = time.perf_counter() - t0
    loss_first = to_float(loss)
    for i in range(1, 3):
        carry, loss = step(carry, *batches[i % nb])
    sync((carry, loss))
    n = case["steps"]

    def block():
        nonlocal carry, loss
        for i in range(n):
            carry, loss = step(carry, *batches[i % nb])
        sync((carry, loss))

    values = [t / n for t in common.measure(block, case["reps"])]
    return {
        "values": values,
        "extra": {"first_step_s": first_step, "loss_first": loss_first, "loss_last": to_float(loss)},
    }


def run(peer, cfg, case):
    if peer.startswith("torch"):
        return _torch_peer(peer, cfg, case)
    return _jax_peer(peer, cfg, case)
