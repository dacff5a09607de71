"""funcnet.layers.Dense: formula and PyTorch's default init."""

import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from funcnet.layers import Dense

KEY = jax.random.key(0)


def test_dense_matches_formula_and_torch_default_init():
    out_shape, params, _ = Dense(200).init(KEY, (-1, 50))
    bound = 1 / math.sqrt(50)
    for p in (params["W"], params["b"]):
        assert float(jnp.max(jnp.abs(p))) <= bound
        assert float(jnp.max(jnp.abs(p))) > 0.9 * bound  # really uniform over the range
    # U(-a, a) has variance a^2 / 3.
    np.testing.assert_allclose(np.var(params["W"]), bound**2 / 3, rtol=0.05)
    x = jax.random.normal(KEY, (3, 7, 50))
    y, _ = Dense(200).apply(params, (), x)
    np.testing.assert_allclose(
        y, np.asarray(x) @ np.asarray(params["W"]) + np.asarray(params["b"]), rtol=1e-5, atol=1e-5
    )


def test_params_with_a_missing_or_extra_bias_are_refused():
    # Params of a Dense built with the other use_bias would run silently without (or
    # ignoring) the bias.
    from funcnet.errors import MismatchError

    with_bias, without = Dense(3), Dense(3, use_bias=False)
    _, p, _ = with_bias.init(jax.random.key(0), (-1, 2))
    _, q, _ = without.init(jax.random.key(0), (-1, 2))
    x = jnp.ones((1, 2))
    with pytest.raises(MismatchError, match=r"expects \{'W', 'b'\}, got \{'W'\}"):
        with_bias.apply(q, (), x)
    with pytest.raises(MismatchError, match=r"expects \{'W'\}"):
        without.apply(p, (), x)


def test_in_dim_catches_a_model_whose_earlier_layers_changed_the_shape():
    """Flax pads SAME, funcnet's Conv VALID: with in_dim the port fails at init instead of
    training another architecture (Flax's MNIST CNN: 3136 features, 1600 with VALID)."""
    import funcnet
    from funcnet.layers import AvgPool, Conv, Flatten

    def net(padding):
        return funcnet.serial(
            Conv(32, (3, 3), padding=padding),
            AvgPool((2, 2), (2, 2)),
            Conv(64, (3, 3), padding=padding),
            AvgPool((2, 2), (2, 2)),
            Flatten,
            Dense(256, in_dim=3136),
        )

    out_shape, params, _ = net("SAME").init(jax.random.key(0), (-1, 28, 28, 1))
    assert out_shape == (-1, 256) and params[-1]["W"].shape == (3136, 256)
    with pytest.raises(
        ValueError,
        match=r"Dense\(256\): in_dim=3136 but the input has 1600 "
        r"features .*pads VALID",
    ):
        net("VALID").init(jax.random.key(0), (-1, 28, 28, 1))
    with pytest.raises(Exception, match="in_dim"):
        Dense(4, in_dim=0)
