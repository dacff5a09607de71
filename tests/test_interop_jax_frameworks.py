"""funcnet.interop's Flax, Haiku and Equinox loaders: the trees' layouts by hand (no
framework needed), their errors, and — where the framework is installed (the bench
extra) — a model of each loaded into funcnet's port giving the original's outputs."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import funcnet
from funcnet.errors import StateDictMismatchError
from funcnet.interop import load_equinox_params, load_flax_params, load_haiku_params
from funcnet.layers import BatchNorm, Conv, Dense, Flatten, GlobalAvgPool, LayerNorm


def _rand(tree, seed=0):
    """Every array of ``tree`` random (positive, so variances stay valid)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rs = np.random.RandomState(seed)
    return jax.tree_util.tree_unflatten(treedef, [rs.uniform(0.5, 1.5, np.shape(x)).astype(np.float32) for x in leaves])


def _net(ln_eps=1e-5):
    return funcnet.serial(Conv(4, (3, 3), padding="SAME"), BatchNorm(), Flatten, Dense(3), LayerNorm(epsilon=ln_eps))


def test_linen_layout_loads_in_the_given_order_with_batch_stats():
    net = _net()
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    linen = _rand(
        {
            "params": {
                "Conv_0": {"kernel": np.zeros((3, 3, 1, 4)), "bias": np.zeros(4)},
                "BatchNorm_0": {"scale": np.zeros(4), "bias": np.zeros(4)},
                "Dense_0": {"kernel": np.zeros((100, 3)), "bias": np.zeros(3)},
                "LayerNorm_0": {"scale": np.zeros(3), "bias": np.zeros(3)},
            },
            "batch_stats": {"BatchNorm_0": {"mean": np.zeros(4), "var": np.zeros(4)}},
        }
    )
    with pytest.raises(TypeError, match="order"):
        load_flax_params(params, state, linen)
    p, s = load_flax_params(params, state, linen, order=["Conv_0", "BatchNorm_0", "Dense_0", "LayerNorm_0"])
    np.testing.assert_array_equal(p[0]["W"], linen["params"]["Conv_0"]["kernel"])  # same layout
    np.testing.assert_array_equal(p[3]["W"], linen["params"]["Dense_0"]["kernel"])
    np.testing.assert_array_equal(p[1]["scale"], linen["params"]["BatchNorm_0"]["scale"])
    np.testing.assert_array_equal(s[1]["var"], linen["batch_stats"]["BatchNorm_0"]["var"])
    np.testing.assert_array_equal(p[4]["bias"], linen["params"]["LayerNorm_0"]["bias"])


def test_haiku_needs_its_layer_order_and_squeezes_batchnorm_arrays():
    net = _net()
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    # Haiku's dict is sorted by module name: batch_norm first, not the layer order
    hk_params = _rand(
        {
            "batch_norm": {"offset": np.zeros((1, 1, 1, 4)), "scale": np.zeros((1, 1, 1, 4))},
            "conv2_d": {"b": np.zeros(4), "w": np.zeros((3, 3, 1, 4))},
            "layer_norm": {"offset": np.zeros(3), "scale": np.zeros(3)},
            "linear": {"b": np.zeros(3), "w": np.zeros((100, 3))},
        }
    )
    hk_state = _rand(
        {
            "batch_norm/~/mean_ema": {
                "average": np.zeros((1, 1, 1, 4)),
                "counter": np.zeros(()),
                "hidden": np.zeros((1, 1, 1, 4)),
            },
            "batch_norm/~/var_ema": {
                "average": np.zeros((1, 1, 1, 4)),
                "counter": np.zeros(()),
                "hidden": np.zeros((1, 1, 1, 4)),
            },
        },
        seed=1,
    )
    with pytest.raises(TypeError, match="order"):
        load_haiku_params(params, state, hk_params, hk_state)
    with pytest.raises(StateDictMismatchError, match="load_haiku_params.*order="):
        load_haiku_params(params, state, hk_params, hk_state, order=["batch_norm", "conv2_d", "linear", "layer_norm"])
    p, s = load_haiku_params(
        params, state, hk_params, hk_state, order=["conv2_d", "batch_norm", "linear", "layer_norm"]
    )
    np.testing.assert_array_equal(p[1]["bias"], hk_params["batch_norm"]["offset"].reshape(4))
    np.testing.assert_array_equal(s[1]["mean"], hk_state["batch_norm/~/mean_ema"]["average"].reshape(4))
    np.testing.assert_array_equal(p[3]["W"], hk_params["linear"]["w"])


def test_order_must_name_every_module_once():
    _, params, state = Dense(3).init(jax.random.key(0), (-1, 2))
    tree = {"params": {"Dense_0": {"kernel": np.ones((2, 3)), "bias": np.zeros(3)}}}
    with pytest.raises(StateDictMismatchError, match=r"unknown: \['Dense_1'\].*left out: \['Dense_0'\]"):
        load_flax_params(params, state, tree, order=["Dense_1"])


def test_a_misfit_names_the_flax_module_and_funcnet_path():
    _, params, state = Dense(3).init(jax.random.key(0), (-1, 2))
    tree = {"params": {"Dense_0": {"kernel": np.ones((5, 3)), "bias": np.zeros(3)}}}
    with pytest.raises(StateDictMismatchError, match=r"load_flax_params.*'Dense_0'.*'W' has shape \(2, 3\)"):
        load_flax_params(params, state, tree, order=["Dense_0"])


@dataclasses.dataclass
class _Linear:  # Equinox's layout: torch's (out, in)
    weight: np.ndarray
    bias: np.ndarray


@dataclasses.dataclass
class _Conv:
    weight: np.ndarray
    bias: np.ndarray  # Equinox's (out, 1, 1)


class StateIndex:  # what Equinox's BatchNorm holds in place of its running statistics
    pass


@dataclasses.dataclass
class _BatchNorm:
    weight: np.ndarray
    bias: np.ndarray
    ema_state_index: StateIndex
    ema_first_time_index: StateIndex


@dataclasses.dataclass
class _Seq:
    layers: tuple


class _State:
    def __init__(self, values):
        self.values = values

    def get(self, index):
        return self.values[id(index)]


def test_equinox_layout_loads_torch_shaped_weights_and_running_stats():
    net = funcnet.serial(Conv(4, (3, 3), padding="SAME"), BatchNorm(), GlobalAvgPool, Dense(3))
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    w = _rand(
        {
            "c": np.zeros((4, 1, 3, 3)),
            "cb": np.zeros((4, 1, 1)),
            "s": np.zeros(4),
            "b": np.zeros(4),
            "m": np.zeros(4),
            "v": np.zeros(4),
            "l": np.zeros((3, 4)),
            "lb": np.zeros(3),
        }
    )
    ema, first = StateIndex(), StateIndex()
    model = _Seq((_Conv(w["c"], w["cb"]), _BatchNorm(w["s"], w["b"], ema, first), _Linear(w["l"], w["lb"])))
    eqx_state = _State({id(ema): (w["m"], w["v"]), id(first): np.array(True)})
    p, s = load_equinox_params(params, state, model, eqx_state)
    np.testing.assert_array_equal(p[0]["W"], w["c"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(p[0]["b"], w["cb"].reshape(4))
    np.testing.assert_array_equal(s[1]["mean"], w["m"])
    np.testing.assert_array_equal(p[3]["W"], w["l"].T)
    with pytest.raises(StateDictMismatchError, match=r"missing key.*layers\.1\.running_mean"):
        load_equinox_params(params, state, model)  # BatchNorm without its eqx.nn.State


# -- the frameworks themselves, where installed (pip install -e ".[bench]") ---------------------


def test_flax_linen_model_loads_to_the_same_outputs():
    nn = pytest.importorskip("flax.linen")

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.BatchNorm(use_running_average=True)(nn.Conv(4, (3, 3))(x))
            return nn.LayerNorm()(nn.Dense(3)(x.reshape(x.shape[0], -1)))

    x = np.random.RandomState(2).normal(size=(2, 5, 5, 1)).astype(np.float32)
    variables = _rand(CNN().init(jax.random.key(0), x))
    net = _net(ln_eps=1e-6)  # Flax's LayerNorm epsilon
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    params, state = load_flax_params(
        params, state, variables, order=["Conv_0", "BatchNorm_0", "Dense_0", "LayerNorm_0"]
    )
    ours, _ = net.apply(params, state, x)
    np.testing.assert_allclose(ours, CNN().apply(variables, x), rtol=1e-5, atol=1e-5)


def test_flax_nnx_module_loads_in_the_given_order():
    nnx = pytest.importorskip("flax.nnx")

    class CNN(nnx.Module):
        def __init__(self, rngs):  # attribute names that do not sort in layer order
            self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
            self.bn = nnx.BatchNorm(4, use_running_average=True, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)
            self.dense = nnx.Linear(100, 3, rngs=rngs)
            self.ln = nnx.LayerNorm(3, rngs=rngs)

        def __call__(self, x):
            x = self.bn(self.conv(x))
            return self.ln(self.dense(x.reshape(x.shape[0], -1)))

    model = CNN(nnx.Rngs(0))
    graphdef, st = nnx.split(model)
    model = nnx.merge(graphdef, _rand(st))
    x = np.random.RandomState(2).normal(size=(2, 5, 5, 1)).astype(np.float32)
    net = _net(ln_eps=1e-6)
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    with pytest.raises(TypeError, match="order"):
        load_flax_params(params, state, model)  # no Flax tree keeps the layer order
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # flax 0.12 deprecates State's methods
        params, state = load_flax_params(params, state, model, order=["conv", "bn", "dense", "ln"])
    ours, _ = net.apply(params, state, x)
    # NNX's LayerNorm takes the variance as E[x^2] - E[x]^2 (use_fast_variance), which
    # rounds differently; a misloaded weight would be off by O(1)
    np.testing.assert_allclose(ours, model(x), rtol=1e-4, atol=1e-4)


def test_haiku_model_loads_to_the_same_outputs():
    hk = pytest.importorskip("haiku")

    def forward(x, is_training):
        x = hk.BatchNorm(True, True, 0.9)(hk.Conv2D(4, 3)(x), is_training=is_training)
        return hk.LayerNorm(-1, True, True)(hk.Linear(3)(hk.Flatten()(x)))

    f = hk.without_apply_rng(hk.transform_with_state(forward))
    x = np.random.RandomState(2).normal(size=(2, 5, 5, 1)).astype(np.float32)
    hk_params, hk_state = _rand(f.init(jax.random.key(0), x, True))  # creates the moving averages
    net = _net()
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    params, state = load_haiku_params(
        params, state, hk_params, hk_state, order=["conv2_d", "batch_norm", "linear", "layer_norm"]
    )
    ours, _ = net.apply(params, state, x)
    np.testing.assert_allclose(ours, f.apply(hk_params, hk_state, x, False)[0], rtol=1e-5, atol=1e-5)


def test_equinox_model_loads_to_the_same_outputs():
    eqx = pytest.importorskip("equinox")

    class CNN(eqx.Module):
        conv: eqx.nn.Conv2d
        bn: eqx.nn.BatchNorm
        linear: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.conv = eqx.nn.Conv2d(1, 4, 3, padding=1, key=k1)
            self.bn = eqx.nn.BatchNorm(4, "batch", mode="ema")
            self.linear = eqx.nn.Linear(4, 3, key=k2)

        def __call__(self, x, state):  # one example, (c, h, w)
            x, state = self.bn(self.conv(x), state)
            return self.linear(x.mean(axis=(1, 2))), state

    model, eqx_state = eqx.nn.make_with_state(CNN)(jax.random.key(0))
    params_eqx, static = eqx.partition(model, eqx.is_array)
    model = eqx.combine(_rand(params_eqx), static)
    mean, var = eqx_state.get(model.bn.ema_state_index)
    eqx_state = eqx_state.set(model.bn.ema_state_index, (mean + 0.3, var * 2.0))
    model = eqx.nn.inference_mode(model)
    x = np.random.RandomState(2).normal(size=(2, 1, 5, 5)).astype(np.float32)
    theirs = jax.vmap(model, in_axes=(0, None), out_axes=(0, None), axis_name="batch")(x, eqx_state)[0]
    net = funcnet.serial(Conv(4, (3, 3), padding="SAME"), BatchNorm(), GlobalAvgPool, Dense(3))
    _, params, state = net.init(jax.random.key(0), (-1, 5, 5, 1))
    params, state = load_equinox_params(params, state, model, eqx_state)
    ours, _ = net.apply(params, state, jnp.transpose(x, (0, 2, 3, 1)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
