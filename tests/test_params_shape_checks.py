"""Params against the architecture: a layer given params of another width (another
model's, another configuration's) refuses them at trace time, naming the layer as it
was written, the param, both shapes and the likely cause, instead of returning an
output of the params' width.
"""

import jax
import jax.numpy as jnp
import pytest

import funcnet
from funcnet.errors import MismatchError
from funcnet import Scan
from funcnet.layers import BatchNorm, Conv, ConvTranspose, Dense, Embedding, LayerNorm, Relu, TiedEmbedding

KEY = jax.random.key(0)
CAUSE = (
    r"These params were made for another model, or another configuration.*re-run "
    r"init.*checkpoint"
)


# Shapes only (jax.eval_shape): the checks run at trace time, and nothing is compiled.
def _params(layer, shape):
    return jax.eval_shape(lambda k: layer.init(k, shape)[1], KEY)


def _apply(layer, params, x, state=(), **kwargs):
    return jax.eval_shape(lambda p, s, x: layer.apply(p, s, x, **kwargs)[0], params, state, x)


def _x(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


# --------------------------------------------------------------------------- #
# Dense
# --------------------------------------------------------------------------- #


def test_dense_refuses_a_kernel_of_another_width_eagerly_and_under_jit():
    # a Dense(65)'s params given to Dense(50) gave 65 features, without a word
    wide = {"W": jnp.zeros((32, 65)), "b": jnp.zeros(65)}
    x = jnp.ones((2, 32))
    msg = (
        r"Dense\(50\): params\['W'\] has shape \(32, 65\), but Dense\(50\) was built for "
        r"\(32, 50\): 65 on axis 1 where Dense\(50\) has 50\. " + CAUSE
    )
    with pytest.raises(MismatchError, match=msg):
        Dense(50).apply(wide, (), x)
    with pytest.raises(MismatchError, match=msg):
        jax.jit(lambda p, x: Dense(50).apply(p, (), x)[0])(wide, x)


def test_dense_refuses_a_bias_of_another_width_and_a_kernel_of_another_rank():
    params = _params(Dense(50), (-1, 32))
    with pytest.raises(
        MismatchError,
        match=r"Dense\(50\): params\['b'\] has shape \(65,\), "
        r"but Dense\(50\) was built for \(50,\)",
    ):
        _apply(Dense(50), {**params, "b": _x(65)}, _x(2, 32))
    with pytest.raises(
        MismatchError,
        match=r"params\['W'\] has shape \(32, 50, 1\).*rank 3 "
        r"where it needs rank 2",
    ):
        _apply(Dense(50), {**params, "W": _x(32, 50, 1)}, _x(2, 32))


def test_dense_kernel_rows_against_the_input_name_both_shapes():
    # in_dim comes from the input: params of the right width but for other inputs
    params = _params(Dense(50), (-1, 32))
    with pytest.raises(
        ValueError,
        match=r"Dense\(50\): input has 16 features on axis -1 but "
        r"the params were built for 32",
    ):
        _apply(Dense(50), params, _x(2, 16))


def test_inside_a_network_the_error_names_the_layers_place_and_both_trees():
    net = funcnet.serial(Dense(32), Relu, Dense(50))
    params = _params(net, (-1, 8))
    other = _params(funcnet.serial(Dense(32), Relu, Dense(65)), (-1, 8))
    with pytest.raises(
        MismatchError,
        match=(
            r"serial: the params given to layer 2 \(Dense\(50\)\) do not fit it: it expects "
            r"\{'W': float32\[32, 50\], 'b': float32\[50\]\}, got \{'W': float32\[32, 65\], "
            r"'b': float32\[65\]\}\. " + CAUSE
        ),
    ):
        _apply(net, params[:2] + other[2:], _x(1, 8))


def test_right_params_still_run_everywhere():
    """No false alarm: plain, bias-free, stacked (Scan) and mixed-precision params."""
    for layer in (Dense(4), Dense(4, use_bias=False), Scan(Dense(4), 2)):
        assert _apply(layer, _params(layer, (-1, 4)), _x(2, 4)).shape == (2, 4)
    half = {"W": _x(4, 3, dtype=jnp.bfloat16), "b": _x(3, dtype=jnp.bfloat16)}
    assert _apply(Dense(3), half, _x(2, 4, dtype=jnp.bfloat16)).shape == (2, 3)


# --------------------------------------------------------------------------- #
# Embedding, TiedEmbedding
# --------------------------------------------------------------------------- #


def test_embedding_refuses_a_table_of_another_vocabulary_or_dim():
    ids = _x(1, 2, dtype=jnp.int32)
    with pytest.raises(
        MismatchError,
        match=r"Embedding\(50, 16\): params\['E'\] has shape "
        r"\(65, 16\), but Embedding\(50, 16\) was built "
        r"for \(50, 16\): 65 on axis 0.*" + CAUSE,
    ):
        _apply(Embedding(50, 16), {"E": _x(65, 16)}, ids)
    with pytest.raises(MismatchError, match=r"\(50, 8\).*built for \(50, 16\): 8 on axis 1"):
        _apply(Embedding(50, 16), {"E": _x(50, 8)}, ids)
    assert _apply(Embedding(50, 16), {"E": _x(50, 16)}, ids).shape == (1, 2, 16)


def test_tied_embedding_refuses_a_table_of_another_vocabulary_naming_itself():
    # Before, the 65-row table gave 65 logits from TiedEmbedding(50, 16).
    params = _params(TiedEmbedding(65, 16, body=Dense(16)), (-1, 3))
    ids = _x(1, 3, dtype=jnp.int32)
    with pytest.raises(
        MismatchError,
        match=r"TiedEmbedding\(50, 16\): params\['E'\] has "
        r"shape \(65, 16\)",
    ):
        _apply(TiedEmbedding(50, 16, body=Dense(16)), params, ids)
    good = _params(TiedEmbedding(50, 16), (-1, 3))
    assert _apply(TiedEmbedding(50, 16), good, ids).shape == (1, 3, 50)


# --------------------------------------------------------------------------- #
# Conv, ConvTranspose
# --------------------------------------------------------------------------- #


def test_conv_refuses_a_kernel_of_other_out_channels_or_filter():
    x = _x(1, 6, 6, 4)
    with pytest.raises(
        MismatchError,
        match=r"Conv\(8, \(3, 3\)\): params\['W'\] has shape "
        r"\(3, 3, 4, 6\), but Conv\(8, \(3, 3\)\) was built "
        r"for \(3, 3, 4, 8\): 6 on axis 3",
    ):
        _apply(Conv(8, (3, 3)), _params(Conv(6, (3, 3)), (-1, 6, 6, 4)), x)
    with pytest.raises(
        MismatchError,
        match=r"\(5, 5, 4, 8\).*built for \(3, 3, 4, 8\): 5 on "
        r"axis 0",
    ):
        _apply(Conv(8, (3, 3)), _params(Conv(8, (5, 5)), (-1, 6, 6, 4)), x)


def test_conv_checks_the_kernel_in_its_own_layout_and_groups():
    # torch's OIHW: the out channels lead
    torch_layout = dict(dimension_numbers=("NCHW", "OIHW", "NCHW"))
    params = _params(Conv(6, (3, 3), **torch_layout), (-1, 4, 6, 6))
    assert params["W"].shape == (6, 4, 3, 3)
    with pytest.raises(MismatchError, match=r"built for \(8, 4, 3, 3\): 6 on axis 0"):
        _apply(Conv(8, (3, 3), **torch_layout), params, _x(1, 4, 6, 6))
    grouped = Conv(8, (3,), feature_group_count=2)
    p = _params(grouped, (-1, 5, 4))
    assert _apply(grouped, p, _x(1, 5, 4)).shape == (1, 3, 8)
    with pytest.raises(
        MismatchError,
        match=r"params\['b'\] has shape \(4,\), but .* built for "
        r"\(8,\)",
    ):
        _apply(grouped, {**p, "b": _x(4)}, _x(1, 5, 4))


def test_conv_transpose_refuses_a_kernel_of_other_out_channels():
    layer = ConvTranspose(4, (3,), feature_group_count=2)
    params = _params(layer, (-1, 5, 6))  # W: (3, 6, 4 / 2)
    assert _apply(layer, params, _x(1, 5, 6)).shape == (1, 7, 4)
    other = _params(ConvTranspose(8, (3,), feature_group_count=2), (-1, 5, 6))
    with pytest.raises(
        MismatchError,
        match=r"ConvTranspose\(4, \(3,\)\): params\['W'\] has "
        r"shape \(3, 6, 4\), but .* built for \(3, 6, 2\)",
    ):
        _apply(layer, other, _x(1, 5, 6))


# --------------------------------------------------------------------------- #
# BatchNorm, LayerNorm
# --------------------------------------------------------------------------- #


def test_batchnorm_refuses_a_scale_or_bias_not_one_per_feature():
    x = _x(4, 3)
    for track in (True, False):
        layer = BatchNorm(track_running_stats=track)
        _, params, state = layer.init(KEY, (-1, 3))
        # a (1,) scale broadcast over every feature before, silently
        with pytest.raises(
            MismatchError,
            match=r"BatchNorm: params\['scale'\] has shape "
            r"\(1,\), but BatchNorm was built for \(3,\)",
        ):
            _apply(layer, {**params, "scale": _x(1)}, x, state, train=True)
        with pytest.raises(MismatchError, match=r"params\['bias'\] has shape \(5,\)"):
            _apply(layer, {**params, "bias": _x(5)}, x, state)
        assert _apply(layer, params, x, state, train=True).shape == (4, 3)


def test_layernorm_scale_of_another_width_is_still_refused():
    params = _params(LayerNorm(), (-1, 5))
    with pytest.raises(ValueError, match=r"LayerNorm.*params\['scale'\] was built for \(6,\)"):
        _apply(LayerNorm(), {**params, "scale": _x(6)}, _x(2, 5))
