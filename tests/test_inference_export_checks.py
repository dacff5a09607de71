"""funcnet.inference.load_exported refuses what it would otherwise serve wrong (issue G3).

* input values the exported dtype cannot hold (int64 ids past int32, -1 for uint8, 70000
  for float16) are refused, as make_predict_fn refuses int64 values int32 cannot hold,
  instead of being served wrapped (2**32 as id 0) or as inf;
* a changed byte in the file's JSON header is refused as corruption (export format 2
  covers the header with a checksum); format 1 files still load, with a warning;
* a file exported with 64-bit types needs jax_enable_x64 to load;
* ragged nested lists, the wrong rank: ArgumentErrors naming the input.
"""

import re
import struct
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flatbuffers", reason="jax.export's serializer needs flatbuffers")

from funcnet import named, serial  # noqa: E402
from funcnet.errors import ArgumentError  # noqa: E402
from funcnet.inference import export, load_exported, make_predict_fn  # noqa: E402
from funcnet.layers import Dense, Embedding, Flatten  # noqa: E402

MAGIC = b"funcnet-export\n"
N = len(MAGIC) + 8  # where the JSON header starts


def _header_end(data: bytes) -> int:
    return N + struct.unpack_from("<Q", data, len(MAGIC))[0]


def _rewrite_header(data: bytes, change, *, version: int = 2) -> bytes:
    """``data`` with its JSON header changed by ``change``, written back as format
    ``version`` (2: with its header checksum recomputed; 1: the layout without it)."""
    end = _header_end(data)
    head, body = change(data[N:end]), data[end + 4 :]
    lead = MAGIC + struct.pack("<Q", len(head)) + head
    return lead + (struct.pack("<I", zlib.crc32(lead)) if version >= 2 else b"") + body


@pytest.fixture(scope="module")
def ids_model(tmp_path_factory):
    """Ids (batch, 3) int32 -> logits: an Embedding of 10 rows, exported."""
    net = serial(Embedding(10, 4), Flatten, Dense(2))
    _, params, state = net.init(jax.random.key(0), (-1, 3))
    path = tmp_path_factory.mktemp("ids") / "ids.export"
    export(net, params, state, jax.ShapeDtypeStruct((-1, 3), jnp.int32), path)
    return net, params, state, path


def _identity(dtype, tmp_path):
    """An exported identity on (batch, 3) inputs of ``dtype`` (outputs float32)."""
    ident = named(
        "Ident", lambda rng, s: (s, (), ()), lambda p, s, x, *, rng=None, train=False: (x.astype(jnp.float32), s)
    )
    path = tmp_path / f"ident_{jnp.dtype(dtype).name}.export"
    return load_exported(export(ident, (), (), jax.ShapeDtypeStruct((-1, 3), dtype), path))


# ------------------------------------------------------------------ values that do not fit


def test_int64_ids_beyond_int32_are_refused_as_make_predict_fn_refuses_them(ids_model):
    net, params, state, path = ids_model
    f = load_exported(path)
    ids = np.array([[1, 2, 2**32]], np.int64)  # int32 would make it 0: row 0's embedding
    with pytest.raises(ValueError, match="int32 cannot hold"):
        make_predict_fn(net, params, state)(ids)  # what the docs promise, in-process
    with pytest.raises(ArgumentError) as info:
        f(ids)
    msg = str(info.value)
    for part in (
        "ids.export",
        "input holds 4294967296",
        "(at index (0, 2))",
        "exported dtype int32 cannot hold",
        "-2147483648 to 2147483647",
        "int64 input",
        "silently make it 0",
        "Pass values within that range",
    ):
        assert part in msg, (part, msg)
    with pytest.raises(ArgumentError, match=r"holds -8589934592 .* silently make it 0"):
        f(np.array([[1, 2, -(2**33)]], np.int64))
    with pytest.raises(ArgumentError, match="holds 1099511627776"):
        f([[1, 2, 2**40]])  # nested Python ints: an int64 array
    # int64 ids that fit are converted and served as the int32 ones are
    ok = np.array([[1, 2, 3], [9, 0, 4]])
    np.testing.assert_array_equal(f(ok.astype(np.int64)), f(ok.astype(np.int32)))
    np.testing.assert_array_equal(f(ok.astype(np.int64)), make_predict_fn(net, params, state)(ok))


@pytest.mark.parametrize(
    "exported, given, bad, becomes",
    [
        (jnp.uint8, np.array([[1, -1, 2]], np.int32), "-1", "255"),
        (jnp.uint8, np.array([[1, 256, 2]], np.int64), "256", "0"),
        (jnp.int8, np.array([[1, 128, 2]], np.int32), "128", "-128"),
        (jnp.uint32, np.array([[1, -5, 2]], np.int32), "-5", "4294967291"),
        (jnp.float16, np.array([[1, 70000, 2]], np.int32), "70000", "inf"),
        (jnp.float16, np.array([[1.0, -1e5, 2.0]], np.float32), "-100000.0", "-inf"),
        (jnp.float32, np.array([[1.0, 1e39, 2.0]], np.float64), "1e+39", "inf"),
        (jnp.bfloat16, np.array([[1.0, 1e39, 2.0]], np.float64), "1e+39", "inf"),
    ],
)
def test_conversions_that_would_wrap_or_overflow_are_refused(tmp_path, exported, given, bad, becomes):
    f = _identity(exported, tmp_path)
    name = jnp.dtype(exported).name
    with pytest.raises(
        ArgumentError,
        match=rf"input holds {re.escape(bad)} \(at index \(0, 1\)\), "
        rf"which the exported dtype {name} cannot hold .*"
        rf"silently make it {becomes}\.",
    ):
        f(given)
    with pytest.raises(ArgumentError, match=rf"holds {re.escape(bad)}"):
        f(jnp.asarray(given) if given.dtype.itemsize < 8 else given)  # on a device too
    # values that fit are served converted; non-finite floats are values, not overflow
    fine = np.where(np.arange(3) == 1, 7, given).astype(given.dtype)
    np.testing.assert_array_equal(f(fine), fine.astype(exported).astype(np.float32))
    if given.dtype.kind == "f":
        special = np.array([[np.nan, np.inf, -np.inf]], given.dtype)
        np.testing.assert_array_equal(f(special), special.astype(np.float32))


# ------------------------------------------------------------------ the header's checksum


def _linear(tmp_path, format_version=3):
    net = Dense(3)
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    path = export(net, params, state, (-1, 4), tmp_path / "m.export", format_version=format_version)
    return path, make_predict_fn(net, params, state)


def test_a_changed_header_byte_is_refused_as_corruption(tmp_path):
    path, _ = _linear(tmp_path, 2)
    data = path.read_bytes()
    end = _header_end(data)
    head = data[N:end]
    # The bias is the second weight, at byte 48: one bit more and it is read one byte off
    # (garbage served as the bias); the JSON still parses, the body's checksum still holds.
    weights = head[head.index(b'"weights"') :]
    at = N + head.index(b'"weights"') + weights.index(b'"offset": 48') + len(b'"offset": 4')
    assert data[at : at + 1] == b"8"
    flipped = tmp_path / "flipped.export"
    flipped.write_bytes(data[:at] + b"9" + data[at + 1 :])  # '8' -> '9': one bit
    with pytest.raises(ValueError) as info:
        load_exported(flipped)
    assert str(flipped) in str(info.value) and "corrupt" in str(info.value)
    assert "header's checksum does not match" in str(info.value)


def test_every_single_bit_flip_before_the_weights_is_refused(tmp_path):
    path, _ = _linear(tmp_path, 2)
    data = path.read_bytes()
    end = _header_end(data)
    target = tmp_path / "bad.export"
    for i in range(end + 4):  # magic, length, JSON header and its checksum
        for bit in range(8):
            target.write_bytes(data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :])
            with pytest.raises(ValueError) as info:
                load_exported(target)
            msg = str(info.value)
            assert str(target) in msg, (i, bit, msg)
            assert "corrupt" in msg if i >= len(MAGIC) else "not a file written by funcnet.inference.export" in msg, (
                i,
                bit,
                msg,
            )


def test_format_1_files_still_load_with_a_warning(tmp_path):
    path, predict = _linear(tmp_path, 2)
    data = path.read_bytes()
    assert b'"version": 2' in data[N : _header_end(data)]
    old = tmp_path / "v1.export"
    old.write_bytes(_rewrite_header(data, lambda h: h.replace(b'"version": 2', b'"version": 1'), version=1))
    with pytest.warns(
        UserWarning,
        match=r"v1.export is export format 1, whose header no "
        r"checksum covers.*Export it again",
    ):
        f = load_exported(old)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(f(x), predict(x))
    # its body is still covered, and a format 2 file read as format 1 does not fit
    body_flip = tmp_path / "v1_body.export"
    v1 = old.read_bytes()
    body_flip.write_bytes(v1[:-20] + bytes([v1[-20] ^ 1]) + v1[-19:])
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="corrupt"):
        load_exported(body_flip)
    demoted = tmp_path / "demoted.export"
    demoted.write_bytes(data.replace(b'"version": 2', b'"version": 1', 1))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="truncated or was changed"):
        load_exported(demoted)


def test_a_64_bit_export_needs_x64_to_load(tmp_path):
    if jax.config.jax_enable_x64:
        pytest.skip("the check is for processes with jax_enable_x64 off")
    path, _ = _linear(tmp_path, 2)
    # the header of a file exported with x64 on: float64 weights (its checksum right)
    wide = tmp_path / "x64.export"
    wide.write_bytes(_rewrite_header(path.read_bytes(), lambda h: h.replace(b'"float32"', b'"float64"')))
    with pytest.raises(
        ValueError,
        match=r"x64.export was exported with 64-bit types "
        r"\(float64: jax_enable_x64 was on\).*"
        r"jax.config.update\('jax_enable_x64', True\)",
    ):
        load_exported(wide)


# ------------------------------------------------------------------ malformed calls


def test_ragged_lists_and_wrong_ranks_name_the_input(tmp_path):
    path, _ = _linear(tmp_path)
    f = load_exported(path)
    with pytest.raises(
        ArgumentError,
        match=r"m.export\): input must be an array \(or nested "
        r"lists of one shape\), got list",
    ):
        f([[1.0, 2.0, 3.0, 4.0], [1.0]])
    for x in (np.ones((2, 4, 1), np.float32), np.float32(1.0), np.ones(4, np.float32)):
        with pytest.raises(
            ArgumentError, match=re.escape(f"input must have shape (batch, 4) float32, got shape {x.shape}")
        ):
            f(x)
