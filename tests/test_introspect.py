"""funcnet.introspect: summary tables and parameter counts."""

import jax.numpy as jnp
import funcnet
from funcnet.layers import Dense


def _counter_layer():
    """A stateful layer that counts calls in train mode and adds its bias."""

    def init(rng, input_shape):
        return input_shape, {"b": jnp.zeros(input_shape[-1])}, {"calls": jnp.zeros((), jnp.int32)}

    def apply(params, state, x, *, rng=None, train=False):
        calls = state["calls"] + (1 if train else 0)
        return x + params["b"], {"calls": calls}

    return funcnet.named("Counter", init, apply)


def test_summary_table_counts_and_nesting():
    net = funcnet.serial(Dense(400), funcnet.serial(Dense(100), _counter_layer()), Dense(10))
    s = funcnet.summary(net, (-1, 784), print_fn=None)
    assert s.total_params == 784 * 400 + 400 + 400 * 100 + 100 + 100 + 100 * 10 + 10
    assert s.total_state == 1
    assert s.output_shape == (-1, 10)
    names = [(r.depth, r.name) for r in s.rows]
    assert names == [
        (0, "serial"),
        (1, "Dense(400)"),
        (1, "serial"),
        (2, "Dense(100)"),
        (2, "Counter"),
        (1, "Dense(10)"),
    ]
    assert "Dense(400)" in s.table and "314,000" in s.table and "(?, 10)" in s.table
    assert f"Total params: {s.total_params:,}" in s.table
    printed = []
    funcnet.summary(net, (-1, 784), print_fn=printed.append)
    assert printed == [s.table]


def test_summary_counts_the_tinynn_mlp_params():
    from funcnet.layers import Relu

    net = funcnet.serial(Dense(400), Relu, Dense(100), Relu, Dense(10))
    assert funcnet.summary(net, (-1, 784), print_fn=None).total_params == 784 * 400 + 400 + 400 * 100 + 100 + 1010
