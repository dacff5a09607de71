"""Export format 3 (issue R, item 5): the `.fnx` file is a zip of standard parts.

* ``program.jaxexport`` is ``jax.export``'s own serialization: plain jax loads and runs it;
* ``weights.safetensors`` holds params and state under their ``funcnet.paths`` names
  (``params/...``, ``state/...``), bit for bit; ``funcnet.json`` is the header (version 3);
* the zip's CRC32 covers every member: any changed bit in them is refused as corruption;
  truncation, a zip that is not an export, a newer format and a tampered member are refused
  with messages naming the file;
* format 2 files (``format_version=2``) are still written on request and read.
"""

import io
import json
import zipfile

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flatbuffers", reason="jax.export's serializer needs flatbuffers")
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="export format 3 stores weights as safetensors")

import funcnet  # noqa: E402
from funcnet import serial  # noqa: E402
from funcnet.errors import ArgumentError  # noqa: E402
from funcnet.inference import export, load_exported, make_predict_fn  # noqa: E402
from funcnet.layers import BatchNorm, Dense, Relu  # noqa: E402

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    net = serial(Dense(3), BatchNorm(), Relu, Dense(2))
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    state = jax.tree.map(lambda v: v + 0.25, state)  # running statistics that matter
    path = export(net, params, state, (-1, 4), tmp_path_factory.mktemp("v3") / "m.fnx")
    return net, params, state, path


def _rezip(path, out, change):
    """``path``'s members, each passed through ``change(name, data)``, zipped to ``out``."""
    with zipfile.ZipFile(path) as z:
        members = [(n, change(n, z.read(n))) for n in z.namelist()]
    with zipfile.ZipFile(out, "w") as z:
        for n, data in members:
            if data is not None:
                z.writestr(n, data)
    return out


def test_the_file_is_a_zip_of_standard_parts(exported):
    net, params, state, path = exported
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == ["funcnet.json", "program.jaxexport", "weights.safetensors"]
        assert all(i.compress_type == zipfile.ZIP_STORED for i in z.infolist())
        header = json.loads(z.read("funcnet.json"))
        program = jax.export.deserialize(bytearray(z.read("program.jaxexport")))
        tensors = safetensors_numpy.load(z.read("weights.safetensors"))
    assert header["version"] == 3 and header["jax_version"] == jax.__version__
    assert header["inputs"] == [{"path": "", "shape": [None, 4], "dtype": "float32"}]
    names = funcnet.paths({"params": params, "state": state})
    assert [w["name"] for w in header["weights"]] == list(names) == sorted(tensors)
    for name, x in names.items():
        np.testing.assert_array_equal(tensors[name], x)
    # plain jax runs the program on the weights in the header's order, as funcnet does
    y = program.call([tensors[w["name"]] for w in header["weights"]], X)
    np.testing.assert_array_equal(y, make_predict_fn(net, params, state)(X))
    np.testing.assert_array_equal(load_exported(path)(X), y)


def test_the_same_export_gives_the_same_header_and_weights(exported, tmp_path):
    net, params, state, path = exported
    again = export(net, params, state, (-1, 4), tmp_path / "again.fnx")
    with zipfile.ZipFile(path) as a, zipfile.ZipFile(again) as b:
        for name in ("funcnet.json", "weights.safetensors"):
            assert a.getinfo(name).date_time == (1980, 1, 1, 0, 0, 0)
            assert a.read(name) == b.read(name)


def test_format_2_is_still_written_on_request_and_read(exported, tmp_path):
    net, params, state, _ = exported
    path = export(net, params, state, (-1, 4), tmp_path / "v2.fnx", format_version=2)
    assert path.read_bytes().startswith(b"funcnet-export\n")
    f = load_exported(path)
    assert f.header["version"] == 2
    np.testing.assert_array_equal(f(X), make_predict_fn(net, params, state)(X))
    for bad in (1, 4, "3", True):
        with pytest.raises(ArgumentError, match=r"format_version must be 3 .* or 2"):
            export(net, params, state, (-1, 4), tmp_path / "bad.fnx", format_version=bad)


def test_bit_flips_in_the_header_and_weights_are_refused(exported, tmp_path):
    """Every 5th byte of both members, each time another bit (all of them would take a
    minute; the CRC32 catches any single-bit change by construction)."""
    *_, path = exported
    data = path.read_bytes()
    with zipfile.ZipFile(path) as z:
        spans = [
            (i.header_offset + 30 + len(i.filename), i.file_size)
            for i in z.infolist()
            if i.filename != "program.jaxexport"
        ]
    target = tmp_path / "bad.fnx"
    for start, size in spans:
        for i in range(start, start + size, 5):
            target.write_bytes(data[:i] + bytes([data[i] ^ (1 << i % 8)]) + data[i + 1 :])
            with pytest.raises(ValueError, match=r"bad.fnx is truncated or corrupt"):
                load_exported(target)


def test_truncated_foreign_and_changed_files_are_refused(exported, tmp_path):
    *_, path = exported
    data = path.read_bytes()
    for n in (len(data) - 1, len(data) // 2, 40):
        (tmp_path / "short.fnx").write_bytes(data[:n])
        with pytest.raises(ValueError, match=r"short.fnx is truncated or corrupt"):
            load_exported(tmp_path / "short.fnx")
    (tmp_path / "program_flip.fnx").write_bytes(data[:-400] + bytes([data[-400] ^ 1]) + data[-399:])
    with pytest.raises(ValueError, match="corrupt"):
        load_exported(tmp_path / "program_flip.fnx")
    (tmp_path / "other").write_bytes(b"PK\x03\x04 not an export")
    with pytest.raises(ValueError, match="other is not a file written by funcnet.inference.export"):
        load_exported(tmp_path / "other")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("model.onnx", b"")
    (tmp_path / "zip.fnx").write_bytes(buf.getvalue())
    with pytest.raises(
        ValueError,
        match=r"zip.fnx is a zip but not a file written by "
        r"funcnet.inference.export: it has no funcnet.json",
    ):
        load_exported(tmp_path / "zip.fnx")

    def header(change):
        return lambda n, d: change(d) if n == "funcnet.json" else d

    newer = _rezip(path, tmp_path / "newer.fnx", header(lambda d: d.replace(b'"version": 3', b'"version": 9')))
    with pytest.raises(ValueError, match="format 9.*Upgrade funcnet"):
        load_exported(newer)
    lacks = _rezip(path, tmp_path / "lacks.fnx", header(lambda d: d.replace(b'"inputs"', b'"in"')))
    with pytest.raises(ValueError, match="header lacks inputs"):
        load_exported(lacks)
    no_weights = _rezip(path, tmp_path / "nw.fnx", lambda n, d: None if n == "weights.safetensors" else d)
    with pytest.raises(ValueError, match="lacks weights.safetensors: the zip was changed"):
        load_exported(no_weights)

    def fewer(n, d):
        if n != "weights.safetensors":
            return d
        tensors = safetensors_numpy.load(d)
        tensors["params/0/W"] = tensors["params/0/W"][:2]
        return safetensors_numpy.save(tensors)

    with pytest.raises(
        ValueError,
        match=r"does not hold the weights its funcnet.json lists "
        r"\(missing or of another shape or dtype: \['params/0/W'\]",
    ):
        load_exported(_rezip(path, tmp_path / "w.fnx", fewer))


def test_a_64_bit_export_needs_x64_to_load(exported, tmp_path):
    if jax.config.jax_enable_x64:
        pytest.skip("the check is for processes with jax_enable_x64 off")
    *_, path = exported

    def wide(n, d):
        if n == "weights.safetensors":
            return safetensors_numpy.save({k: v.astype(np.float64) for k, v in safetensors_numpy.load(d).items()})
        return d.replace(b'"float32"', b'"float64"') if n == "funcnet.json" else d

    with pytest.raises(ValueError, match=r"x64.fnx was exported with 64-bit types"):
        load_exported(_rezip(path, tmp_path / "x64.fnx", wide))


def test_weight_names_that_collide_and_a_missing_safetensors_are_explained(tmp_path, monkeypatch):
    ident = funcnet.named("Ident", lambda rng, s: (s, (), ()), lambda p, s, x, *, rng=None, train=False: (x, s))
    params = {"a/b": jnp.ones(2), "a": {"b": jnp.zeros(2)}}
    with pytest.raises(ArgumentError, match=r"paths \['params/a/b'\] name more than one leaf"):
        export(ident, params, (), (-1, 2), tmp_path / "m.fnx")
    export(ident, params, (), (-1, 2), tmp_path / "m2.fnx", format_version=2)  # by position
    monkeypatch.setitem(__import__("sys").modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r'pip install "funcnet\[export\]"'):
        export(ident, (), (), (-1, 2), tmp_path / "m3.fnx")
