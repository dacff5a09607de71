"""docs/porting.md's one-line equivalents, checked against the other frameworks' rules.

tinynn is not installed: its rules are written out below in NumPy from its source
(borgwang/tinynn, tinynn/core), and funcnet's equivalent is compared with them. stax
(``jax.example_libraries.stax``) and torch are run. MXNet's rows in the guide come
from reading MXNet 1.9.0's source and are not checked here.
"""

import numpy as np
import jax
import jax.numpy as jnp
import optax
import pytest
from helpers.torch_ref import torch
from jax.example_libraries import stax

import funcnet
from funcnet import data, losses, optim
from funcnet.layers import Conv, ConvTranspose, Dense, LeakyRelu, Relu

RNG = np.random.default_rng(0)


def _tinynn_conv_transpose(x, W, stride, padding):
    """tinynn's ConvTranspose2D forward (one spatial axis pair, NHWC, kernel (k, k, in, out)):
    zeros inserted after every input pixel, then padded, then a stride-1 cross-correlation."""
    n, i, _, _ = x.shape
    k = W.shape[0]
    size = i * stride if padding == "SAME" else (i - 1) * stride + 1
    up = np.zeros((n, size, size, x.shape[-1]))
    up[:, ::stride, ::stride] = x
    lo = (k - 1) // 2 if padding == "SAME" else k - 1  # SAME: k - 1 in all, low half first
    hi = k - 1 - lo if padding == "SAME" else k - 1
    padded = np.pad(up, ((0, 0), (lo, hi), (lo, hi), (0, 0)))
    out = padded.shape[1] - k + 1
    return np.stack(
        [
            np.stack([np.einsum("nhwc,hwco->no", padded[:, a : a + k, b : b + k], W) for b in range(out)], 1)
            for a in range(out)
        ],
        1,
    )


@pytest.mark.parametrize("k, stride", [(5, 2), (4, 2), (3, 1)])
def test_tinynn_same_conv_is_explicit_padding(k, stride):
    """tinynn's Conv2D "SAME" pads k - 1 in all, (k - 1) // 2 first, whatever the stride."""
    x, W = RNG.normal(size=(2, 9, 9, 3)), RNG.normal(size=(k, k, 3, 2))
    lo = (k - 1) // 2
    padded = np.pad(x, ((0, 0), (lo, k - 1 - lo), (lo, k - 1 - lo), (0, 0)))
    out = (padded.shape[1] - k) // stride + 1
    ref = np.stack(
        [
            np.stack(
                [
                    np.einsum("nhwc,hwco->no", padded[:, a * stride : a * stride + k, b * stride : b * stride + k], W)
                    for b in range(out)
                ],
                1,
            )
            for a in range(out)
        ],
        1,
    )
    y, _ = Conv(2, (k, k), strides=stride, padding=((lo, k - 1 - lo),) * 2).apply(
        {"W": jnp.asarray(W, jnp.float32), "b": jnp.zeros(2)}, (), jnp.asarray(x, jnp.float32)
    )
    np.testing.assert_allclose(y, ref, atol=1e-4)


@pytest.mark.parametrize("k, stride", [(5, 2), (3, 2), (4, 2), (5, 1)])
def test_tinynn_same_transposed_conv_is_explicit_padding_with_a_flipped_kernel(k, stride):
    x, W = RNG.normal(size=(2, 4, 4, 3)), RNG.normal(size=(k, k, 3, 2))
    lo = k - 1 - (k - 1) // 2
    layer = ConvTranspose(2, (k, k), strides=stride, padding=((lo, k - stride - lo),) * 2)
    y, _ = layer.apply(
        {"W": jnp.asarray(W[::-1, ::-1], jnp.float32), "b": jnp.zeros(2)}, (), jnp.asarray(x, jnp.float32)
    )
    np.testing.assert_allclose(y, _tinynn_conv_transpose(x, W, stride, "SAME"), atol=1e-4)
    if (k, stride) == (5, 2):
        assert (lo, k - stride - lo) == (2, 1)  # the guide's example


def test_tinynn_valid_transposed_conv_is_valid_with_a_flipped_kernel():
    x, W = RNG.normal(size=(2, 4, 4, 3)), RNG.normal(size=(5, 5, 3, 2))
    y, _ = ConvTranspose(2, (5, 5), strides=2, padding="VALID").apply(
        {"W": jnp.asarray(W[::-1, ::-1], jnp.float32), "b": jnp.zeros(2)}, (), jnp.asarray(x, jnp.float32)
    )
    np.testing.assert_allclose(y, _tinynn_conv_transpose(x, W, 2, "VALID"), atol=1e-4)


def test_tinynn_losses_are_sum_mean():
    p, t = RNG.normal(size=(8, 5)), RNG.random((8, 5))
    b = p.shape[0]
    np.testing.assert_allclose(
        0.5 * losses.mse(p, t, reduction="sum_mean"), 0.5 * np.sum((p - t) ** 2) / b, rtol=1e-5
    )  # tinynn MSE
    np.testing.assert_allclose(
        losses.mae(p, t, reduction="sum_mean"), np.sum(np.abs(p - t)) / b, rtol=1e-5
    )  # tinynn MAE
    err = np.abs(p - t)
    huber = np.where(err < 1.0, 0.5 * err**2, err - 0.5)
    np.testing.assert_allclose(losses.huber(p, t, reduction="sum_mean"), huber.sum() / b, rtol=1e-5)  # tinynn Huber
    y = (t > 0.5).astype(np.float64)
    log_sigmoid = -np.log1p(np.exp(-p))
    np.testing.assert_allclose(
        losses.sigmoid_binary_cross_entropy(p, y, reduction="sum_mean"),
        np.sum(p * (1 - y) - log_sigmoid) / b,
        rtol=1e-5,
    )  # tinynn SigmoidCE
    onehot = np.eye(5)[RNG.integers(0, 5, 8)]
    log_softmax = p - np.log(np.exp(p).sum(1, keepdims=True))
    np.testing.assert_allclose(
        losses.cross_entropy(p, onehot.argmax(1)), -np.sum(log_softmax * onehot) / b, rtol=1e-5
    )  # SoftmaxCE


def _run(tx, p, grads):
    p = jnp.asarray(p, jnp.float32)
    state = tx.init(p)
    for g in grads:
        updates, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
        p = optax.apply_updates(p, updates)
    return np.asarray(p)


def test_tinynn_optimizers():
    p0, grads = RNG.normal(size=6), RNG.normal(size=(20, 6))
    # RMSProp(lr): v += (1 - 0.99) * (g^2 - v); p -= lr * g / sqrt(v + eps)
    p, v = p0.copy(), 0.0
    for g in grads:
        v += 0.01 * (g**2 - v)
        p -= 0.01 * g / np.sqrt(v + 1e-8)
    np.testing.assert_allclose(_run(optax.rmsprop(0.01, decay=0.99), p0, grads), p, atol=1e-5)
    # Adam(lr, weight_decay=wd): the Adam step, then p -= lr * wd * p (decoupled)
    p, m, v = p0.copy(), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        m += 0.1 * (g - m)
        v += 0.001 * (g**2 - v)
        step = -1e-2 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        p = p + step - 1e-2 * 0.1 * p
    np.testing.assert_allclose(_run(optim.adamw(1e-2, weight_decay=0.1), p0, grads), p, atol=1e-5)


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_stax_conv_transpose_is_funcnets_with_a_flipped_kernel(padding):
    init, apply = stax.ConvTranspose(4, (5, 5), (2, 2), padding)
    _, (W, b) = init(jax.random.key(0), (2, 7, 7, 3))
    x = jnp.asarray(RNG.normal(size=(2, 7, 7, 3)), jnp.float32)
    y, _ = ConvTranspose(4, (5, 5), strides=2, padding=padding).apply({"W": W[::-1, ::-1], "b": b.reshape(-1)}, (), x)
    np.testing.assert_allclose(y, apply((W, b), x), atol=1e-5)


def test_stax_params_convert_to_funcnets():
    init, apply = stax.serial(stax.Dense(16), stax.Relu, stax.Dense(3))
    _, stax_params = init(jax.random.key(0), (-1, 8))
    net = funcnet.serial(Dense(16), Relu, Dense(3))
    params = tuple({"W": p[0], "b": p[1]} if p else () for p in stax_params)
    x = jnp.asarray(RNG.normal(size=(4, 8)), jnp.float32)
    np.testing.assert_allclose(net.apply(params, (), x)[0], apply(stax_params, x), atol=1e-6)


def test_torch_defaults_named_in_the_guide():
    x = torch.linspace(-2, 2, 9)
    np.testing.assert_allclose(
        LeakyRelu().apply((), (), jnp.asarray(x.numpy()))[0], torch.nn.LeakyReLU()(x).numpy(), rtol=1e-6
    )
    sizes = [len(b) for b in torch.utils.data.DataLoader(torch.arange(10), batch_size=4)]
    assert sizes == [4, 4, 2]
    assert [len(b) for b in data.batches(np.arange(10), 4, drop_remainder=False)] == sizes
    assert [len(b) for b in data.batches(np.arange(10), 4)] == [4, 4]


def _porting_block(name):
    """The ```python block of docs/porting.md that defines ``name``, executed."""
    import os
    import re

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "porting.md")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", open(path).read(), re.S) if f"def {name}(" in b]
    assert len(blocks) == 1, f"docs/porting.md should define {name} once"
    scope = {}
    exec(compile(blocks[0], "docs/porting.md", "exec"), scope)
    return scope[name]


@pytest.mark.parametrize("kdim", [None, 5])
def test_torch_multihead_attention_mapping(kdim):
    """The guide's mha_params_from_torch: same outputs and input gradients as torch."""
    from funcnet.layers import MultiHeadAttention, causal_mask

    convert = _porting_block("mha_params_from_torch")
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(6, 2, kdim=kdim, vdim=kdim, batch_first=True)
    q = RNG.normal(size=(2, 4, 6)).astype(np.float32)
    kv = RNG.normal(size=(2, 4, kdim or 6)).astype(np.float32) if kdim else q
    tq = torch.tensor(q, requires_grad=True)
    want, _ = mha(
        tq, torch.tensor(kv), torch.tensor(kv), need_weights=False, attn_mask=torch.tensor(~np.asarray(causal_mask(4)))
    )
    want.sum().backward()
    layer = MultiHeadAttention(2)
    f = lambda q: layer.apply(convert(mha), (), (q, jnp.asarray(kv)), mask=causal_mask(4))[0]
    np.testing.assert_allclose(f(jnp.asarray(q)), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.grad(lambda q: f(q).sum())(jnp.asarray(q)), tq.grad.numpy(), rtol=1e-5, atol=1e-5)
