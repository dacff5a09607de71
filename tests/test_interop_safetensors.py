"""safetensors files: funcnet's params and state round-trip bit for bit under funcnet's path
names (a CNN with BatchNorm, the GPT, every dtype), misfits are listed in one error, and a
PyTorch model's file (Hugging Face's kind) loads through load_torch_state_dict."""

import ast
import inspect
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import torch

pytest.importorskip(
    "safetensors", minversion="0.5", reason='safetensors is not installed (pip install "funcnet[safetensors]")'
)
from safetensors import safe_open  # noqa: E402

import funcnet  # noqa: E402
from funcnet import _safetensors  # noqa: E402
from funcnet import layers as L  # noqa: E402
from funcnet.errors import ArgumentError, CheckpointMismatchError  # noqa: E402
from funcnet.interop import (
    load_safetensors,
    load_torch_state_dict,  # noqa: E402
    read_safetensors,
    save_safetensors,
)
from funcnet.models import GPT  # noqa: E402

KEY = jax.random.key(0)


def _same_bits(a, b):
    """Equal trees of arrays: structure, dtypes, shapes and every byte (NaN payloads too)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def _cnn():
    return funcnet.serial(L.Conv(4, (3, 3)), L.BatchNorm(), L.Relu, L.GlobalAvgPool, L.Dense(3))


def _trees(net, input_shape, seed=0):
    """``net``'s ``(params, state)`` with random values: the structure, shapes and dtypes of
    its init, traced (jax.eval_shape), not run, which keeps these tests fast."""
    shapes = jax.eval_shape(lambda k: net.init(k, input_shape)[1:], KEY)
    rng = np.random.default_rng(seed)

    def filled(s):
        if jnp.issubdtype(s.dtype, jnp.floating):
            return jnp.asarray(rng.normal(size=s.shape), s.dtype)
        return jnp.asarray(rng.integers(0, 100, s.shape), s.dtype)

    return jax.tree.map(filled, shapes)


def _zeros(tree):
    """Trees to load into, from NumPy (jnp.zeros_like would compile an op per shape)."""
    return jax.tree.map(lambda x: jnp.asarray(np.zeros(x.shape, x.dtype)), tree)


def test_cnn_params_and_batchnorm_state_round_trip_bit_for_bit(tmp_path):
    params, state = _trees(_cnn(), (-1, 6, 6, 2))
    path = tmp_path / "cnn.safetensors"
    save_safetensors(path, params, state)
    assert set(read_safetensors(path)) == {
        "params/0/W",
        "params/0/b",
        "params/1/scale",
        "params/1/bias",
        "params/4/W",
        "params/4/b",
        "state/1/mean",
        "state/1/var",
    }  # funcnet.paths' names
    got_p, got_s = load_safetensors(path, *_zeros((params, state)))
    _same_bits(got_p, params)
    _same_bits(got_s, state)


def test_gpt_params_in_bfloat16_and_decoding_cache_round_trip(tmp_path):
    net = GPT(11, 8, n_layer=2, n_head=2, n_embd=8, decode=True)
    params, state = _trees(net, (2, 1))  # a cache other than init's zeros
    params = jax.tree.map(lambda p: jnp.asarray(np.asarray(p).astype(jnp.bfloat16)), params)
    assert jax.tree.leaves(state)
    path = tmp_path / "gpt.safetensors"
    save_safetensors(path, params, state, metadata={"model": "gpt-tiny"})
    got_p, got_s = load_safetensors(path, *_zeros((params, state)))
    _same_bits(got_p, params)
    _same_bits(got_s, state)
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    assert meta["model"] == "gpt-tiny" and meta["funcnet.version"] == funcnet.__version__


def test_every_dtype_and_a_prng_key_round_trip_bit_for_bit(tmp_path):
    # built from NumPy values (jnp.asarray only copies them): no op to compile per dtype
    values = {
        "f64": (np.float64, [1 / 3, np.nan]),
        "i64": (np.int64, [-(2**40)]),
        "f32": (np.float32, [[1 / 3, -0.0, np.inf]]),
        "bf16": (jnp.bfloat16, [1 / 3, 1e-40, -2.5]),
        "f16": (np.float16, [1 / 3, 65504]),
        "i32": (np.int32, [-7, 2**31 - 1]),
        "i8": (np.int8, [-128]),
        "u8": (np.uint8, [255]),
        "u32": (np.uint32, [2**32 - 1]),
        "bool": (np.bool_, [True, False]),
        "c64": (np.complex64, [1 + 2j]),
        "scalar": (np.float32, 3.5),
    }
    with jax.enable_x64(True):
        params = {k: jnp.asarray(np.asarray(v, t)) for k, (t, v) in values.items()}
        key = jax.random.key(7)
        state = ({"rng": key}, {"count": jnp.asarray(np.int32(3))})
        path = tmp_path / "dtypes.safetensors"
        save_safetensors(path, params, state)
        like_p = {k: jnp.asarray(np.zeros(np.shape(v), t)) for k, (t, v) in values.items()}
        like_s = ({"rng": key}, {"count": jnp.asarray(np.int32(0))})
        got_p, got_s = load_safetensors(path, like_p, like_s)
        _same_bits(got_p, params)
        assert jax.dtypes.issubdtype(got_s[0]["rng"].dtype, jax.dtypes.prng_key)
        _same_bits(jax.random.key_data(got_s[0]["rng"]), jax.random.key_data(state[0]["rng"]))
        _same_bits(got_s[1], state[1])


def test_numpy_leaves_stay_numpy_so_float64_survives_with_x64_off(tmp_path):
    assert not jax.config.jax_enable_x64
    params = {"W": np.asarray([1 / 3, 2 / 3]), "b": jnp.ones(2)}  # float64, float32
    path = tmp_path / "np.safetensors"
    save_safetensors(path, params)
    got, _ = load_safetensors(path, params)
    assert isinstance(got["W"], np.ndarray) and isinstance(got["b"], jax.Array)
    _same_bits(got, params)
    assert not list(tmp_path.glob("*.tmp"))  # written under a temporary name


def test_a_misfit_lists_missing_unexpected_and_mismatched_names_in_one_error(tmp_path):
    params, state = _trees(_cnn(), (-1, 6, 6, 2))
    path = tmp_path / "cnn.safetensors"
    save_safetensors(path, params, state)
    other = funcnet.serial(L.Conv(5, (3, 3)), L.BatchNorm(), L.Relu, L.GlobalAvgPool, L.Dense(3), L.Dense(2))
    o_params, o_state = _trees(other, (-1, 6, 6, 2))
    o_params = (o_params[0], {**o_params[1], "scale": o_params[1]["scale"].astype(jnp.float16)}) + o_params[2:]
    with pytest.raises(CheckpointMismatchError) as e:
        load_safetensors(path, o_params, o_state)
    assert e.value.missing == ["params/5/W", "params/5/b"]
    assert e.value.unexpected == []
    assert [m.split(":")[0] for m in e.value.mismatched] == [
        "params/0/W",
        "params/0/b",
        "params/1/bias",
        "params/1/scale",
        "params/4/W",
        "state/1/mean",
        "state/1/var",
    ]
    msg = str(e.value)
    assert "missing from the file: params/5/W, params/5/b" in msg
    assert "params/0/W: float32[3, 3, 2, 4] in the file, float32[3, 3, 2, 5] in the params" in msg
    assert "params/1/scale: float32[4] in the file, float16[5] in the params" in msg
    assert "state/1/var: float32[4] in the file, float32[5] in the state" in msg


def test_a_file_with_state_loaded_without_it_says_to_pass_the_state(tmp_path):
    params, state = _trees(_cnn(), (-1, 6, 6, 2))
    path = tmp_path / "cnn.safetensors"
    save_safetensors(path, params, state)
    with pytest.raises(
        CheckpointMismatchError,
        match=r"in the file but not in the trees: "
        r"state/1/mean, state/1/var\. The file holds a state: pass it too",
    ):
        load_safetensors(path, params)
    save_safetensors(path, params)  # params alone load without a state
    got_p, got_s = load_safetensors(path, params)
    _same_bits(got_p, params)
    assert got_s is None
    with pytest.raises(
        CheckpointMismatchError,
        match=r"missing from the file: state/1/mean, "
        r"state/1/var\. The file holds no state .*load_safetensors\(path, "
        r"params\)\.$",
    ):
        load_safetensors(path, params, state)


def test_a_torch_named_file_points_to_load_torch_state_dict(tmp_path):
    from safetensors.numpy import save_file

    path = str(tmp_path / "model.safetensors")
    save_file({"0.weight": np.ones((3, 2), np.float32), "0.bias": np.zeros(3, np.float32)}, path)
    params, state = _trees(funcnet.serial(L.Dense(3)), (-1, 2))
    with pytest.raises(CheckpointMismatchError, match=r"not funcnet's .*load_torch_state_dict"):
        load_safetensors(path, params, state)
    got_p, _ = load_torch_state_dict(params, state, read_safetensors(path))
    np.testing.assert_array_equal(got_p[0]["W"], np.ones((2, 3)))
    assert len(read_safetensors(path)) == 2


def test_bad_metadata_and_unreadable_dtypes_are_refused_before_writing(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(ArgumentError, match=r"metadata must map str to str.*'epoch': 3"):
        save_safetensors(path, {"W": jnp.ones(2)}, metadata={"epoch": 3})
    with pytest.raises(ArgumentError, match=r"'params/W' has dtype float8_e4m3fn.*Cast it"):
        save_safetensors(path, {"W": jnp.ones(2, jnp.float8_e4m3fn)})
    assert not path.exists()
    with pytest.raises(FileNotFoundError, match="read_safetensors: no file"):
        read_safetensors(tmp_path / "absent.safetensors")


def test_without_safetensors_the_error_says_what_to_install(monkeypatch):
    # funcnet imports without the package: it is imported inside the functions only
    top = [n for n in ast.parse(inspect.getsource(_safetensors)).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("safetensors" in ast.dump(n) for n in top)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r'pip install "funcnet\[safetensors\]"'):
        save_safetensors("unused.safetensors", {"W": jnp.ones(2)})
    with pytest.raises(ImportError, match=r"read_safetensors needs the safetensors package"):
        read_safetensors("unused.safetensors")


def _torch_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 3, padding=1),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )


def _funcnet_cnn():
    return funcnet.serial(
        L.Conv(8, (3, 3)), L.BatchNorm(), L.Relu, L.Conv(4, (3, 3), padding="SAME"), L.GlobalAvgPool, L.Dense(5)
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_torch_models_safetensors_file_gives_torchs_eval_outputs(tmp_path, dtype):
    torch.manual_seed(0)  # skips here where torch is missing
    from safetensors.torch import save_file

    tnet = _torch_cnn()
    tnet.train()
    tnet(torch.randn(6, 3, 9, 9) * 2 + 1)  # running statistics worth loading
    tnet.eval()
    tnet = tnet.to(getattr(torch, dtype)).float()  # bfloat16: the file holds rounded values
    path = str(tmp_path / "model.safetensors")
    save_file(
        {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in tnet.state_dict().items()}, path
    )
    x = torch.randn(2, 3, 9, 9)
    want = tnet(x).detach().numpy()

    net = _funcnet_cnn()
    params, state = _trees(net, (-1, 9, 9, 3))
    new_p, new_s = load_torch_state_dict(params, state, read_safetensors(path))
    got, _ = jax.jit(net.apply)(new_p, new_s, jnp.asarray(x.numpy().transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new_s[1]["var"]), tnet[1].running_var.numpy())
