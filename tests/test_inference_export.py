"""funcnet.inference.export / load_exported: one file for serving, run without the model's code.

The exported programs are loaded and run in a fresh Python process that imports jax and
``funcnet.inference.load_exported`` only -- none of this file's model definitions -- and
their outputs must equal ``make_predict_fn``'s in this process bit for bit. Both
processes run on CPU with the same XLA flags (the subprocess inherits conftest's
environment: 4 simulated CPU devices, the backend optimisation level, the cache).
One subprocess serves every comparison, to keep the file quick.
"""

import functools
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flatbuffers", reason="jax.export's serializer needs flatbuffers")

from funcnet import FanInSum, named, parallel, serial  # noqa: E402
from funcnet.inference import export, load_exported, make_predict_fn  # noqa: E402
from funcnet.layers import (
    BatchNorm,
    Conv,
    Dense,
    Dropout,
    Flatten,
    MaxPool,  # noqa: E402
    Relu,
)
from funcnet.precision import Policy, apply_policy  # noqa: E402

MAGIC = b"funcnet-export\n"

BATCHES = (1, 7, 128)
BF16 = "params=float32,compute=bfloat16,output=float32"


def _init(net, input_shape, seed):
    return jax.jit(net.init, static_argnums=1)(jax.random.key(seed), input_shape)


def _trained_state(net, params, state, x):
    """Non-trivial BatchNorm running statistics: one train-mode step on shifted data."""
    step = jax.jit(lambda p, s, x: net.apply(p, s, x, rng=jax.random.key(9), train=True)[1])
    return step(params, state, x)


@functools.lru_cache(maxsize=None)  # built once, shared by the cases
def _mlp():
    net = serial(Dense(32), BatchNorm(), Relu, Dropout(0.5), Dense(10))
    _, params, state = _init(net, (-1, 20), 0)
    x = 3.0 * jax.random.normal(jax.random.key(1), (64, 20)) + 1.5
    state = _trained_state(net, params, state, x)
    assert not np.allclose(state[1]["mean"], 0) and not np.allclose(state[1]["var"], 1)
    return net, params, state


@functools.lru_cache(maxsize=None)  # built once, shared by the cases
def _cnn():
    # The first Conv (1 input channel) takes funcnet's "patches" path on CPU; the second
    # is pinned to "xla": "auto" asks whether the batch is > 32, which a symbolic batch
    # cannot answer (see test_a_layer_that_branches_on_the_batch_size_*).
    net = serial(
        Conv(8, (3, 3)),
        BatchNorm(),
        Relu,
        MaxPool((2, 2)),
        Conv(8, (3, 3), implementation="xla"),
        Relu,
        Flatten,
        Dense(10),
    )
    _, params, state = _init(net, (-1, 12, 12, 1), 2)
    x = 2.0 * jax.random.normal(jax.random.key(3), (32, 12, 12, 1)) - 1.0
    return net, params, _trained_state(net, params, state, x)


@functools.lru_cache(maxsize=None)  # built once, shared by the cases
def _two_inputs():
    net = serial(parallel(Dense(6), Dense(6)), FanInSum, Relu, Dense(3))
    _, params, state = _init(net, ((-1, 5), (-1, 4)), 4)
    return net, params, state


# name: (model, input_spec, export kwargs, make_predict_fn's policy, input shapes without batch)
CASES = {
    "mlp_bn": (_mlp, (-1, 20), {}, None, [(20,)]),
    "mlp_bn_bf16": (_mlp, (-1, 20), {"policy": BF16}, BF16, [(20,)]),
    "cnn": (_cnn, (-1, 12, 12, 1), {}, None, [(12, 12, 1)]),
    "cnn_bf16_cpu_cuda": (
        _cnn,
        jax.ShapeDtypeStruct((-1, 12, 12, 1), jnp.float32),
        {"policy": Policy.make("float32", "bfloat16", "float32"), "platforms": ("cpu", "cuda")},
        BF16,
        [(12, 12, 1)],
    ),
    "two_inputs": (_two_inputs, ((-1, 5), jax.ShapeDtypeStruct((-1, 4), jnp.float32)), {}, None, [(5,), (4,)]),
}

# Runs in a fresh process: jax, NumPy and load_exported, nothing of this file.
SERVE = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from funcnet.inference import load_exported

    assert jax.default_backend() == "cpu", jax.default_backend()
    root = sys.argv[1]
    results = {}
    for name in json.loads(open(root + "/cases.json").read()):
        predict = load_exported(f"{root}/{name}.export")
        inputs = np.load(f"{root}/{name}.inputs.npz")
        for key in sorted({k.split("/")[0] for k in inputs.files}):
            xs = [inputs[k] for k in sorted(k for k in inputs.files if k.split("/")[0] == key)]
            if key == "7":
                xs = [x.astype(np.float64) for x in xs]  # converted to the exported float32
            y = predict(xs[0] if len(xs) == 1 else tuple(xs))
            for i, leaf in enumerate(jax.tree.leaves(y)):
                results[f"{name}/{key}/{i}"] = np.asarray(leaf)
    np.savez(root + "/outputs.npz", **results)
""")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Exports every case, runs them in one fresh process; returns (expected, got)."""
    root = tmp_path_factory.mktemp("export")
    expected = {}
    for name, (make, spec, kwargs, policy, shapes) in CASES.items():
        net, params, state = make()
        written = export(net, params, state, spec, root / f"{name}.export", **kwargs)
        assert written == root / f"{name}.export"
        predict = make_predict_fn(net, params, state, policy=policy)
        inputs = {}
        for n in BATCHES:
            rng = np.random.default_rng(n)
            xs = [rng.normal(1.0, 2.0, (n,) + s).astype(np.float32) for s in shapes]
            inputs.update({f"{n}/{i}": x for i, x in enumerate(xs)})
            y = predict(xs[0] if len(xs) == 1 else tuple(xs))
            for i, leaf in enumerate(jax.tree.leaves(y)):
                expected[f"{name}/{n}/{i}"] = np.asarray(leaf)
        np.savez(root / f"{name}.inputs.npz", **inputs)
    (root / "cases.json").write_text(json.dumps(list(CASES)))
    # The environment as conftest made it: CPU, the same XLA flags, the same cache.
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, str(root)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(root / "outputs.npz") as z:
        got = {k: z[k] for k in z.files}
    return expected, got, root


@pytest.mark.parametrize("name", list(CASES))
def test_loaded_in_a_fresh_process_equals_make_predict_fn_bit_for_bit(served, name):
    expected, got, _ = served
    keys = sorted(k for k in expected if k.startswith(name + "/"))
    assert keys and keys == sorted(k for k in got if k.startswith(name + "/"))
    for k in keys:
        assert got[k].dtype == expected[k].dtype, k
        assert got[k].shape == expected[k].shape, k
        np.testing.assert_array_equal(got[k], expected[k], err_msg=k)


def test_eval_mode_uses_running_statistics_and_no_dropout(served):
    _, got, _ = served
    net, params, state = _mlp()
    x = np.random.default_rng(7).normal(1.0, 2.0, (7, 20)).astype(np.float32)
    want, _ = net.apply(params, state, x, rng=None, train=False)  # op by op: not bitwise
    np.testing.assert_allclose(got["mlp_bn/7/0"], want, rtol=1e-5, atol=1e-6)
    fresh = net.init(jax.random.key(0), (-1, 20))[2]  # zeros/ones running statistics
    assert not np.allclose(net.apply(params, fresh, x)[0], want, rtol=1e-3, atol=1e-3)


def test_header_records_the_input_spec_platforms_and_policy(served):
    root = served[2]
    f = load_exported(root / "cnn_bf16_cpu_cuda.export")
    assert f.input_spec == [{"path": "", "shape": [None, 12, 12, 1], "dtype": "float32"}]
    assert f.output_spec == [{"path": "", "shape": [None, 10], "dtype": "float32"}]
    assert f.header["platforms"] == ["cpu", "cuda"]
    assert f.header["policy"] == BF16
    g = load_exported(str(root / "two_inputs.export"))
    assert [s["path"] for s in g.input_spec] == ["[0]", "[1]"]
    assert "(batch, 5) float32" in repr(g) and "(batch, 4) float32" in repr(g)
    assert load_exported(root / "mlp_bn.export").header["policy"] is None


def test_a_wrong_feature_size_names_the_expected_shape(served):
    f = load_exported(served[2] / "mlp_bn.export")
    with pytest.raises(
        ValueError,
        match=r"must have shape \(batch, 20\) float32, got shape "
        r"\(7, 21\)",
    ):
        f(np.zeros((7, 21), np.float32))
    with pytest.raises(ValueError, match=r"must have shape \(batch, 20\).*got shape \(20,\)"):
        f(np.zeros(20, np.float32))
    with pytest.raises(ValueError, match=r"batch dimensions .* must be one size >= 1"):
        f(np.zeros((0, 20), np.float32))
    with pytest.raises(TypeError, match="must have dtype float32"):
        f(np.zeros((2, 20), np.complex64))
    with pytest.raises(ValueError, match="expected inputs structured as"):
        f({"x": np.zeros((2, 20), np.float32)})
    assert f([[0.5] * 20] * 3).shape == (3, 10)  # nested lists: one array


def test_several_inputs_share_one_batch_size(served):
    g = load_exported(served[2] / "two_inputs.export")
    with pytest.raises(ValueError, match=r"input\[1\] has shape \(3, 4\).* the 2 of the inputs"):
        g((np.zeros((2, 5), np.float32), np.zeros((3, 4), np.float32)))
    with pytest.raises(ValueError, match=r"input\[1\] must have shape \(2, 4\) float32"):
        g((np.zeros((2, 5), np.float32), np.zeros((2, 6), np.float32)))
    with pytest.raises(ValueError, match="expected inputs structured as"):
        g([np.zeros((2, 5), np.float32), np.zeros((2, 4), np.float32)])  # a list, not a tuple


def _linear():
    net = Dense(3)
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    return net, params, state


@pytest.mark.parametrize(
    "spec, match",
    [
        ((None, 4), r"the batch dimension is -1, not None"),
        ((-1, 0), r"dimensions must be positive, or -1 for the batch, got \(-1, 0\)"),
        ((-2, 4), r"dimensions must be positive, or -1"),
        ("(-1, 4)", r"must be a shape like \(-1, 784\)"),
        ((-1, 4.0), r"must have int dimensions"),
        ((-1, True), r"must have int dimensions \(-1 for the batch\), got \(-1, True\)"),
        ({}, r"no inputs|must be a shape like"),
        ({1: (-1, 4)}, r"dict keys must be strings"),
        (((-1, 4), "x"), r"input_spec\[1\] must be a shape like"),
        (np.zeros((2, 4)), r"must be a shape like"),
        (jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 4"), jnp.float32), r"spell the batch as -1"),
        (jax.ShapeDtypeStruct((-1, 4), jnp.float32), None),
    ],
)
def test_bad_input_specs_are_refused(tmp_path, spec, match):
    net, params, state = _linear()
    path = tmp_path / "m.export"
    if match is None:  # the control: a good spec
        export(net, params, state, spec, path)
        assert load_exported(path)(np.ones((2, 4), np.float32)).shape == (2, 3)
        return
    with pytest.raises((ValueError, TypeError), match=match):
        export(net, params, state, spec, path)
    assert not path.exists()


def test_a_spec_the_params_do_not_fit_fails_with_the_layers_message(tmp_path):
    net, params, state = _linear()
    with pytest.raises(ValueError, match=r"Dense\(3\): input has 5 features"):
        export(net, params, state, (-1, 5), tmp_path / "m.export")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"platforms": ("gpu",)}, r"'gpu' is 'cuda' or 'rocm'"),
        ({"platforms": ("cpu", "cpu")}, r"distinct names"),
        ({"platforms": ()}, r"platforms must be None"),
        ({"policy": 3}, r"policy must be None, a funcnet.precision.Policy"),
        ({"dtype": "text"}, r"dtype must be a numeric dtype"),
    ],
)
def test_bad_export_arguments_are_refused(tmp_path, kwargs, match):
    net, params, state = _linear()
    with pytest.raises((ValueError, TypeError), match=match):
        export(net, params, state, (-1, 4), tmp_path / "m.export", **kwargs)


def test_paths(tmp_path):
    net, params, state = _linear()
    with pytest.raises(ValueError, match="is a directory"):
        export(net, params, state, (-1, 4), tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export(net, params, state, (-1, 4), tmp_path / "missing" / "m.export")
    with pytest.raises(TypeError, match="path must be a file path"):
        load_exported(3)
    # Overwriting an export replaces it whole, leaving no temporary file behind.
    export(net, params, state, (-1, 4), tmp_path / "m.export")
    params2 = jax.tree.map(lambda p: p + 1, params)
    export(net, params2, state, (-1, 4), tmp_path / "m.export")
    assert [p.name for p in tmp_path.iterdir()] == ["m.export"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(load_exported(tmp_path / "m.export")(x), make_predict_fn(net, params2, state)(x))


def rewrite_header(data: bytes, change, *, version: int = 2) -> bytes:
    """``data`` (an export file) with its JSON header changed by ``change`` and written
    back as export format ``version`` (2: its checksum recomputed; 1: none)."""
    n = len(MAGIC) + 8
    (size,) = struct.unpack_from("<Q", data, len(MAGIC))
    head, body = change(data[n : n + size]), data[n + size + 4 :]
    lead = MAGIC + struct.pack("<Q", len(head)) + head
    return lead + (struct.pack("<I", zlib.crc32(lead)) if version >= 2 else b"") + body


def test_damaged_and_foreign_files_are_refused(tmp_path):
    net, params, state = _linear()
    path = export(net, params, state, (-1, 4), tmp_path / "m.export", format_version=2)
    data = path.read_bytes()
    (tmp_path / "flipped").write_bytes(data[:-20] + bytes([data[-20] ^ 1]) + data[-19:])
    with pytest.raises(ValueError, match="corrupt"):
        load_exported(tmp_path / "flipped")
    (tmp_path / "short").write_bytes(data[:-1])
    with pytest.raises(ValueError, match="truncated"):
        load_exported(tmp_path / "short")
    (tmp_path / "other").write_bytes(b"PK\x03\x04 not an export")
    with pytest.raises(ValueError, match="not a file written by funcnet.inference.export"):
        load_exported(tmp_path / "other")
    # A newer funcnet's file, and a header without a key, each with its header's checksum
    # right (tests/test_inference_export_checks.py changes the header without it).
    (tmp_path / "newer").write_bytes(rewrite_header(data, lambda h: h.replace(b'"version": 2', b'"version": 9', 1)))
    with pytest.raises(ValueError, match="format 9.*Upgrade funcnet"):
        load_exported(tmp_path / "newer")
    (tmp_path / "renamed").write_bytes(rewrite_header(data, lambda h: h.replace(b'"crc32"', b'"crc64"', 1)))
    with pytest.raises(ValueError, match="header lacks crc32"):
        load_exported(tmp_path / "renamed")


def test_a_file_for_another_platform_says_how_to_export_for_this_one(tmp_path):
    net, params, state = _linear()
    here = jax.export.default_export_platform()
    other = "cuda" if here == "cpu" else "cpu"
    path = export(net, params, state, (-1, 4), tmp_path / "m.export", platforms=(other,))
    with pytest.raises(
        ValueError,
        match=rf"(?s)exported for \('{other}',\).*runs on "
        rf"'{here}'.*platforms=\('{other}', '{here}'\)",
    ):
        load_exported(path)


def test_a_file_past_jaxs_compatibility_window_names_jaxs_bypass_flag(tmp_path, monkeypatch):
    """jax >= 0.11 refuses exports older than 6 months; its message is kept and, where this
    jax has the flag that loads them anyway, the error names it."""
    net, params, state = _linear()
    path = export(net, params, state, (-1, 4), tmp_path / "m.export")
    expired = (
        "Exported being deserialized seems to be older than the 6-month "
        "backward-compatibility window and cannot be deserialized anymore."
    )

    def refuse(blob):
        raise ValueError(expired)

    monkeypatch.setattr(jax.export, "deserialize", refuse)
    with pytest.raises(ValueError, match="6-month") as info:
        load_exported(path)
    has_flag = "jax_export_deserialize_expired_versions" in jax.config.values
    assert ("JAX_EXPORT_DESERIALIZE_EXPIRED_VERSIONS=1" in str(info.value)) == has_flag


def test_a_layer_that_branches_on_the_batch_size_exports_a_fixed_batch_only(tmp_path):
    def init(rng, input_shape):
        return input_shape, (), ()

    def apply(params, state, x, *, rng=None, train=False):
        return (2 * x if x.shape[0] > 32 else x), state

    odd = named("BatchBranch", init, apply)
    with pytest.raises(
        ValueError,
        match=r"(?s)BatchBranch \(or a layer in it\) compares the "
        r"batch size.*Export a fixed batch size",
    ):
        export(odd, (), (), (-1, 3), tmp_path / "m.export")
    f = load_exported(export(odd, (), (), (40, 3), tmp_path / "m.export"))
    np.testing.assert_array_equal(f(np.ones((40, 3), np.float32)), 2 * np.ones((40, 3)))
    with pytest.raises(ValueError, match=r"must have shape \(40, 3\).*for this shape only"):
        f(np.ones((41, 3), np.float32))


def test_integer_inputs_and_prng_keys_in_the_state(tmp_path):
    def init(rng, input_shape):
        return input_shape, {"w": jnp.arange(3, dtype=jnp.int32)}, ()

    def apply(params, state, x, *, rng=None, train=False):
        return x * params["w"], state

    scale = named("IntScale", init, apply)
    _, params, _ = scale.init(None, (-1, 3))
    f = load_exported(export(scale, params, (), jax.ShapeDtypeStruct((-1, 3), jnp.int32), tmp_path / "i.export"))
    np.testing.assert_array_equal(f(np.ones((2, 3), np.int32)), [[0, 1, 2]] * 2)
    with pytest.raises(TypeError, match="must have dtype int32"):
        f(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match=r"state\['key'\] is a key<fry> array"):
        export(scale, params, {"key": jax.random.key(0)}, (-1, 3), tmp_path / "k.export")


def test_make_predict_fn_policy_is_apply_policy_and_reuses_its_program():
    net, params, state = _mlp()
    x = np.random.default_rng(0).normal(size=(5, 20)).astype(np.float32)
    got = make_predict_fn(net, params, state, policy=BF16)(x)
    want = make_predict_fn(apply_policy(net, BF16), params, state)(x)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == jnp.float32
    f1 = make_predict_fn(net, params, state, policy=BF16)
    f2 = make_predict_fn(net, params, state, policy=Policy.make("f32", "bf16", "f32"))
    assert f1.func is f2.func
    with pytest.raises(TypeError, match="policy must be None"):
        make_predict_fn(net, params, state, policy=["bf16"])
