"""Workloads 1 and 2: an MNIST MLP trained for an epoch by every peer.

Every peer
* starts from the same weights (:func:`benchmarks.common.mlp_weights`, PyTorch's default
  ``U(±1/sqrt(fan_in))``), loaded into its own parameter layout;
* runs the same step: forward, mean softmax cross-entropy over integer labels, backward,
  optimizer update, all inside one compiled function for the JAX peers (no buffer
  donation anywhere), eager for PyTorch;
* sees the same pre-built on-device batches, so no data loading or host->device copy is
  timed; an "epoch" is ``60000 // batch`` steps cycling through a pool of batches;
* returns the loss of its first step and of the last warm-up step: identical initial
  weights and data mean those must agree across peers (the orchestrator checks).

Each JAX peer uses its framework's idiomatic jit: ``jax.jit`` for funcnet, hand-written
JAX, stax, Flax Linen and Haiku; ``eqx.filter_jit`` for Equinox; ``nnx.jit`` for Flax NNX.

On a GPU (``cfg["device"] == "gpu"``) the torch peers move the model and the batch pool to
``cuda`` once and synchronise before every clock read. The GPU tier's ``funcnet-bf16``
wraps funcnet's MLP in ``precision.apply_policy`` (float32 params, bfloat16 compute,
float32 logits), ``torch-bf16`` runs the torch step under ``torch.autocast(bfloat16)``.
"""

from __future__ import annotations

import time

from benchmarks import common


# --------------------------------------------------------------------------- #
# Models: each builder returns (params, forward(params, x) -> logits) for a JAX peer.
# --------------------------------------------------------------------------- #

BF16_POLICY = "params=float32,compute=bfloat16,output=float32"  # workload 8's bf16 peer's


def _funcnet(weights, bf16=False):
    import jax
    import jax.numpy as jnp
    from funcnet import precision
    from funcnet.combinators import serial
    from funcnet.layers.dense import Dense
    from funcnet.layers.activations import Relu

    layers = []
    for i, (W, _) in enumerate(weights):
        layers.append(Dense(W.shape[1]))
        if i < len(weights) - 1:
            layers.append(Relu)
    net = serial(*layers)
    init, apply = precision.apply_policy(net, BF16_POLICY) if bf16 else net
    # Only the tree structure is needed (the shared weights replace the drawn ones), so
    # init is traced abstractly rather than run op by op.
    params, state = jax.eval_shape(lambda k: init(k, (-1, weights[0][0].shape[0]))[1:], jax.random.PRNGKey(0))
    # Replace the drawn weights with the shared ones, keeping funcnet's own tree structure.
    it, loaded = iter(weights), []
    for p in params:
        if p:
            W, b = next(it)
            assert p["W"].shape == W.shape and p["b"].shape == b.shape, "funcnet Dense layout changed"
            p = {"W": jnp.asarray(W), "b": jnp.asarray(b)}
        loaded.append(p)
    params = tuple(loaded)

    def forward(params, x):
        return apply(params, state, x)[0]

    return params, forward


def _hand(weights):
    import jax
    import jax.numpy as jnp

    params = [(jnp.asarray(W), jnp.asarray(b)) for W, b in weights]

    def forward(params, x):
        for W, b in params[:-1]:
            x = jax.nn.relu(x @ W + b)
        W, b = params[-1]
        return x @ W + b

    return params, forward


def _stax(weights):
    import jax
    import jax.numpy as jnp
    from jax.example_libraries import stax

    layers = []
    for i, (W, _) in enumerate(weights):
        layers.append(stax.Dense(W.shape[1]))
        if i < len(weights) - 1:
            layers.append(stax.Relu)
    init, apply = stax.serial(*layers)
    _, params = init(jax.random.PRNGKey(0), (-1, weights[0][0].shape[0]))
    it = iter(weights)
    params = [tuple(map(jnp.asarray, next(it))) if p else p for p in params]
    return params, apply


def _linen(weights):
    import jax
    import jax.numpy as jnp
    import flax.linen as nn

    sizes = [W.shape[1] for W, _ in weights]

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i, n in enumerate(sizes):
                x = nn.Dense(n, name=f"dense{i}")(x)
                if i < len(sizes) - 1:
                    x = nn.relu(x)
            return x

    model = MLP()
    params = {
        "params": {f"dense{i}": {"kernel": jnp.asarray(W), "bias": jnp.asarray(b)} for i, (W, b) in enumerate(weights)}
    }
    # Checks the hand-built tree against what Linen itself would create.
    ref = model.init(jax.random.PRNGKey(0), jnp.zeros((1, weights[0][0].shape[0])))
    assert jax.tree.structure(ref) == jax.tree.structure(params), "Linen param tree changed"
    return params, model.apply


def _haiku(weights):
    import jax
    import jax.numpy as jnp
    import haiku as hk

    sizes = [W.shape[1] for W, _ in weights]

    def net(x):
        return hk.nets.MLP(sizes, activation=jax.nn.relu, name="mlp")(x)

    model = hk.without_apply_rng(hk.transform(net))
    ref = model.init(jax.random.PRNGKey(0), jnp.zeros((1, weights[0][0].shape[0])))
    names = sorted(ref)  # mlp/~/linear_0, linear_1, ...
    params = {k: {"w": jnp.asarray(W), "b": jnp.asarray(b)} for k, (W, b) in zip(names, weights)}
    assert jax.tree.structure(ref) == jax.tree.structure(params), "Haiku param tree changed"
    return params, model.apply


# --------------------------------------------------------------------------- #
# Steps
# --------------------------------------------------------------------------- #


def _optax(case):
    import optax

    if case["opt"] == "adam":
        return optax.adam(case["lr"])
    return optax.sgd(case["lr"])


def _equinox_step(weights, tx):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    sizes = [weights[0][0].shape[0]] + [W.shape[1] for W, _ in weights]
    model = _eqx_sequential(sizes)
    it = iter(weights)

    def load(layer):
        W, b = next(it)
        return eqx.tree_at(lambda l: (l.weight, l.bias), layer, (jnp.asarray(W.T), jnp.asarray(b)))

    model = jax.tree.map(
        lambda l: load(l) if isinstance(l, eqx.nn.Linear) else l, model, is_leaf=lambda l: isinstance(l, eqx.nn.Linear)
    )
    batched = jax.vmap  # eqx layers act on single examples

    def loss_fn(model, x, y):
        logits = batched(model)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @eqx.filter_jit
    def step(carry, x, y):
        model, opt_state = carry
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return (eqx.apply_updates(model, updates), opt_state), loss

    return (model, tx.init(eqx.filter(model, eqx.is_array))), step


def _eqx_sequential(sizes):
    import equinox as eqx
    import jax

    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes) - 1)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(eqx.nn.Linear(a, b, key=keys[i]))
        if i < len(sizes) - 2:
            layers.append(eqx.nn.Lambda(jax.nn.relu))
    return eqx.nn.Sequential(layers)


def _nnx_step(weights, tx):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(W.shape[0], W.shape[1], rngs=rngs) for W, _ in weights])

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    model = MLP(nnx.Rngs(0))
    for layer, (W, b) in zip(model.layers, weights):
        layer.kernel.value = jnp.asarray(W)
        layer.bias.value = jnp.asarray(b)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    def loss_fn(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    @nnx.jit
    def nnx_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    def step(carry, x, y):  # nnx mutates in place; the carry is the (model, optimizer) pair
        return carry, nnx_step(carry[0], carry[1], x, y)

    return (model, optimizer), step


JAX_BUILDERS = {
    "funcnet": _funcnet,
    "funcnet-bf16": lambda w: _funcnet(w, bf16=True),
    "jax": _hand,
    "stax": _stax,
    "flax-linen": _linen,
    "haiku": _haiku,
}


def _jax_peer(peer, cfg, case):
    import jax
    import jax.numpy as jnp

    weights = common.mlp_weights(case["sizes"], seed=0)
    tx = _optax(case)
    if peer in JAX_BUILDERS:
        params, forward = JAX_BUILDERS[peer](weights)
        carry, step = common.jax_step(params, forward, tx)
    elif peer == "equinox":
        carry, step = _equinox_step(weights, tx)
    elif peer == "flax-nnx":
        carry, step = _nnx_step(weights, tx)
    else:
        raise ValueError(peer)
    xs, ys = _data(cfg, case)
    batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in zip(xs, ys)]
    jax.block_until_ready(batches)

    def sync(x):
        return jax.block_until_ready(x)

    return _epoch_benchmark(cfg, case, carry, step, batches, sync, float)


def _torch_peer(peer, cfg, case):
    import torch
    from torch import nn

    weights = common.mlp_weights(case["sizes"], seed=0)
    mods = []
    for i, (W, b) in enumerate(weights):
        lin = nn.Linear(W.shape[0], W.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        mods.append(lin)
        if i < len(weights) - 1:
            mods.append(nn.ReLU())
    device = common.torch_device(cfg)
    model = nn.Sequential(*mods).to(device)  # before the optimizer takes its parameters
    if case["opt"] == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=case["lr"])
    else:
        opt = torch.optim.SGD(model.parameters(), lr=case["lr"])
    step = common.torch_step(model, opt, common.torch_autocast(peer, device))
    xs, ys = _data(cfg, case)
    batches = [(torch.from_numpy(x).to(device), torch.from_numpy(y).long().to(device)) for x, y in zip(xs, ys)]
    common.torch_sync(device)

    return _epoch_benchmark(
        cfg, case, None, step, batches, lambda x: common.torch_sync(device), lambda t: float(t.item())
    )


def _data(cfg, case):
    return common.mnist_like_batches(case["batch"], min(common.BATCH_POOL, _steps(cfg, case)), seed=1)


def _steps(cfg, case):
    full = common.steps_per_epoch(case["batch"])
    return min(full, case["quick_steps"]) if cfg["quick"] else full


def _epoch_benchmark(cfg, case, carry, step, batches, sync, to_float):
    """First step (compile), rest of the first epoch, then ``reps`` timed epochs.

    Reported values are seconds per full epoch (``60000 // batch`` steps). In --quick mode
    an "epoch" is ``quick_steps`` steps and the time is scaled to a full epoch.
    """
    n = _steps(cfg, case)
    full = common.steps_per_epoch(case["batch"])
    nb = len(batches)

    t0 = time.perf_counter()
    carry, loss = step(carry, *batches[0])
    sync(loss)
    first_step = time.perf_counter() - t0
    loss_first = to_float(loss)
    t1 = time.perf_counter()
    for i in range(1, n):
        carry, loss = step(carry, *batches[i % nb])
    sync((carry, loss))
    # In --quick mode the rest of the epoch is scaled up; the compile is counted once.
    first_epoch = first_step + (time.perf_counter() - t1) * (full - 1) / max(n - 1, 1)
    loss_warm = to_float(loss)

    def epoch():
        nonlocal carry, loss
        for i in range(n):
            carry, loss = step(carry, *batches[i % nb])
        sync((carry, loss))

    reps = case["quick_reps"] if cfg["quick"] else case["reps"]
    values = [t * full / n for t in common.measure(epoch, reps)]
    return {
        "values": values,
        "extra": {
            "first_step_s": first_step,
            "first_epoch_s": first_epoch,
            "loss_first": loss_first,
            "loss_warm": loss_warm,
            "steps_timed": n,
        },
    }


def run(peer, cfg, case):
    if peer.startswith("torch"):
        return _torch_peer(peer, cfg, case)
    return _jax_peer(peer, cfg, case)
