"""funcnet.layers.Embedding, against PyTorch."""

import math
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch
from funcnet.layers.embedding import Embedding
from funcnet.testing import check_layer


def _ids(seed, high, *shape):
    return np.random.default_rng(seed).integers(0, high, shape)


N, T, F, H = 3, 5, 4, 6


def test_embedding_matches_torch():
    vocab, dim = 11, 4
    init, apply = Embedding(vocab, dim)
    out_shape, params, state = init(jax.random.key(0), (-1, 5))
    assert out_shape == (-1, 5, dim) and state == () and params["E"].shape == (vocab, dim)
    emb = torch.nn.Embedding(vocab, dim)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor(np.asarray(params["E"])))
    for shape in [(3, 5), (7,), (2, 3, 2)]:
        ids = _ids(len(shape), vocab, *shape)
        y_torch = emb(torch.tensor(ids)).detach().numpy()
        y, _ = jax.jit(lambda p, i: apply(p, (), i))(params, jnp.asarray(ids, jnp.int32))
        assert y.shape == shape + (dim,)
        np.testing.assert_array_equal(y, y_torch)


def test_embedding_default_init_is_standard_normal():
    _, params, _ = Embedding(1000, 16).init(jax.random.key(0), (-1,))
    E = np.asarray(params["E"], np.float64)
    n = E.size
    # the sample mean/std of n N(0, 1) draws have std 1/sqrt(n) and ~1/sqrt(2n): 6 sigma
    assert abs(E.mean()) < 6 / math.sqrt(n)
    assert abs(E.std() - 1.0) < 6 / math.sqrt(2 * n)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bool_])
def test_embedding_rejects_non_integer_ids(dtype):
    init, apply = Embedding(5, 3)
    _, params, _ = init(jax.random.key(0), (-1,))
    with pytest.raises(TypeError, match=r"Embedding\(5, 3\).*integer.*" + jnp.dtype(dtype).name):
        jax.jit(lambda x: apply(params, (), x))(jnp.zeros((4,), dtype))


def test_embedding_out_of_range_ids_give_nan_rows_and_no_gradient():
    vocab, dim = 5, 3
    init, apply = Embedding(vocab, dim)
    _, params, _ = init(jax.random.key(0), (-1,))
    ids = jnp.array([1, -1, 5, 100, -6, 4, 1], jnp.int32)
    lookup = jax.jit(lambda p, i: apply(p, (), i)[0])
    y = np.asarray(lookup(params, ids))
    E = np.asarray(params["E"])
    valid = np.array([True, False, False, False, False, True, True])
    assert np.isnan(y[~valid]).all()
    np.testing.assert_array_equal(y[valid], E[[1, 4, 1]])
    # the transpose of the lookup drops out-of-range rows: only valid ids get gradient
    _, vjp = jax.vjp(lambda p: lookup(p, ids), params)
    (g,) = vjp(jnp.ones((7, dim)))
    np.testing.assert_array_equal(g["E"], np.array([0, 2, 0, 0, 1])[:, None] * np.ones((1, dim)))


def test_embedding_narrow_int_dtype_full_vocab():
    init, apply = Embedding(256, 2)
    _, params, _ = init(jax.random.key(0), (-1,))
    y, _ = apply(params, (), jnp.array([0, 255], jnp.uint8))
    np.testing.assert_array_equal(y, np.asarray(params["E"])[[0, 255]])


def test_embedding_errors_and_contract():
    for bad in [(0, 3), (5, -1), (5.0, 3), (True, 3)]:
        with pytest.raises(ValueError, match="Embedding"):
            Embedding(*bad)
    check_layer(Embedding(6, 3), (-1, 4), inputs=jnp.asarray(_ids(0, 6, 2, 4), jnp.int32))


def test_embedding_concrete_out_of_range_ids_are_an_error_like_torch():
    init, apply = Embedding(5, 3)
    _, params, _ = init(jax.random.key(0), (-1,))
    with pytest.raises(
        ValueError,
        match=r"Embedding\(5, 3\): ids must be in \[0, 5\), found "
        r"\[-1, 5, 100\].*vocab_size.*NaN",
    ):
        apply(params, (), jnp.array([1, -1, 5, 100, 4]))
    apply(params, (), np.array([0, 4]))  # in range: fine eagerly too


def test_padding_idx_row_starts_at_zero_and_gets_no_gradient_as_in_torch():
    from funcnet.layers import Embedding

    layer = Embedding(6, 3, padding_idx=-2)  # row 4
    _, params, _ = layer.init(jax.random.key(0), (-1, 5))
    assert not np.asarray(params["E"][4]).any()
    params = {"E": params["E"].at[4].set(1.5)}  # a loaded, non-zero padding row is read as is
    ids = np.array([[0, 4, 2, 4, 5]])
    out, _ = layer.apply(params, (), jnp.asarray(ids))
    grad = jax.grad(lambda p: jnp.sum(layer.apply(p, (), jnp.asarray(ids))[0] ** 2))(params)
    t = torch.nn.Embedding(6, 3, padding_idx=-2)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(np.asarray(params["E"])))
    (t(torch.tensor(ids)) ** 2).sum().backward()
    np.testing.assert_allclose(np.asarray(out), t(torch.tensor(ids)).detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad["E"]), t.weight.grad.numpy(), rtol=1e-6)
    assert not np.asarray(grad["E"][4]).any()
    with pytest.raises(ValueError, match=r"padding_idx=6 must be in \[-6, 6\)"):
        Embedding(6, 3, padding_idx=6)
