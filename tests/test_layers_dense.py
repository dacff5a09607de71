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
    np.testing.assert_allclose(np.var(params["W"]), bound ** 2 / 3, rtol=0.05)
    x = jax.random.normal(KEY, (3, 7, 50))
    y, _ = Dense(200).apply(params, (), x)
    np.testing.assert_allclose(y, np.asarray(x) @ np.asarray(params["W"]) + np.asarray(params["b"]),
                               rtol=1e-5, atol=1e-5)


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
