"""Workload 4: ``funcnet.outputs.softmax_output`` (custom_vjp) vs autodiff through log_softmax + NLL.

Both peers train the same MLP from the same weights with the same jitted Adam step; only
the head differs:

* ``softmax_output``: the network ends in ``softmax_output(logits, labels,
  normalization="batch")``, differentiated with ``funcnet.outputs.value_and_grad``; the
  VJP writes ``(softmax - onehot) / batch`` directly. The reported loss is computed from
  the returned probabilities (under ``stop_gradient``).
* ``log_softmax-autodiff``: ``mean(-log_softmax(logits)[label])`` differentiated by
  ``jax.value_and_grad``.

The gradients are the same function, so the first-step losses must agree.

Memory: ``residual_bytes`` is the size of what the forward pass keeps for the backward
pass (the leaves of ``jax.vjp``'s closure, params -> head output, on one batch): the
activation memory a step holds at its peak. ``temp_bytes`` is XLA's
``memory_analysis().temp_size_in_bytes`` for the compiled step; on XLA:CPU it does not
count the buffers the runtime allocates per execution, so it is reported but not
meaningful there.
"""

from __future__ import annotations

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

        residual_fn = head

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
        residual_fn = loss
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
    _, vjp_fn = jax.vjp(lambda p: residual_fn(p, *batches[0]), params)
    extra = {
        "residual_bytes": int(sum(leaf.nbytes for leaf in jax.tree.leaves(vjp_fn))),
        "temp_bytes": int(mem.temp_size_in_bytes),
    }

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
