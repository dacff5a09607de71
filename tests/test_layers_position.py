"""funcnet.layers.position: sinusoidal tables, RoPE and learned positions, against formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.layers import LearnedPositions, SinusoidalPositions, rope, sinusoidal_table
from funcnet.testing import check_layer

KEY = jax.random.key(0)


def test_sinusoidal_table_is_vaswanis():
    table = np.asarray(sinusoidal_table(7, 6, base=100.0))
    for p in range(7):
        for i in range(3):
            angle = p / 100.0 ** (2 * i / 6)
            np.testing.assert_allclose(table[p, 2 * i], np.sin(angle), atol=1e-6)
            np.testing.assert_allclose(table[p, 2 * i + 1], np.cos(angle), atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_table(4, 5)


def _rope_reference(x, pos, base):
    """Rotate-half RoPE in complex numbers: pair (x_i, x_{i+D/2}) as x_i + 1j x_{i+D/2},
    multiplied by exp(1j * p * base^(-2i/D)). NumPy float64."""
    D = x.shape[-1]
    half = D // 2
    z = x[..., :half] + 1j * x[..., half:]
    theta = base ** (-2.0 * np.arange(half) / D)
    z = z * np.exp(1j * pos[:, None, None] * theta)  # (T, H, half)
    return np.concatenate([z.real, z.imag], axis=-1)


def test_rope_against_the_complex_form_and_relative_positions():
    x = np.random.default_rng(0).standard_normal((2, 5, 3, 8))
    got = np.asarray(rope(jnp.asarray(x, jnp.float32), base=50.0))
    for b in range(2):
        np.testing.assert_allclose(got[b], _rope_reference(x[b], np.arange(5), 50.0), atol=1e-5)
    # <rope(q, m), rope(k, n)> depends on m - n only
    q, k = (np.random.default_rng(s).standard_normal((1, 1, 1, 8)) for s in (1, 2))
    dot = lambda m, n: float(
        jnp.sum(rope(jnp.asarray(q, jnp.float32), jnp.array([m])) * rope(jnp.asarray(k, jnp.float32), jnp.array([n])))
    )
    np.testing.assert_allclose(dot(3, 1), dot(7, 5), rtol=1e-5)
    np.testing.assert_allclose(dot(0, 0), float(np.sum(q * k)), rtol=1e-5)
    with pytest.raises(ValueError, match="even"):
        rope(jnp.ones((1, 2, 1, 5)))


def test_rope_interleaved_convention_is_a_permutation():
    """Meta's Llama rotates (x_2i, x_2i+1); rotate-half rotates (x_i, x_i+D/2): the same map
    after permuting features by perm = [0, 2, 4, ..., 1, 3, 5, ...]."""
    D = 8
    x = np.random.default_rng(3).standard_normal((1, 4, 1, D))
    pos = np.arange(4)
    theta = 10000.0 ** (-2.0 * np.arange(D // 2) / D)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * pos[:, None, None] * theta)
    interleaved = np.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    perm = np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])
    got = np.asarray(rope(jnp.asarray(x[..., perm], jnp.float32)))
    np.testing.assert_allclose(got, interleaved[..., perm], atol=1e-5)


@pytest.mark.parametrize(
    "make",
    [lambda d: LearnedPositions(6, E_init=None, decode=d), lambda d: SinusoidalPositions(6, decode=d)],
    ids=["learned", "sinusoidal"],
)
def test_positions_add_the_table_and_decode_one_token_at_a_time(make):
    full, dec = make(False), make(True)
    _, params, state = check_layer(full, (-1, 4, 8), grad_check=False, train_modes=(False,))
    assert state == ()
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 8)), jnp.float32)
    want, _ = full.apply(params, (), x)
    table = params["E"] if params else sinusoidal_table(6, 8)
    np.testing.assert_allclose(want, x + table[:5], rtol=1e-6)
    _, _, s = dec.init(KEY, (2, 1, 8))
    got = []
    for t in range(5):
        y, s = dec.apply(params, s, x[:, t : t + 1])
        got.append(y)
    np.testing.assert_allclose(jnp.concatenate(got, 1), want, rtol=1e-6)
    assert int(s["index"]) == 5
    with pytest.raises(ValueError, match="decoding past the table"):
        dec.apply(params, s, x[:, :2])
    with pytest.raises(ValueError, match="length 7 but the table has 6 positions"):
        full.apply(params, (), jnp.ones((1, 7, 8)))


def test_learned_positions_params_are_torch_embedding_layout():
    _, params, _ = LearnedPositions(10).init(KEY, (-1, 4, 3))
    assert params["E"].shape == (10, 3)
    assert np.std(np.asarray(LearnedPositions(500, 64).init(KEY, (-1, 4, 64))[1]["E"])) == pytest.approx(
        1.0, rel=0.05
    )  # torch nn.Embedding's N(0, 1)
