"""Weights from PyTorch: a ``state_dict`` loaded into funcnet's params and layer state.

:func:`load_torch_state_dict` pairs funcnet's layers with torch's modules by order and
checks every shape. funcnet's side is read in the order of its params tree
(:func:`funcnet.paths`: for a positional ``serial`` that is the layer order; a dict of
named layers is in sorted-name order), one *unit* per layer that has params. torch's
side is the ``state_dict``'s modules in their order (a module's entries share the key
prefix before the last ``.``; an ``nn.MultiheadAttention``'s ``out_proj`` belongs to it).
Each pair is converted with the layouts of the porting guide's PyTorch section:

| funcnet unit | torch module entries | conversion |
|---|---|---|
| Dense ``W, b`` | Linear ``weight (out, in), bias`` | ``W = weight.T`` |
| Conv ``W (kh, kw, in, out), b`` | Conv2d ``weight (out, in, kh, kw)`` (1-D alike) | ``permute(2, 3, 1, 0)`` |
| the same | ConvTranspose2d ``weight (in, out, kh, kw)`` | ``permute(2, 3, 0, 1)`` |
| Embedding ``E`` | Embedding ``weight`` | as is |
| BatchNorm | ``weight, bias, running_mean, running_var`` | ``scale, bias``; state ``mean, var`` |
| the same, ``momentum=None`` | and ``num_batches_tracked`` | and the state's count |
| LayerNorm, GroupNorm, RMSNorm | ``weight, bias`` (RMSNorm: ``weight``) | as is |
| RNN/LSTM/GRU | ``weight_ih_l0 ...``, every layer and direction | transposed |
| LSTM ``proj_size`` | and ``weight_hr_l0 ...`` | transposed |
| MultiHeadAttention | ``in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias`` | split in three, transposed |
| the same, kdim/vdim != E | ``q/k/v_proj_weight`` for ``in_proj_weight`` | each transposed |
| the same, ``add_bias_kv`` | and ``bias_k, bias_v`` | reshaped to ``(E,)`` |

A ``Conv`` kernel matches a Conv's or a ConvTranspose's layout; which one is read from
the shapes, and where both fit (``in == out``) it is a plain convolution unless its
path is in ``conv_transpose``. Missing or unexpected entries are named, as torch's
``load_state_dict(strict=True)`` does. Flattening differs: funcnet's images are NHWC,
so a ``Flatten`` before a ``Dense`` orders features as ``(h, w, c)``, torch's as
``(c, h, w)``: permute that Dense's rows yourself (or pool globally first).
``state_dict`` may hold torch tensors or NumPy arrays, so torch need not be installed.
bfloat16 (and float8) tensors, which NumPy cannot hold, are read through float32,
which holds their values exactly, then cast to the params' dtypes.

safetensors files (Hugging Face's format; `pip install "funcnet[safetensors]"`):
`save_safetensors`/`load_safetensors` write and read funcnet's params and state under
their `funcnet.paths` names (`params/0/W`, `state/1/mean`), bit for bit;
`read_safetensors` gives any file's tensors, e.g. a PyTorch model's for
`load_torch_state_dict(params, state, read_safetensors(path))`.

Flax (Linen, NNX), Haiku and Equinox weights: `load_flax_params`, `load_haiku_params` and
`load_equinox_params` lay each module out as its torch counterpart and load it through
`load_torch_state_dict` (the same pairing by order and checks; Flax and Haiku trees are
sorted by name, so they take the layer order as `order=`).
"""

# The loaders live in private modules, one per source; this module is their one import path.
from funcnet.errors import StateDictMismatchError
from funcnet._torch_state_dict import load_torch_state_dict

# safetensors files (funcnet's own names, or a PyTorch model's from Hugging Face)
from funcnet._safetensors import load_safetensors, read_safetensors, save_safetensors

# Flax, Haiku and Equinox trees: renamed to torch's layouts, then through the state_dict loader
from funcnet._jax_frameworks import load_equinox_params, load_flax_params, load_haiku_params

__all__ = [
    "load_torch_state_dict",
    "StateDictMismatchError",
    "save_safetensors",
    "load_safetensors",
    "read_safetensors",
    "load_flax_params",
    "load_haiku_params",
    "load_equinox_params",
]
