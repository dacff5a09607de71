"""ONNX: a funcnet network as an ``.onnx`` model, for runtimes without JAX (onnxruntime,
TensorRT, ONNX.js, ...).

A thin wrapper over [jax2onnx](https://github.com/enpasos/jax2onnx) (``pip install
"funcnet[onnx]"``), imported only when :func:`to_onnx` runs: the network in eval mode
(``train=False``, no rng: Dropout off, BatchNorm's running statistics) with its params and
state folded into the model as initializers. What jax2onnx cannot convert is an error from
jax2onnx naming the JAX primitive; [Export for serving](../guides/export.md#onnx) lists what
is known to convert.
For a JAX-to-JAX route (bit for bit, every layer), use :func:`funcnet.inference.export`.

JAX versions: jax2onnx 0.17.1, the newest release, converts on jax 0.10 and 0.11 but not on
jax 0.12 and later, where networks holding a nested ``jax.jit`` (Dense, Conv, ... most
networks) fail inside jax2onnx: it reads ``jax._src.core.ClosedJaxpr``, which jax 0.12
removed. :func:`to_onnx` then raises a RuntimeError that says so. Export with
:func:`funcnet.inference.export` instead, or convert in an environment with ``jax<0.12``,
until a jax2onnx release supports jax 0.12.

``input_spec``, ``dtype`` and ``path`` are checked as :func:`funcnet.inference.export`
checks them (the same code).
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from funcnet import _checks as checks
from funcnet._export_args import InputSpec, check_dtype, dest_path, input_specs
from funcnet.core import Layer, PyTree, as_layer
from funcnet.fileio import atomic_write

__all__ = ["to_onnx"]

_WHERE = "funcnet.onnx.to_onnx"


def _jax2onnx():
    try:
        import jax2onnx
    except ImportError:
        raise ImportError(
            f"{_WHERE} needs the jax2onnx package (and onnxruntime to run the model), which is "
            f'not installed. Install them with pip install "funcnet[onnx]" (or pip install '
            f"jax2onnx onnxruntime)."
        ) from None
    return jax2onnx


def to_onnx(
    layer: Layer,
    params: PyTree,
    state: PyTree,
    input_spec: InputSpec,
    path: Optional[str | os.PathLike] = None,
    *,
    dtype: DTypeLike = jnp.float32,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    opset: Optional[int] = None,
) -> Any:
    """The eval-mode network, params and state included, as an ONNX model.

    ``model(x) = layer.apply(params, state, x, rng=None, train=False)[0]`` (PyTorch's
    ``torch.onnx.export`` of ``model.eval()``), converted by ``jax2onnx.to_onnx``: params
    and state become the model's initializers, a ``-1`` in ``input_spec`` a symbolic
    ``batch`` dimension. Run it with onnxruntime:

    ```python
    import onnxruntime
    session = onnxruntime.InferenceSession("model.onnx")
    logits = session.run(None, {"input": x})[0]
    ```

    Args:
      layer: the network (a :class:`funcnet.Layer`).
      params: its params.
      state: its state (``()`` for a stateless network).
      input_spec: as :func:`funcnet.inference.export`'s: ``(-1, 784)`` (``-1``: the batch),
        a ``jax.ShapeDtypeStruct`` for another dtype (``jax.ShapeDtypeStruct((-1, 64),
        jnp.int32)`` for token ids), or a tuple/list of those for a network that takes a
        tuple of inputs (dicts are not supported: ONNX inputs are positional).
      path: where to write the ``.onnx`` file (atomically), or None to write nothing.
      dtype: the dtype of inputs given as plain shapes (default float32).
      input_names: the ONNX inputs' names; default ``input`` (one input) or ``input_0``,
        ``input_1``, ... (several).
      output_names: the ONNX outputs' names; default ``output`` for one output.
      opset: the ONNX opset; None for jax2onnx's default.

    Returns:
      The ``onnx.ModelProto``.

    Raises:
      ImportError: jax2onnx is not installed (``pip install "funcnet[onnx]"``).
      ArgumentError: a malformed ``input_spec`` (or a dict), ``dtype`` or names.
      FileNotFoundError: ``path``'s directory does not exist.
      RuntimeError: jax2onnx failed inside its own code on this jax (jax2onnx 0.17.1 on
        jax >= 0.12); the message names both versions and the way out.
      Exception: jax2onnx's own error for a JAX primitive it cannot convert.

    Examples:
      ```python
      from funcnet.layers import Dense
      net = Dense(2)
      _, params, state = net.init(jax.random.key(0), (-1, 3))
      to_onnx(net, params, state, (-1, 3), "dense.onnx")
      ```
    """
    layer = as_layer(layer, _WHERE)
    if isinstance(input_spec, dict):
        raise checks.ArgumentError(
            f"{_WHERE}: input_spec must be one input's shape or a tuple/list of them (ONNX "
            f"inputs are positional), got a dict with keys {sorted(input_spec)}; wrap the "
            f"layer to take a tuple instead."
        )
    _, structs = input_specs(_WHERE, input_spec, check_dtype(_WHERE, "dtype", dtype))
    several = isinstance(structs, (tuple, list))
    structs = list(structs) if several else [structs]
    if any(not isinstance(s, jax.ShapeDtypeStruct) for s in structs):
        raise checks.ArgumentError(
            f"{_WHERE}: input_spec must be flat: one shape, or a tuple/list of shapes, got {input_spec!r}."
        )
    if input_names is None:
        input_names = [f"input_{i}" for i in range(len(structs))] if several else ["input"]
    if len(input_names) != len(structs) or not all(isinstance(n, str) for n in input_names):
        raise checks.ArgumentError(
            f"{_WHERE}: input_names must be {len(structs)} strings (one per input), got {input_names!r}."
        )
    dest = None if path is None else dest_path(_WHERE, path)
    j2o = _jax2onnx()

    def model(*inputs):
        x = type(input_spec)(inputs) if several else inputs[0]
        return layer.apply(params, state, x, rng=None, train=False)[0]

    out = jax.eval_shape(model, *structs) if output_names is None else None
    if output_names is None and isinstance(out, jax.ShapeDtypeStruct):
        output_names = ["output"]
    kwargs = {} if opset is None else {"opset": opset}
    try:
        proto = j2o.to_onnx(
            model,
            structs,
            model_name=layer.name,
            input_names=list(input_names),
            output_names=None if output_names is None else list(output_names),
            **kwargs,
        )
    except AttributeError as e:  # jax2onnx reads jax internals that move between versions
        raise RuntimeError(_incompatible(layer.name, _version(j2o), e)) from e
    if dest is not None:
        with atomic_write(dest) as (f, _):
            f.write(proto.SerializeToString())
    return proto


def _incompatible(name: str, j2o_version: str, error: AttributeError) -> str:
    """What to tell when jax2onnx fails inside its own code: a jax it does not support."""
    return (
        f"{_WHERE}: jax2onnx {j2o_version} cannot convert {name} on jax {jax.__version__}: "
        f"it failed inside its own code ({type(error).__name__}: {error}). jax2onnx 0.17.1 "
        f"(the newest release) supports jax 0.10 and 0.11, not jax 0.12 or later: it reads "
        f"jax._src.core.ClosedJaxpr, which jax 0.12 removed, so every network with a nested "
        f"jax.jit (Dense, Conv, ...) fails there. Export with funcnet.inference.export instead "
        f"(StableHLO, served with jax alone), or convert in an environment with jax<0.12 "
        f'(pip install "jax<0.12" "jaxlib<0.12"), or upgrade jax2onnx once a release '
        f"supports this jax."
    )


def _version(module: Any) -> str:
    from importlib import metadata

    try:
        return metadata.version(module.__name__)
    except metadata.PackageNotFoundError:
        return "(version unknown)"
