"""funcnet.layers.Dense: formula and PyTorch's default init."""
import math
import jax
import jax.numpy as jnp
import numpy as np
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
