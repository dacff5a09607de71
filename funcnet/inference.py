"""Running a trained network: the inputs-to-outputs function, with params and state bound.

* :func:`make_predict_fn` -- in this process, with the model's code: ``predict(x)``.
* :func:`export` / :func:`load_exported` -- for serving: one file holding the
  eval-mode network as StableHLO (:mod:`jax.export`) with its params and state,
  loaded in any process that has jax, without the model's code. The file is a zip of
  standard parts (the serialized ``jax.export`` program, a ``.safetensors`` file of the
  weights, a JSON header), so plain JAX and safetensors open it without funcnet too.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import struct
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import jax.export  # a submodule jax before 0.8 does not import by itself
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from funcnet import _checks as checks
from funcnet import precision
from funcnet._export_args import BATCH, InputSpec, check_dtype, dest_path, input_specs
from funcnet._version import __version__
from funcnet.core import Layer, PyTree, as_layer
from funcnet.fileio import atomic_write
from funcnet.params import path_str

__all__ = ["make_predict_fn", "export", "load_exported"]


def make_predict_fn(
    layer: Layer, params: PyTree, state: PyTree = (), *, policy: Optional[precision.Policy | str] = None
) -> Callable[[PyTree], PyTree]:
    """Returns ``predict(inputs) -> outputs``: ``layer.apply`` in eval mode, jitted.

    ``predict(x)`` is ``layer.apply(params, state, x, rng=None, train=False)[0]``
    (PyTorch's ``model.eval()`` followed by ``model(x)`` under ``no_grad``; Keras'
    ``model.predict``): Dropout is off, BatchNorm uses its running statistics, and
    the unchanged state is dropped. ``state`` may stay ``()`` when every layer is
    stateless; a network with BatchNorm needs the state from training
    (``train_state.state``, or ``train_state.state["gen"]`` for one model of several).

    ``policy`` (a :class:`funcnet.precision.Policy` or a string such as ``"bf16"``
    or ``"params=float32,compute=bfloat16,output=float32"``) runs the network as
    ``funcnet.precision.apply_policy(layer, policy)`` does: params and floating
    inputs cast to the compute dtype, outputs to the output dtype. Leave it None
    for a layer that is already wrapped, or to run in the params' own dtypes.

    Named ``make_*`` like :func:`funcnet.make_train_step`: it builds a function.
    ``params`` and ``state`` are passed to the jitted function as arguments, not
    baked into the compiled program as constants, so large models compile as fast
    as small ones; a new input shape compiles once more.

    Args:
      layer: the network (a :class:`funcnet.Layer`).
      params: its params.
      state: its state (``()`` for a stateless network).
      policy: a :class:`funcnet.precision.Policy`, a policy string, or None.

    Returns:
      The jitted ``predict(inputs) -> outputs``.

    Raises:
      ArgumentError: ``policy`` is neither a Policy, a policy string nor None.
      ValueError: ``params``, ``state`` or (when called) the inputs hold a 64-bit
        integer that int32 cannot hold with x64 off (it would be used wrapped).

    Examples:
      >>> from funcnet.layers import Dense
      >>> net = Dense(2)
      >>> _, params, state = net.init(jax.random.key(0), (-1, 3))
      >>> predict = make_predict_fn(net, params, state)
      >>> predict(jnp.ones((5, 3))).shape
      (5, 2)
    """
    layer = as_layer(layer, "make_predict_fn")
    if policy is not None:
        layer = _with_policy(layer, _policy("make_predict_fn", policy))
    checks.fits_x32("make_predict_fn", {"params": params, "state": state})
    return functools.partial(_predictor(layer), params, state)


@functools.lru_cache(maxsize=64)
def _predictor(layer):
    # One jitted function per layer: new params for the same network (every epoch's,
    # say) reuse its compiled program instead of compiling another.
    @jax.jit
    def jitted(params, state, inputs):
        outputs, _ = layer.apply(params, state, inputs, rng=None, train=False)
        return outputs

    def predict(params, state, inputs):
        # jit would store int64 inputs int32 cannot hold (x64 off) wrapped: ids of 2**40
        # would look up row 0 without a word.
        checks.fits_x32("make_predict_fn's predict", {"inputs": inputs})
        return jitted(params, state, inputs)

    # What a jitted function offers stays reachable (lowering, the compile count).
    predict.lower, predict._cache_size = jitted.lower, jitted._cache_size
    return predict


def _policy(where: str, policy):
    """``policy`` as a validated, hashable :class:`funcnet.precision.Policy`."""
    if isinstance(policy, str):
        return precision.parse_policy(policy)
    if isinstance(policy, precision.Policy):
        return precision.Policy.make(*policy)
    raise checks.ArgumentError(
        f"{where}: policy must be None, a funcnet.precision.Policy or a string like "
        f"'bf16' or 'params=float32,compute=bfloat16,output=float32', got {checks.got(policy)}."
    )


@functools.lru_cache(maxsize=64)
def _with_policy(layer, policy):
    # Cached so that make_predict_fn(..., policy=p) for new params reuses _predictor's program.
    return precision.apply_policy(layer, policy)


def _policy_text(policy) -> str:
    name = lambda d: jnp.dtype(d).name
    return f"params={name(policy.param_dtype)},compute={name(policy.compute_dtype)},output={name(policy.output_dtype)}"


# --------------------------------------------------------------------------- #
# Export for serving.
# --------------------------------------------------------------------------- #

_MAGIC = b"funcnet-export\n"
# 3: a zip of standard parts (_HEADER_NAME, _PROGRAM_NAME, _WEIGHTS_NAME), each covered by
# the zip's own CRC32. 2 (still written on request, and read): one funcnet-specific file, a
# CRC32 of everything before it (the magic line, the header's length, the header) follows
# the header; 1 (read still, with a warning) had the body's checksum only.
_FORMAT_VERSION = 3
_HEADER_NAME, _PROGRAM_NAME, _WEIGHTS_NAME = "funcnet.json", "program.jaxexport", "weights.safetensors"
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_NAME_AT = 30  # where a zip's first local file header holds the member's name
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same export gives the same bytes
_HEADER_LEN = struct.Struct("<Q")
_HEADER_CRC = struct.Struct("<I")
_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


def export(
    layer: Layer,
    params: PyTree,
    state: PyTree,
    input_spec: InputSpec,
    path: str | os.PathLike,
    *,
    policy: Optional[precision.Policy | str] = None,
    dtype: DTypeLike = jnp.float32,
    platforms: Optional[Sequence[str]] = None,
    format_version: int = 3,
) -> Path:
    """Writes the eval-mode network, with its params and state, to one file for serving.

    The file holds ``predict = make_predict_fn(layer, params, state, policy=policy)``
    as a :mod:`jax.export` program (StableHLO), so :func:`load_exported` can run it
    in any process that has jax -- no model code, no funcnet layers, no pickles.
    Eval mode: ``train=False``, no rng (Dropout off, BatchNorm's running statistics).
    Returns the path written.

    Args:
      layer: the network (a :class:`funcnet.Layer`).
      params: its trained params.
      state: its trained state (``()`` for a stateless network).
      input_spec: the inputs' shapes, as ``init``'s ``input_shape``: ``(-1, 784)``
        for one float input whose batch size may vary, where ``-1`` marks the batch
        dimension (it may stand on any axis; every ``-1``, in every input, is the
        same batch size). A spec without ``-1`` exports one fixed shape. A
        ``jax.ShapeDtypeStruct((-1, 128), jnp.int32)`` gives an input another dtype
        than ``dtype``. Several inputs: a tuple, list or dict (string keys) of
        those, nested as the network's ``apply`` takes them, e.g.
        ``{"image": (-1, 28, 28, 1), "ids": jax.ShapeDtypeStruct((-1, 16), jnp.int32)}``.
      path: the file to write (its directory must exist). It is written atomically:
        a reader sees the old file or the whole new one.
      policy: a :class:`funcnet.precision.Policy` or a policy string (``"bf16"``,
        ``"params=float32,compute=bfloat16,output=float32"``) to run the network
        under, as ``make_predict_fn(..., policy=...)``; None runs it as it is.
      dtype: the dtype of the inputs given as plain shapes (default float32).
      platforms: what the program is compiled for: None (default) for this process's
        backend (``jax.default_backend()``: "cpu", "cuda", ...), or several of
        "cpu", "cuda", "rocm", "tpu" -- ``platforms=("cpu", "cuda")`` makes one file
        that runs on both (jax lowers for a platform without its hardware or plugin
        here). Layers that pick an implementation by ``jax.default_backend()``
        (``Conv(implementation="auto")``) pick it for *this* process's backend, for
        every platform exported.
      format_version: 3 (default) writes the zip below; 2 the single funcnet-specific
        file of earlier funcnet versions, for a server whose funcnet reads no format 3.

    The file (format 3) is a zip (members stored, not compressed) of standard parts:

    * ``funcnet.json``: the header -- format version, funcnet and jax versions, layer
      name, policy, platforms, each input's path, shape (``null`` for the batch) and
      dtype, the outputs' shapes, and each weight's name, shape and dtype in the order
      the program takes them;
    * ``program.jaxexport``: ``Exported.serialize()``'s bytes, which any jax reads
      back with ``jax.export.deserialize``; the program is ``f(weights, inputs)``,
      ``weights`` the list of arrays named in the header;
    * ``weights.safetensors``: the params and state leaves, named by their
      :func:`funcnet.paths` under ``params/`` and ``state/`` (as
      :func:`funcnet.interop.save_safetensors` names them).

    The zip's CRC32 covers every member: :func:`load_exported` refuses a file with any
    of their bytes changed. It checks call-time inputs against the header's input spec.
    [The export guide](../guides/export.md) shows how to run the file with jax and safetensors
    alone. Format 2, for comparison: the line ``funcnet-export``, an 8-byte little-endian
    header length, the JSON header, its CRC32, the raw little-endian weights, the program.

    Params and state are stored in the file and handed to the program as arguments
    rather than folded into it as XLA constants: XLA would then precompute parts of
    the network at compile time (BatchNorm's ``rsqrt(var + eps) * scale``) on the
    host, which differs from the compiled kernels in the last bit; as arguments the
    loaded program computes what ``make_predict_fn`` computes, bit for bit on the
    same platform, jax version and XLA flags (the tests check it on CPU). It stays
    one file either way.

    Limits: a layer whose Python code compares the batch size with a number while
    tracing (``if x.shape[0] > 32``) cannot be exported with a symbolic batch:
    export a fixed batch instead (no ``-1``). Exported programs hold no gradient
    (serving only). jax's serialization needs the ``flatbuffers`` package; params
    and state must be arrays (a PRNG key in the state is refused). Format 3 needs the
    ``safetensors`` package too; ``pip install "funcnet[export]"`` installs both.

    Returns:
      The path written, a ``pathlib.Path``.

    Raises:
      ArgumentError: a malformed ``input_spec``, ``dtype``, ``platforms`` or
        ``path``, or params/state leaves that are not arrays.
      FileNotFoundError: ``path``'s directory does not exist.
      ImportError: the ``flatbuffers`` package is missing (or, for format 3,
        ``safetensors``).

    Examples:
      >>> import os, tempfile
      >>> from funcnet.layers import Dense
      >>> net = Dense(2)
      >>> _, params, state = net.init(jax.random.key(0), (-1, 3))
      >>> path = export(net, params, state, (-1, 3), os.path.join(tempfile.mkdtemp(), "net.fnx"))
      >>> load_exported(path)(jnp.ones((5, 3))).shape
      (5, 2)
    """
    where = "funcnet.inference.export"
    layer = as_layer(layer, where)
    if policy is not None:
        policy = _policy(where, policy)
        layer = _with_policy(layer, policy)
    dtype = check_dtype(where, "dtype", dtype)
    specs, structs = input_specs(where, input_spec, dtype)
    platforms = _platforms(where, platforms)
    if format_version not in (2, 3) or isinstance(format_version, bool):
        raise checks.ArgumentError(
            f"{where}: format_version must be 3 (the zip of standard parts) or 2 (the single "
            f"file earlier funcnet versions wrote and read), got {format_version!r}."
        )
    path = dest_path(where, path)
    leaves, names, weights_tree = _weight_leaves(where, params, state)

    def predict(weights, inputs):
        p, s = jax.tree.unflatten(weights_tree, weights)
        outputs, _ = layer.apply(p, s, inputs, rng=None, train=False)
        return outputs

    weight_structs = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    try:
        exported = jax.export.export(jax.jit(predict), platforms=platforms)(weight_structs, structs)
    except Exception as e:
        if type(e).__name__ == "InconclusiveDimensionOperation":
            raise ValueError(
                f"{where}: {layer.name} (or a layer in it) compares the batch size with a "
                f"number while it is traced, which a symbolic batch (-1 in input_spec) "
                f"cannot answer: {e}\n"
                f"Export a fixed batch size instead (input_spec without -1, one file per "
                f"batch size), or change the layer to decide without the batch size."
            ) from e
        raise
    blob = _serialize(where, exported)

    out_paths = jax.tree_util.tree_flatten_with_path(
        jax.tree.unflatten(exported.out_tree, range(len(exported.out_avals)))
    )[0]
    header = {
        "format": "funcnet-export",
        "version": format_version,
        "funcnet_version": _funcnet_version(),
        "jax_version": jax.__version__,
        "name": layer.name,
        "policy": None if policy is None else _policy_text(policy),
        "platforms": list(exported.platforms),
        "inputs": specs,
        "outputs": [
            {
                "path": jax.tree_util.keystr(keys),
                "shape": [_dim_json(d) for d in exported.out_avals[i].shape],
                "dtype": exported.out_avals[i].dtype.name,
            }
            for keys, i in out_paths
        ],
    }
    if format_version == 2:
        _write_v2(path, header, leaves, blob)
    else:
        _write_v3(where, path, header, names, leaves, blob)
    return path


def _write_v2(path: Path, header: dict, leaves: list, blob: bytes) -> None:
    """Format 2: magic line, header length, JSON header, its CRC32, raw weights, program."""
    weights_meta, offset, crc = [], 0, 0
    for x in leaves:
        weights_meta.append({"shape": list(x.shape), "dtype": x.dtype.name, "offset": offset, "nbytes": x.nbytes})
        offset += x.nbytes
        crc = zlib.crc32(_le_bytes(x), crc)
    header = {
        **header,
        "weights": weights_meta,
        "module": {"offset": offset, "nbytes": len(blob)},
        "crc32": zlib.crc32(blob, crc),
    }
    head = json.dumps(header).encode("utf-8")
    lead = _MAGIC + _HEADER_LEN.pack(len(head)) + head
    with atomic_write(path) as (f, _):
        f.write(lead)
        f.write(_HEADER_CRC.pack(zlib.crc32(lead)))
        for x in leaves:
            f.write(_le_bytes(x))
        f.write(blob)


def _write_v3(where: str, path: Path, header: dict, names: list, leaves: list, blob: bytes) -> None:
    """Format 3: a zip, members stored uncompressed (loading is a read, not an inflate),
    the header first so that a damaged file is still recognised as an export."""
    if len(set(names)) != len(names):  # safetensors keys weights by name
        twice = sorted({n for n in names if names.count(n) > 1})
        raise checks.ArgumentError(
            f"{where}: params/state paths {twice} name more than one leaf (a dict key holding "
            f"'/'); rename those keys, or export with format_version=2 (weights by position)."
        )
    st = _safetensors(where)
    header = {
        **header,
        "weights": [{"name": n, "shape": list(x.shape), "dtype": x.dtype.name} for n, x in zip(names, leaves)],
        "files": {"program": _PROGRAM_NAME, "weights": _WEIGHTS_NAME},
    }
    tensors = st.numpy.save(dict(zip(names, leaves)), metadata={"funcnet.version": _funcnet_version()})
    members = (
        (_HEADER_NAME, json.dumps(header, indent=1).encode("utf-8")),
        (_PROGRAM_NAME, blob),
        (_WEIGHTS_NAME, tensors),
    )
    with atomic_write(path) as (f, _), zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = 0o644 << 16  # -rw-r--r-- when unzipped
            z.writestr(info, data)


def _safetensors(where: str):
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError(
            f"{where}: export files (format {_FORMAT_VERSION}) hold their weights as "
            f"safetensors, and the safetensors package is not installed. Install it with "
            f'pip install "funcnet[export]" (or pip install safetensors).'
        ) from None
    return safetensors


def load_exported(path: str | os.PathLike) -> Callable[[PyTree], PyTree]:
    """Loads a file written by :func:`export`: returns ``predict(inputs) -> outputs``.

    Needs jax only (and ``flatbuffers``, which jax's deserializer imports, and
    ``safetensors`` for format 3: the ``export`` extra): not the model's code.
    ``inputs`` has the structure of the exported ``input_spec`` (one array for
    ``(-1, 784)``); any batch size >= 1 runs, each new one compiling once.
    Before running, every input is checked against the stored spec: its rank
    and every dimension but the batch must match, or a ValueError names the
    expected shape. An input of another dtype is converted to the exported one
    when that does not change its kind for the worse (float64 -> float32,
    int -> float; not float -> int) and every value survives the conversion: an
    int64 id beyond the exported int32's range (or -1 for a uint8 input), or a
    finite value beyond a float dtype's largest (70000.0 for float16), is refused
    rather than served wrapped or as ``inf``, as ``make_predict_fn`` refuses
    int64 values int32 cannot hold. Outputs are ``jax.Array``s, as
    ``make_predict_fn`` gives.

    Integrity: the file's header, weights and program are covered by checksums (the
    zip's CRC32 of each member in export format 3, funcnet's own in format 2); a changed
    byte in them is refused as corrupt, naming the file, and so are weights that differ
    from the header's list. Files of format 2 load as they did; files of format 1
    (funcnet before format 2) still load, with a warning:
    their header is not covered, so re-export them. A file exported with
    ``jax_enable_x64`` on whose inputs, weights or outputs are 64-bit loads only
    with it on (jax would otherwise truncate them to 32 bits).

    The result also has ``input_spec`` and ``output_spec`` (lists of
    ``{"path", "shape", "dtype"}``, ``None`` in a shape for the batch), ``header``
    (the file's whole JSON header) and ``exported`` (the :class:`jax.export.Exported`).

    The program runs on the platforms it was exported for: loading it in a process
    whose default backend is another raises an error that says how to export for
    this one.

    Args:
      path: a file :func:`export` wrote.

    Returns:
      ``predict(inputs) -> outputs``, with the attributes above.

    Raises:
      ArgumentError: ``path`` is not a file path; (at call time) inputs that do not
        match the stored spec, or whose values the exported dtype cannot hold.
      ValueError: the file is not an export, is truncated or corrupt (header
        included), was exported for another platform, or needs ``jax_enable_x64``.
      ImportError: the ``flatbuffers`` package is missing (or, for format 3,
        ``safetensors``).

    Examples:
      >>> import os, tempfile
      >>> from funcnet.layers import Dense
      >>> net = Dense(2)
      >>> _, params, state = net.init(jax.random.key(0), (-1, 3))
      >>> path = export(net, params, state, (-1, 3), os.path.join(tempfile.mkdtemp(), "net.fnx"))
      >>> predict = load_exported(path)
      >>> predict(jnp.ones((4, 3))).shape, predict.input_spec[0]["shape"]
      ((4, 2), [None, 3])
    """
    where = "funcnet.inference.load_exported"
    if not isinstance(path, (str, os.PathLike)):
        raise checks.ArgumentError(f"{where}: path must be a file path (str or os.PathLike), got {checks.got(path)}.")
    path = Path(os.fspath(path))
    data = path.read_bytes()
    if data.startswith(_MAGIC):
        header, blob, weights = _read_v2(where, path, data)
    else:
        header, blob, weights = _read_v3(where, path, data)
    try:
        exported = jax.export.deserialize(bytearray(blob))
    except ImportError as e:
        raise ImportError(
            f"{where}: jax's deserializer needs the 'flatbuffers' package: pip install flatbuffers ({e})."
        ) from e
    except Exception as e:
        raise ValueError(
            f"{where}: jax {jax.__version__} cannot read the program in {path}, written "
            f"with jax {header.get('jax_version')}: {e}. Load it with a jax version close to "
            f"that one, or export it again with this one.{_expired_hint(e)}"
        ) from e
    here = jax.export.default_export_platform()
    if here not in exported.platforms:
        raise ValueError(
            f"{where}: {path} was exported for {tuple(exported.platforms)}, but this process "
            f"runs on {here!r}. Export with platforms=({', '.join(map(repr, exported.platforms))}"
            f", {here!r}), or run this process on one of those (e.g. JAX_PLATFORMS=cpu)."
        )
    _check_x64(where, path, header)
    weights = [jax.device_put(w) for w in weights]
    return _Loaded(path, header, exported, weights)


def _read_v2(where: str, path: Path, data: bytes):
    """A format 1 or 2 file's header, program bytes and weights (host arrays), checked."""
    header, body = _read_header(where, path, data)
    module = header["module"]
    if len(body) != module["offset"] + module["nbytes"]:
        raise ValueError(
            f"{where}: {path} is {len(data)} bytes, not the size its header "
            f"describes: the file is truncated or was changed. Export it again."
        )
    if zlib.crc32(body) != header["crc32"]:
        raise ValueError(f"{where}: {path} is corrupt (its checksum does not match). Export it again.")
    weights = []
    for w in header["weights"]:
        dt = jnp.dtype(w["dtype"])
        raw = np.frombuffer(body, dt.newbyteorder("<"), math.prod(w["shape"]), w["offset"])
        weights.append(raw.astype(dt).reshape(w["shape"]))
    return header, body[module["offset"] :], weights


# What a damaged zip raises in zipfile (a changed CRC, size, offset, flag or method byte).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    EOFError,
    KeyError,
    OSError,
    struct.error,
    ValueError,
)


def _read_v3(where: str, path: Path, data: bytes):
    """A format 3 file's header, program bytes and weights (host arrays), checked."""
    first = data[_ZIP_NAME_AT : _ZIP_NAME_AT + len(_HEADER_NAME)]  # a prefix, if truncated
    ours = data.startswith(_ZIP_LOCAL) and first and _HEADER_NAME.encode().startswith(first)
    if not ours and not zipfile.is_zipfile(io.BytesIO(data)):
        raise ValueError(
            f"{where}: {path} is not a file written by funcnet.inference.export "
            f"(neither a zip holding {_HEADER_NAME} nor a file starting with "
            f"{_MAGIC!r})."
        )
    damaged = f"{where}: {path} is truncated or corrupt"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            if _HEADER_NAME not in names:
                members = None
            else:  # read() checks each member's CRC32: a changed byte is refused here
                members = {n: z.read(n) for n in (_HEADER_NAME, _PROGRAM_NAME, _WEIGHTS_NAME) if n in names}
    except _ZIP_ERRORS as e:
        raise ValueError(f"{damaged} ({type(e).__name__}: {e}). Export it again.") from e
    if members is None:
        raise ValueError(
            f"{where}: {path} is a zip but not a file written by "
            f"funcnet.inference.export: it has no {_HEADER_NAME} (it holds "
            f"{', '.join(names[:8]) or 'nothing'})."
        )
    try:
        header = json.loads(members[_HEADER_NAME].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: {path} has an unreadable {_HEADER_NAME} ({e}). Export it again.") from e
    _check_header(where, path, header, ("inputs", "outputs", "weights"))
    lost = [n for n in (_PROGRAM_NAME, _WEIGHTS_NAME) if n not in members]
    if lost:
        raise ValueError(f"{where}: {path} lacks {', '.join(lost)}: the zip was changed after export. Export it again.")
    return header, members[_PROGRAM_NAME], _v3_weights(where, path, header, members[_WEIGHTS_NAME])


def _v3_weights(where: str, path: Path, header: dict, blob: bytes) -> list:
    """The weights the header lists, in its order, from the safetensors bytes."""
    try:
        tensors = _safetensors(where).numpy.load(blob)
    except ImportError:
        raise
    except Exception as e:  # safetensors' own error type for a malformed file
        raise ValueError(f"{where}: {path}'s {_WEIGHTS_NAME} is unreadable ({e}). Export it again.") from e
    weights, wrong = [], []
    for w in header["weights"]:
        x = tensors.get(w["name"])
        if x is None or list(x.shape) != w["shape"] or x.dtype.name != w["dtype"]:
            wrong.append(w["name"])
        weights.append(x)
    if wrong or len(tensors) != len(weights):
        raise ValueError(
            f"{where}: {path}'s {_WEIGHTS_NAME} does not hold the weights its {_HEADER_NAME} "
            f"lists (missing or of another shape or dtype: {wrong[:8]}; {len(tensors)} tensors "
            f"for {len(weights)} names): the zip was changed after export. Export it again."
        )
    return weights


_EXPIRED_FLAG = "jax_export_deserialize_expired_versions"


def _expired_hint(error) -> str:
    """jax (>= 0.11) refuses exports older than its 6-month compatibility window; a flag
    of its own lets them load, at the user's risk: name it where this jax has it."""
    if "compatibility window" not in str(error) or _EXPIRED_FLAG not in jax.config.values:
        return ""
    return (
        f" The file is older than jax's compatibility window for exports: exporting "
        f"it again is the fix. To load it anyway, accepting that jax no longer "
        f"guarantees its behaviour, set jax.config.update({_EXPIRED_FLAG!r}, True) or "
        f"{_EXPIRED_FLAG.upper()}=1 before loading."
    )


class _Loaded:
    """The callable :func:`load_exported` returns."""

    def __init__(self, path: Path, header: dict, exported, weights: list):
        self.path = path
        self.header = header
        self.exported = exported
        self.input_spec = header["inputs"]
        self.output_spec = header["outputs"]
        self._weights = weights
        self._in_tree = exported.in_tree.children()[0].children()[1]  # ((weights, inputs), {})
        self._call = jax.jit(exported.call)

    def __repr__(self) -> str:
        ins = ", ".join(_spec_text(s) for s in self.input_spec)
        return f"<exported {self.header['name']}: {ins} from {self.path}>"

    def __call__(self, inputs):
        where = f"exported {self.header['name']} ({self.path.name})"
        if self._in_tree.num_nodes == 1 and isinstance(inputs, (list, tuple)):
            inputs = _as_array(where, "input", inputs)  # one input: nested lists are an array
        leaves, tree = jax.tree.flatten(inputs)
        if tree != self._in_tree:
            raise checks.ArgumentError(
                f"{where}: expected inputs structured as {self._in_tree}: "
                f"{', '.join(_label(s) + ' ' + _spec_text(s) for s in self.input_spec)}; "
                f"got {tree}."
            )
        batch, checked = None, []
        for x, spec in zip(leaves, self.input_spec):
            name = _label(spec)
            x = x if isinstance(x, jax.Array) else _as_array(where, name, x)
            shape, want = tuple(x.shape), spec["shape"]
            if len(shape) != len(want) or any(w is not None and w != d for d, w in zip(shape, want)):
                why = (
                    "Only the batch size (-1 in the exported input_spec) may vary; the other "
                    "dimensions are fixed by the exported params."
                    if None in want
                    else "The file was exported for this shape only (no -1 in its input_spec)."
                )
                raise checks.ArgumentError(
                    f"{where}: {name} must have shape {_spec_text(spec, batch)}, got shape {shape}. {why}"
                )
            for d in (d for d, w in zip(shape, want) if w is None):
                if d < 1 or (batch is not None and d != batch):
                    raise checks.ArgumentError(
                        f"{where}: {name} has shape {shape}, but its batch dimensions "
                        f"({_spec_text(spec)}) must be one size >= 1"
                        + ("" if batch is None else f", the {batch} of the inputs before it")
                        + "."
                    )
                batch = d
            want_dt = jnp.dtype(spec["dtype"])
            if x.dtype != want_dt:
                if _KIND[_kind(x.dtype)] > _KIND[_kind(want_dt)]:
                    raise checks.ArgumentError(
                        f"{where}: {name} must have dtype {want_dt.name} (the exported dtype), "
                        f"got {x.dtype}; convert it explicitly if that is what you mean."
                    )
                _check_fits(where, name, x, want_dt)
                x = x.astype(want_dt)
            checked.append(x)
        return self._call(self._weights, jax.tree.unflatten(tree, checked))


# --------------------------------------------------------------------------- #
# Helpers of export / load_exported.
# --------------------------------------------------------------------------- #

_KIND = {"b": 0, "i": 1, "f": 2, "c": 3, "?": 4}  # an input converts to a kind >= its own


def _kind(dt) -> str:
    for kind, base in (("b", jnp.bool_), ("i", jnp.integer), ("f", jnp.floating), ("c", jnp.complexfloating)):
        if jnp.issubdtype(dt, base):
            return kind
    return "?"


def _as_array(where: str, name: str, x) -> np.ndarray:
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:  # ragged nested lists
        raise checks.ArgumentError(
            f"{where}: {name} must be an array (or nested lists of one shape), got {type(x).__name__}: {e}"
        ) from e


def _check_fits(where: str, name: str, x, want: np.dtype) -> None:
    """``x.astype(want)`` keeps every value (rounding aside): ints stay in range, finite
    numbers finite. Only inputs being converted are looked at."""
    if x.size == 0 or _kind(x.dtype) == "b":
        return
    if _kind(want) == "i":
        info = np.iinfo(want)
        lo, hi = info.min, info.max
    elif _kind(want) in "fc":
        lo, hi = -float(jnp.finfo(want).max), float(jnp.finfo(want).max)
    else:
        return
    xs = [x.real, x.imag] if _kind(x.dtype) == "c" else [x]
    for part in xs:
        part = np.asarray(part)  # host values (an input on a device is fetched once)
        small, big = part.min(), part.max()
        if small >= lo and big <= hi:  # the usual case: no copy (False with a NaN or inf)
            continue
        if _kind(part.dtype) == "f":  # NaN and inf are values, converted as they are
            values = part[np.isfinite(part)]
            if values.size == 0:
                continue
            small, big = values.min(), values.max()
            if small >= lo and big <= hi:
                continue
        bad = small if small < lo else big
        at = tuple(int(i) for i in np.argwhere(part == bad)[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NumPy's overflow warning: the point made here
            becomes = np.asarray(bad).astype(want)
        raise checks.ArgumentError(
            f"{where}: {name} holds {bad} (at index {at}), which the exported dtype "
            f"{want.name} cannot hold ({want.name} holds {_num(lo)} to {_num(hi)}): converting "
            f"the {x.dtype} input to {want.name} would silently make it {becomes}. "
            + (
                "Pass values within that range (no vocabulary or class id is that large), or "
                "export with a wider input dtype (int64 needs jax_enable_x64 on)."
                if _kind(want) == "i"
                else "Scale the input into that range, or export with a wider float input dtype."
            )
        )


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _check_x64(where: str, path: Path, header: dict) -> None:
    """A file exported with jax_enable_x64 on holds 64-bit dtypes jax truncates with it off."""
    if jax.config.jax_enable_x64:
        return
    dtypes = {jnp.dtype(e["dtype"]) for e in header["inputs"] + header["weights"] + header["outputs"]}
    wide = sorted(d.name for d in dtypes if jax.dtypes.canonicalize_dtype(d) != d)
    if wide:
        raise ValueError(
            f"{where}: {path} was exported with 64-bit types ({', '.join(wide)}: "
            f"jax_enable_x64 was on), which this process would truncate to 32 bits "
            f"(jax_enable_x64 is off). Load it with jax.config.update('jax_enable_x64', True) "
            f"at startup, or export it again with jax_enable_x64 off."
        )


def _label(spec: dict) -> str:
    return f"input{spec['path']}"


def _spec_text(spec: dict, batch: Optional[int] = None) -> str:
    b = BATCH if batch is None else str(batch)
    dims = ", ".join(b if d is None else str(d) for d in spec["shape"])
    return f"({dims}{',' if len(spec['shape']) == 1 else ''}) {spec['dtype']}"


def _dim_json(d):
    """An output dimension for the header: an int, None for the batch, else its formula."""
    if not jax.export.is_symbolic_dim(d):
        return int(d)
    return None if str(d) == BATCH else str(d)


def _platforms(where: str, platforms):
    if platforms is None:
        return None
    if isinstance(platforms, str):
        platforms = (platforms,)
    if (
        not isinstance(platforms, (tuple, list))
        or not platforms
        or any(p not in _PLATFORMS for p in platforms)
        or len(set(platforms)) != len(platforms)
    ):
        hint = " ('gpu' is 'cuda' or 'rocm')" if isinstance(platforms, (tuple, list)) and "gpu" in platforms else ""
        raise checks.ArgumentError(
            f"{where}: platforms must be None (this process's backend) or distinct names "
            f"among {', '.join(map(repr, _PLATFORMS))}, e.g. ('cpu', 'cuda'), got "
            f"{platforms!r}{hint}."
        )
    return tuple(platforms)


def _weight_leaves(where: str, params, state):
    """The leaves of ``(params, state)`` as host NumPy arrays, their names (funcnet.paths of
    ``{"params": params, "state": state}``: the same leaf order) and their treedef."""
    flat, tree = jax.tree_util.tree_flatten_with_path((params, state))
    leaves, names = [], []
    for keys, x in flat:
        top = ("params", "state")[keys[0].idx]
        at = top + jax.tree_util.keystr(keys[1:])
        names.append(f"{top}/{path_str(keys[1:])}" if len(keys) > 1 else top)
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
            raise checks.ArgumentError(
                f"{where}: {at} is a {x.dtype} array; only numeric params and state can be "
                f"exported. Keep PRNG keys out of them, or store jax.random.key_data(key)."
            )
        if not hasattr(x, "dtype") and not checks.is_real(x) and not isinstance(x, bool):
            raise checks.ArgumentError(f"{where}: {at} must be an array, got {checks.got(x)}.")
        a = np.asarray(x)  # gathers a sharded array onto the host
        leaves.append(a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False))
    return leaves, names, tree


def _le_bytes(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, x.dtype.newbyteorder("<")).tobytes()


def _serialize(where: str, exported) -> bytes:
    try:
        return bytes(exported.serialize())
    except ImportError as e:
        raise ImportError(
            f"{where}: jax's serializer needs the 'flatbuffers' package: pip install flatbuffers ({e})."
        ) from e


def _funcnet_version() -> str:
    return __version__


def _check_header(where: str, path: Path, header, keys) -> None:
    """A format 3 header: ours, not newer than this funcnet, with ``keys``."""
    if (
        not isinstance(header, dict)
        or header.get("format") != "funcnet-export"
        or not isinstance(header.get("version"), int)
        or header["version"] < 3
    ):
        raise ValueError(
            f"{where}: {path}'s {_HEADER_NAME} is no funcnet export header (format 3 or later). Export it again."
        )
    if header["version"] > _FORMAT_VERSION:
        raise ValueError(
            f"{where}: {path} is export format {header['version']}, written by funcnet "
            f"{header.get('funcnet_version')}; this funcnet reads formats 1 to "
            f"{_FORMAT_VERSION}. Upgrade funcnet to load it."
        )
    missing = [k for k in ("name", "platforms") + tuple(keys) if k not in header]
    if missing:
        raise ValueError(
            f"{where}: {path}'s header lacks {', '.join(missing)}; the file was not "
            f"written by funcnet.inference.export or was changed. Export it again."
        )


def _read_header(where: str, path: Path, data: bytes):
    """The JSON header, checked (its checksum in format 2), and the bytes after it."""
    n = len(_MAGIC) + _HEADER_LEN.size
    if not data.startswith(_MAGIC):
        raise ValueError(
            f"{where}: {path} is not a file written by funcnet.inference.export (it does not start with {_MAGIC!r})."
        )
    if len(data) < n:
        raise ValueError(f"{where}: {path} is truncated ({len(data)} bytes). Export it again.")
    (size,) = _HEADER_LEN.unpack_from(data, len(_MAGIC))
    end = n + size
    if end + _HEADER_CRC.size > len(data):
        raise ValueError(
            f"{where}: {path} is {len(data)} bytes, too short for the {size}-byte "
            f"header it announces: the file is truncated or corrupt. Export it "
            f"again."
        )
    (stored,) = _HEADER_CRC.unpack_from(data, end)
    intact = zlib.crc32(data[:end]) == stored
    corrupt = (
        f"{where}: {path} is corrupt: its header's checksum does not match (a byte of "
        f"the header or its length was changed). Export it again."
    )
    try:
        header = json.loads(data[n:end].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            corrupt if not intact else f"{where}: {path} has an unreadable header ({e}). Export it again."
        ) from e
    if (
        not isinstance(header, dict)
        or header.get("format") != "funcnet-export"
        or not isinstance(header.get("version"), int)
        or header["version"] < 1
        or header["version"] == 3
    ):  # format 3 files are zips: this header is not right
        raise ValueError(corrupt if not intact else f"{where}: {path} has no funcnet export header. Export it again.")
    version = header["version"]
    if version > _FORMAT_VERSION:
        raise ValueError(
            f"{where}: {path} is export format {version}, written by funcnet "
            f"{header.get('funcnet_version')}; this funcnet reads formats 1 to "
            f"{_FORMAT_VERSION}. Upgrade funcnet to load it"
            + ("." if intact else " (if this funcnet wrote it, its header is corrupt: export it again).")
        )
    if version == 1:
        # No header checksum in format 1: the body's size and checksum are still checked.
        warnings.warn(
            f"{where}: {path} is export format 1, whose header no checksum covers "
            f"(a changed byte there would go unnoticed). Export it again with this "
            f"funcnet (format {_FORMAT_VERSION}) to protect it.",
            UserWarning,
            stacklevel=4,
        )
        body = data[end:]
    elif not intact:
        raise ValueError(corrupt)
    else:
        body = data[end + _HEADER_CRC.size :]
    missing = [k for k in ("name", "platforms", "inputs", "outputs", "weights", "module", "crc32") if k not in header]
    if missing:
        raise ValueError(
            f"{where}: {path}'s header lacks {', '.join(missing)}; the file was not "
            f"written by funcnet.inference.export or was changed. Export it again."
        )
    return header, body
