"""safetensors files: funcnet's params and state in the format Hugging Face and most model
hubs ship, and such files' tensors read for `load_torch_state_dict`.

The file format is the `safetensors` package's (Hugging Face's; `pip install
"funcnet[safetensors]"`), imported only when one of these functions runs, so funcnet
itself does not need it. funcnet's tensor names are its parameter paths
(`funcnet.paths`) under `params/` and `state/`:

```
params/0/W, params/0/b, params/1/scale, params/1/bias, state/1/mean, state/1/var
```

which is `funcnet.paths({"params": params, "state": state})`: the same names the
npz checkpoints and every path-keyed funcnet function use, one namespace for both
trees as a torch `state_dict` holds parameters and buffers. Arrays are written
bit for bit in their own dtype (float32, float64, bfloat16, float16, ints, uints,
bool, complex64); a typed PRNG key is written as its key data (uint32).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from funcnet._version import __version__
from funcnet.core import PyTree
from funcnet.errors import ArgumentError, CheckpointMismatchError
from funcnet.fileio import atomic_write
from funcnet.params import path_str, paths

__all__ = ["save_safetensors", "load_safetensors", "read_safetensors"]

# A file must be readable by the loader that wrote it: safetensors' NumPy reader names
# dtypes through numpy (bfloat16 through ml_dtypes), which has no float8 (nor int4).
_UNREADABLE = ("float8", "int4", "uint4", "float4")
_SHOWN = 8  # entries of each kind an error lists before "... and N more"


def _safetensors(where: str):
    try:
        import safetensors.numpy  # noqa: F401  (the package's NumPy reader and writer)
    except ImportError:
        raise ImportError(
            f"{where} needs the safetensors package, which is not installed. Install it "
            f'with pip install "funcnet[safetensors]" (or pip install safetensors).'
        ) from None
    import safetensors

    return safetensors


def _is_key(x) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _named(params, state) -> Dict[str, Any]:
    tree = {"params": params} if state is None else {"params": params, "state": state}
    return paths(tree)


def _host(name: str, x) -> np.ndarray:
    """``x`` as a contiguous NumPy array of its own dtype, or an error naming it."""
    if _is_key(x):
        x = jax.random.key_data(x)
    arr = np.asarray(x)
    arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # keeps 0-d arrays 0-d
    if arr.dtype == object or any(arr.dtype.name.startswith(p) for p in _UNREADABLE):
        raise ArgumentError(
            f"save_safetensors: {name!r} has dtype {arr.dtype}, which safetensors' NumPy "
            f"reader cannot read back. Cast it first (e.g. to bfloat16 or float32), or keep "
            f"it out of the saved trees."
        )
    return arr


def save_safetensors(
    path: str | os.PathLike,
    params: PyTree,
    state: Optional[PyTree] = None,
    *,
    metadata: Optional[Mapping[str, str]] = None,
) -> None:
    """Write ``params`` (and ``state``) to one ``.safetensors`` file.

    Tensor names are funcnet's paths: ``params/<path>`` and ``state/<path>``, i.e.
    ``funcnet.paths({"params": params, "state": state})``; each array keeps its dtype and
    its bytes, so `load_safetensors` gives back bit-identical arrays. The file is what
    ``safetensors.numpy.save_file`` writes, so any safetensors reader (PyTorch's, Flax's,
    Rust's) opens it.

    Args:
      path: the file to write (a ``.safetensors`` name by convention); replaced if it exists.
      params: a params pytree, e.g. from ``layer.init``.
      state: the layer state to store with it (BatchNorm's running statistics, ...);
        ``None`` stores the params alone.
      metadata: text entries for the file's header (``str`` to ``str``), e.g.
        ``{"model": "gpt-small"}``; funcnet adds ``funcnet.version``. Read them back with
        ``safetensors.safe_open(path, "np").metadata()``.

    Raises:
      ArgumentError: a ``metadata`` key or value that is not a ``str``; an array whose
        dtype the safetensors NumPy reader cannot read back (float8, int4).
      ImportError: safetensors is not installed.

    Examples:
      >>> import os, tempfile
      >>> from funcnet.layers import BatchNorm, Dense
      >>> net = funcnet.serial(Dense(3), BatchNorm())
      >>> _, params, state = net.init(jax.random.key(0), (-1, 2))
      >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
      >>> save_safetensors(path, params, state)
      >>> sorted(read_safetensors(path))
      ['params/0/W', 'params/0/b', 'params/1/bias', 'params/1/scale', 'state/1/mean', 'state/1/var']
    """
    st = _safetensors("save_safetensors")
    header = {"funcnet.version": __version__}
    for k, v in dict(metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ArgumentError(
                f"save_safetensors: metadata must map str to str (the safetensors header "
                f"holds text only), got {k!r}: {v!r} ({type(v).__name__}). Convert the "
                f"value, e.g. str(value) or json.dumps(value)."
            )
        header[k] = v
    tensors = {name: _host(name, x) for name, x in _named(params, state).items()}
    # Written under a temporary name and renamed: a crash mid-write leaves any earlier
    # file whole. safetensors writes the temporary file by name (no copy in memory).
    with atomic_write(path, suffix=".safetensors.tmp") as (_, tmp):
        st.numpy.save_file(tensors, tmp, metadata=header)


def read_safetensors(path: str | os.PathLike) -> Dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file, by name, as NumPy arrays (bfloat16 as
    ``ml_dtypes.bfloat16``).

    Any safetensors file: funcnet's (names ``params/...``, ``state/...``) or a Hugging
    Face one written from a PyTorch model (names = the ``state_dict``'s keys), which
    `load_torch_state_dict` maps into a funcnet network with torch's layouts:

    ```python
    params, state = load_torch_state_dict(params, state, read_safetensors("model.safetensors"))
    ```

    Args:
      path: the ``.safetensors`` file.

    Returns:
      A dict from tensor name to array.

    Raises:
      FileNotFoundError: no such file.
      ImportError: safetensors is not installed.
      ArgumentError: a tensor in a dtype NumPy cannot hold (float8), named.

    Examples:
      >>> import os, tempfile
      >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
      >>> save_safetensors(path, {"W": jnp.ones((2, 3), jnp.bfloat16)})
      >>> read_safetensors(path)["params/W"].dtype
      dtype(bfloat16)
    """
    st = _safetensors("read_safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"read_safetensors: no file {os.fspath(path)!r}.")
    out = {}
    with st.safe_open(os.fspath(path), framework="np") as f:
        for name in f.keys():
            try:
                out[name] = f.get_tensor(name)
            except (AttributeError, TypeError) as e:  # numpy lacks the dtype's name
                raise ArgumentError(
                    f"read_safetensors: {os.fspath(path)!r}'s tensor {name!r} has a dtype "
                    f"NumPy cannot hold ({e}); funcnet reads float64/32/16, bfloat16, ints, "
                    f"uints, bool and complex64. Convert the file's tensors first (e.g. with "
                    f"safetensors.torch and tensor.to(torch.bfloat16))."
                ) from None
    return out


def load_safetensors(path: str | os.PathLike, params: PyTree, state: Optional[PyTree] = None) -> Tuple[Any, Any]:
    """``(params, state)`` from a file `save_safetensors` wrote, in the trees given.

    ``params`` (and ``state``) are the trees to fill, e.g. a fresh ``layer.init``'s: the
    file must hold exactly their paths, each with their shape and dtype (nothing is
    cast: a bfloat16 file into float32 params is an error, not a silent conversion).
    Every missing, unexpected and mismatched name is reported in one error. A Hugging
    Face file of a PyTorch model has torch's names: load that with
    ``load_torch_state_dict(params, state, read_safetensors(path))``.

    Args:
      path: the ``.safetensors`` file.
      params: the params tree to load into (its structure, shapes and dtypes).
      state: the state tree, when the file holds one (``save_safetensors(path, params,
        state)``); ``None`` when it holds params alone.

    Returns:
      ``(params, state)``: new trees, jax arrays where the given trees hold jax arrays
      and NumPy arrays elsewhere (``state`` is ``None`` when not given).

    Raises:
      CheckpointMismatchError: the file does not fit the trees; the message lists the
        missing names, the unexpected ones and each shape or dtype that differs (also on
        the error as ``.missing``, ``.unexpected`` and ``.mismatched``, lists).
      FileNotFoundError, ImportError: as `read_safetensors`.

    Examples:
      >>> import os, tempfile
      >>> from funcnet.layers import BatchNorm, Dense
      >>> net = funcnet.serial(Dense(3), BatchNorm())
      >>> _, params, state = net.init(jax.random.key(0), (-1, 2))
      >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
      >>> save_safetensors(path, params, state)
      >>> _, fresh_p, fresh_s = net.init(jax.random.key(1), (-1, 2))
      >>> loaded_p, loaded_s = load_safetensors(path, fresh_p, fresh_s)
      >>> bool((loaded_p[0]["W"] == params[0]["W"]).all())
      True
      >>> try:
      ...     load_safetensors(path, funcnet.serial(Dense(4)).init(jax.random.key(0), (-1, 2))[1])
      ... except CheckpointMismatchError as e:
      ...     print(e.missing, e.unexpected, e.mismatched)
      [] ['params/1/bias', 'params/1/scale', 'state/1/mean', 'state/1/var'] ['params/0/W: ...', ...]
    """
    tensors = read_safetensors(path)
    like = _named(params, state)
    missing = [n for n in like if n not in tensors]
    unexpected = sorted(n for n in tensors if n not in like)
    mismatched = [
        f"{n}: {_describe(tensors[n])} in the file, {_describe(x, True)} in the {n.split('/', 1)[0]}"
        for n, x in like.items()
        if n in tensors and _describe(tensors[n]) != _describe(x, True)
    ]
    if missing or unexpected or mismatched:
        raise _mismatch(path, tensors, missing, unexpected, mismatched, state is None)

    def one(key_path, x):
        value = tensors[path_str(key_path)]
        if _is_key(x):
            return jax.random.wrap_key_data(jnp.asarray(value), impl=jax.random.key_impl(x))
        # a NumPy leaf stays NumPy: jnp would turn float64 into float32 where x64 is off
        return jnp.asarray(value) if isinstance(x, jax.Array) else np.array(value)

    loaded = jax.tree_util.tree_map_with_path(
        one, {"params": params} if state is None else {"params": params, "state": state}
    )
    return loaded["params"], loaded.get("state")


def _describe(x, like: bool = False) -> str:
    """``float32[3, 2]``: what a tensor (or, ``like``, a tree's leaf) holds."""
    if like and _is_key(x):
        x = jax.random.key_data(x)
    dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
    return f"{np.dtype(dtype).name}{list(np.shape(x))}"


def _listed(names: List[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f", ... and {more} more" if more > 0 else "")


def _mismatch(path, tensors, missing, unexpected, mismatched, no_state: bool) -> CheckpointMismatchError:
    parts = (
        ([f"missing from the file: {_listed(missing)}"] if missing else [])
        + ([f"in the file but not in the trees: {_listed(unexpected)}"] if unexpected else [])
        + ([f"shape or dtype differs: {_listed(mismatched)}"] if mismatched else [])
    )
    hints = []
    if not any(n.startswith(("params/", "state/")) for n in tensors):
        hints.append(
            "The file's names are not funcnet's (params/..., state/...): for a "
            "PyTorch model's file (Hugging Face's), use load_torch_state_dict(params, "
            "state, read_safetensors(path))."
        )
    else:
        if no_state and any(n.startswith("state/") for n in unexpected):
            hints.append("The file holds a state: pass it too, load_safetensors(path, params, state).")
        stateless_file = not any(n.startswith("state/") for n in tensors)
        if not no_state and stateless_file and any(n.startswith("state/") for n in missing):
            hints.append(
                "The file holds no state (saved as save_safetensors(path, params)): "
                "load it with load_safetensors(path, params)."
            )
            missing_params = [n for n in missing if n.startswith("params/")]
        else:
            missing_params = missing
        if missing_params or mismatched or any(n.startswith("params/") for n in unexpected):
            hints.append(
                "Load into the trees of the network that was saved (same layers, "
                "sizes and dtypes: cast with jax.tree.map(lambda x: x.astype(...), "
                "params) where only the dtype differs)."
            )
    hint = " ".join(hints)
    error = CheckpointMismatchError(
        f"load_safetensors: {os.fspath(path)!r} does not fit the params/state given: " + "; ".join(parts) + ". " + hint
    )
    error.missing, error.unexpected, error.mismatched = missing, unexpected, mismatched
    return error
