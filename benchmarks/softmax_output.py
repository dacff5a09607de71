"""Workload 4: ``funcnet.outputs.softmax_output`` (custom_vjp) vs autodiff through log_softmax + NLL.

Both peers train the same MLP from the same weights with the same jitted Adam step; only
the head differs:

* ``softmax_output``: the network ends in ``softmax_output(logits, labels,
  normalization="batch")``, differentiated with ``funcnet.outputs.value_and_grad``; the
  VJP writes ``(softmax - onehot) / batch`` directly. The reported loss is computed from
  the returned probabilities (under ``stop_gradient``).
* ``log_softmax-autodiff``: ``mean(-log_softmax(logits)[label])`` differentiated by
  ``jax.value_and_grad``.

The gradients are the same function, so the first-step losses must agree. Memory is the
compiled step's ``memory_analysis()``: XLA's temporary buffers and, where the backend
reports it, the peak.
"""

from __future__ import annotations

import time

from benchmarks import common


def run(peer, cfg, case):
    import jax
    import jax.numpy as jnp
    import optax

    from benchmarks.mlp import _hand

    batch = case["batch"]
    sizes = case["sizes"]
    params, forward = _hand(common.mlp_weights(sizes, seed=0))
    tx = optax.adam(1e-3)

    if peer == "softmax_output":
        from funcnet import outputs

        def head(params, x, y):
            return outputs.softmax_output(forward(params, x), y, normalization="batch")

        vg = outputs.value_and_grad(head)

        def loss_and_grads(params, x, y):
            probs, grads = vg(params, x, y)
            p = jnp.take_along_axis(jax.lax.stop_gradient(probs), y[:, None], axis=1)
            return -jnp.mean(jnp.log(p)), grads
    elif peer == "log_softmax-autodiff":
        def loss(params, x, y):
            logp = jax.nn.log_softmax(forward(params, x))
            return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

        loss_and_grads = jax.value_and_grad(loss)
    else:
        raise ValueError(peer)

    @jax.jit
    def step(carry, x, y):
        params, opt_state = carry
        loss, grads = loss_and_grads(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    xs, ys = common.mnist_like_batches(batch, 4, seed=1, classes=sizes[-1])
    batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in zip(xs, ys)]
    carry = (params, tx.init(params))
    compiled = step.lower(carry, *batches[0]).compile()
    mem = compiled.memory_analysis()
    extra = {"temp_bytes": int(mem.temp_size_in_bytes)}
    peak = int(getattr(mem, "peak_memory_in_bytes", 0) or 0)
    extra["peak_bytes"] = peak if peak else "n/a"

    carry, loss = compiled(carry, *batches[0])
    extra["loss_first"] = float(loss)
    for i in range(1, 3):
        carry, loss = compiled(carry, *batches[i % len(batches)])
    jax.block_until_ready(carry)
    n = case["steps"]

    def block():
        nonlocal carry, loss
        for i in range(n):
            carry, loss = compiled(carry, *batches[i % len(batches)])
        jax.block_until_ready((carry, loss))

    values = [t / n for t in common.measure(block, case["reps"])]
    return {"values": values, "extra": extra}
