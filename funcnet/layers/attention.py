"""Multi-head attention, its masks, and the key/value cache used for decoding.

Layouts: sequences are ``(batch, time, features)``; inside the layer, heads are
``(batch, time, heads, head_dim)``, the layout of :func:`jax.nn.dot_product_attention`.

Masks are boolean and ``True`` means *may attend*, as in ``jax.nn.dot_product_attention``
and Flax. PyTorch's boolean masks mean the opposite (``True`` = masked out): pass
``~torch_mask`` (see [the porting guide](../../porting.md#pytorch-attention-and-transformers)).
An additive float mask goes in ``bias=``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from funcnet import _checks as checks
from funcnet import initializers
from funcnet import _mesh
from funcnet.core import Layer, check_known, check_shape, named, need_rng, need_state
from funcnet.initializers import Initializer
from funcnet.layers.dense import linear
from funcnet.layers.position import rope as _rope

__all__ = ["MultiHeadAttention", "dot_product_attention", "causal_mask", "padding_mask", "cache_lengths"]

_IMPLEMENTATIONS = (None, "xla", "cudnn", "reference")
_CACHE_KEYS = ("key", "value", "index")


def causal_mask(q_len: int, k_len: Optional[int] = None, *, offset: int = 0) -> jax.Array:
    """Boolean ``(q_len, k_len)``: query ``i`` may attend to key ``j`` iff ``j <= i + offset``.

    ``offset`` is the position of the first query among the keys (``k_len - q_len``
    when the queries are the last ``q_len`` keys, as in decoding with a cache).
    ``causal_mask(T)`` is the complement of torch's
    ``nn.Transformer.generate_square_subsequent_mask(T)``. Broadcasts against
    ``(batch, heads, q_len, k_len)``.

    Args:
      q_len: the number of queries, a positive int.
      k_len: the number of keys, a positive int; None for ``q_len``.
      offset: the position of the first query among the keys, an int (0 when the
        queries and keys line up).

    Returns:
      A boolean array of shape ``(q_len, k_len)``, True where the query may attend.

    Raises:
      ArgumentError: ``q_len`` or ``k_len`` not a positive int, or ``offset`` not an int.

    Examples:
      >>> causal_mask(3).astype(int).tolist()
      [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    q_len = checks.positive_int("causal_mask", "q_len", q_len)
    k_len = q_len if k_len is None else checks.positive_int("causal_mask", "k_len", k_len)
    offset = checks.integer("causal_mask", "offset", offset)
    return jnp.arange(k_len)[None, :] <= jnp.arange(q_len)[:, None] + offset


def padding_mask(valid: ArrayLike) -> jax.Array:
    """``(batch, k_len)`` booleans (``True`` = a real token) -> a ``(batch, 1, 1, k_len)`` mask.

    torch's ``key_padding_mask`` is ``True`` at *padding*: pass ``padding_mask(~kpm)``.
    Combine with a causal mask by ``&``: ``padding_mask(v) & causal_mask(T)``.

    Args:
      valid: booleans of shape ``(batch, k_len)``, True at real tokens, False at padding.

    Returns:
      The mask, booleans of shape ``(batch, 1, 1, k_len)`` (True = may attend), which
      broadcasts against ``(batch, heads, q_len, k_len)``.

    Raises:
      TypeError: ``valid`` is not boolean or not of rank 2.

    Examples:
      >>> padding_mask(jnp.array([[True, True, False]])).shape
      (1, 1, 1, 3)
    """
    valid = jnp.asarray(valid)
    if valid.dtype != jnp.bool_ or valid.ndim != 2:
        raise TypeError(
            f"padding_mask: expected booleans of shape (batch, k_len) with True at "
            f"real tokens, got {valid.dtype} of shape {tuple(valid.shape)}. From "
            f"lengths: jnp.arange(k_len)[None, :] < lengths[:, None]."
        )
    return valid[:, None, None, :]


def _check_mask(where: str, mask, target: tuple, what: str = "mask"):
    """A boolean mask broadcastable to ``(batch, heads, q_len, k_len)``, as rank 4."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if what == "mask" and mask.dtype != jnp.bool_:
        raise TypeError(
            f"{where}: mask must be boolean with True = may attend (the "
            f"convention of jax.nn.dot_product_attention and Flax), got dtype "
            f"{mask.dtype}. An additive float mask (torch's float attn_mask) goes in "
            f"bias=; a torch boolean mask (True = masked out) is ~mask here."
        )
    if what == "bias" and not jnp.issubdtype(mask.dtype, jnp.floating):
        raise TypeError(
            f"{where}: bias must be a float array added to the attention logits, "
            f"got dtype {mask.dtype}. A boolean mask goes in mask=."
        )
    shape = tuple(mask.shape)
    try:
        if len(shape) > 4:
            raise ValueError
        np.broadcast_shapes(shape, target)
    except ValueError:
        raise ValueError(
            f"{where}: {what} of shape {shape} cannot broadcast to (batch, heads, "
            f"q_len, k_len) = {target}. Use (q_len, k_len) for one mask for all, "
            f"(batch, 1, 1, k_len) for padding (funcnet.layers.padding_mask), or "
            f"(batch, heads, q_len, k_len)."
        ) from None
    return mask.reshape((1,) * (4 - len(shape)) + shape)


def dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    *,
    mask: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    causal: bool = False,
    dropout: float = 0.0,
    rng: Optional[jax.Array] = None,
    train: bool = False,
    implementation: Optional[str] = None,
    scale: Optional[float] = None,
) -> jax.Array:
    """``softmax(q k^T * scale + bias, masked) v`` per head, on ``(B, T, H, D)`` arrays.

    The values may have their own head size ``Dv`` (``(B, S, H, Dv)``), as in
    ``torch.nn.functional.scaled_dot_product_attention``; the output has it too.
    Grouped-query attention: keys and values may have fewer heads ``Hk`` than the
    queries' ``H`` (``Hk`` dividing ``H``); each key/value head then serves ``H // Hk``
    consecutive query heads (query head ``h`` uses key/value head ``h // (H // Hk)``),
    as torch's ``scaled_dot_product_attention(..., enable_gqa=True)`` (its
    ``repeat_interleave``) and ``jax.nn.dot_product_attention``; torch needs the flag,
    here the shapes say it.
    ``scale`` defaults to ``1/sqrt(D)``, from the queries' head size. ``mask`` is
    boolean, True = may attend, broadcastable to ``(B, H, T, S)``; ``causal`` adds
    :func:`causal_mask`.
    Dropout on the attention weights (``train=True``, ``dropout > 0``, an ``rng``)
    scales the kept weights by ``1/(1 - dropout)``, as torch.

    ``implementation``: None picks :func:`jax.nn.dot_product_attention` (XLA's or
    cuDNN's fused kernel, which it chooses) on GPU and TPU when no dropout is applied
    and the inputs are not float64, and the written-out path otherwise: jax's path
    computes the softmax in float32 even for float64 inputs, and on CPU the
    written-out one, with the heads folded into the batch axis, is faster (measured
    on 2 CPU cores, forward and backward of a (12, 64, 4, 32) causal attention:
    1.5 ms against jax's 3.9 ms).
    jax's needs ``Dv == D``: other value head sizes take the written-out path.
    ``"xla"``/``"cudnn"`` force jax's; ``"reference"`` forces the written-out path,
    which computes the softmax in the inputs' precision, at least float32. Both give
    a row whose keys are all masked the mean of the values (jax's convention; torch
    gives NaN there).

    Args:
      query: ``(B, T, H, D)``.
      key: ``(B, S, Hk, D)``; ``Hk`` is ``H`` or divides it (grouped-query attention).
      value: ``(B, S, Hk, Dv)``; ``Dv`` may differ from ``D``.
      mask: booleans broadcastable to ``(B, H, T, S)``, True = may attend, or None.
      bias: floats broadcastable to ``(B, H, T, S)``, added to the logits, or None.
      causal: each query attends to the keys up to its own position, the last
        query lined up with the last key: ``causal_mask(T, S, offset=S - T)``, what a
        key/value cache needs. torch's ``is_causal=True`` lines up the *first* ones
        (the same when ``S == T``): with ``S != T`` it is ``mask=causal_mask(T, S)``
        here, and this ``causal=True`` is torch's ``attn_mask=torch.ones(T, S,
        dtype=torch.bool).tril(S - T)`` (see
        [the porting guide](../../porting.md#pytorch-attention-and-transformers)).
      dropout: the dropout rate on the attention weights, applied only with
        ``train=True`` and ``dropout > 0``.
      rng: the PRNG key of that dropout (needed only when it applies).
      train: apply the dropout (inference leaves the weights as they are).
      implementation: None, ``"xla"``, ``"cudnn"`` or ``"reference"`` (above).
      scale: the factor of the logits, default ``1/sqrt(D)``.

    Returns:
      ``(B, T, H, Dv)``: each head's weighted sum of the values.

    Raises:
      ValueError: an unknown ``implementation``; a mask or bias that does not
        broadcast to ``(B, H, T, S)``; keys and values with different numbers of heads,
        or a number that does not divide ``H``; dropout, or ``Dv != D``, with a forced
        jax implementation.
      TypeError: a non-boolean ``mask`` or a boolean ``bias``.

    Examples:
      >>> q = jnp.ones((1, 3, 2, 4))  # (batch, time, heads, head_dim)
      >>> dot_product_attention(q, q, q, causal=True).shape
      (1, 3, 2, 4)
      >>> v = jnp.arange(3.0).reshape(1, 3, 1, 1)
      >>> qk = jnp.zeros((1, 3, 1, 1))  # equal logits: the mean of the visible values
      >>> dot_product_attention(qk, qk, v, causal=True)[0, :, 0, 0].tolist()
      [0.0, 0.5, 1.0]
    """
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(
            f"dot_product_attention: implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}."
        )
    B, T, H, D = query.shape
    S = key.shape[1]
    _check_kv_heads("dot_product_attention", query.shape, key.shape, value.shape)
    target = (B, H, T, S)
    mask = _check_mask("dot_product_attention", mask, target)
    bias = _check_mask("dot_product_attention", bias, target, "bias")
    drop = train and dropout > 0.0
    # jax's path computes the softmax in float32 whatever the inputs: float64 stays float64
    # only on the written-out path
    wide = jnp.result_type(query, key, value) == jnp.float64
    on_cpu = jax.default_backend() == "cpu"
    own_dv = value.shape[-1] != D  # jax's checks value against key's shape
    if own_dv and implementation in ("xla", "cudnn"):
        raise ValueError(
            f"dot_product_attention: implementation={implementation!r} needs "
            f"the values' head size to equal the queries' and keys' ({D}), got "
            f"{value.shape[-1]}. Leave implementation=None (or 'reference') for "
            f"a value head size of its own."
        )
    if implementation == "reference" or (implementation is None and (drop or wide or on_cpu or own_dv)):
        return _reference_attention(query, key, value, mask, bias, causal, scale, dropout if drop else 0.0, rng)
    if drop:
        raise ValueError(
            f"dot_product_attention: dropout on the attention weights needs the "
            f"reference path; implementation={implementation!r} has none. Leave "
            f"implementation=None."
        )
    if causal and T != S:
        # jax's is_causal aligns the first query with the first key; we align the last ones.
        cm = causal_mask(T, S, offset=S - T)[None, None]
        mask = cm if mask is None else mask & cm
        causal = False
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale, is_causal=causal, implementation=implementation
    )


def _check_kv_heads(where, q_shape, k_shape, v_shape):
    """Keys and values share a number of heads that divides the queries' (at trace time)."""
    H, Hk, Hv = q_shape[2], k_shape[2], v_shape[2]
    if Hk != Hv:
        raise ValueError(
            f"{where}: keys and values need the same number of heads, got keys "
            f"of shape {tuple(k_shape)} ({Hk} heads) and values of shape "
            f"{tuple(v_shape)} ({Hv} heads), in the layout (B, S, heads, dim)."
        )
    if H % Hk:
        raise ValueError(
            f"{where}: grouped-query attention needs the number of query heads "
            f"to be a multiple of the key/value heads (each key/value head "
            f"serves H // Hk query heads), got {H} query heads and {Hk} "
            f"key/value heads. Use a number of key/value heads dividing {H}."
        )


def _reference_attention(q, k, v, mask, bias, causal, scale, dropout, rng, need_weights=False):
    """The written-out attention; with ``need_weights`` also its weights ``(B, H, T, S)``
    (after dropout, the ones that multiplied the values, as torch returns them)."""
    B, T, H, D = q.shape
    S = k.shape[1]
    if k.shape[2] != H:
        # grouped-query: key/value head h serves query heads h*G ... h*G + G - 1 (torch's
        # repeat_interleave); the repeats' gradients sum back into their head
        k, v = (jnp.repeat(x, H // k.shape[2], axis=2) for x in (k, v))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    # heads folded into the batch: XLA:CPU runs (and differentiates) a product with one
    # batch axis 2-3x faster than one with two, (batch, heads). Not for arrays split over
    # a mesh's axes (batch over data, heads over model): folding would merge two splits.
    if _is_split(q):
        heads = lambda x: x.transpose(0, 2, 1, 3)
        per_head = lambda m: m
        unfold = lambda out: out.transpose(0, 2, 1, 3)
        ts, tsd = "bhtd,bhsd->bhts", "bhts,bhsd->bhtd"
    else:
        heads = lambda x: x.transpose(0, 2, 1, 3).reshape(B * H, x.shape[1], x.shape[3])
        per_head = lambda m: jnp.broadcast_to(m, (B, H, T, S)).reshape(B * H, T, S)
        unfold = lambda out: out.reshape(B, H, T, v.shape[3]).transpose(0, 2, 1, 3)
        ts, tsd = "ntd,nsd->nts", "nts,nsd->ntd"
    logits = jnp.einsum(ts, heads(q), heads(k), preferred_element_type=dtype)
    logits = logits * jnp.asarray(scale, dtype)
    if bias is not None:
        logits = logits + per_head(bias.astype(dtype))
    if causal:
        cm = causal_mask(T, S, offset=S - T)[None, None]
        mask = cm if mask is None else mask & cm
    if mask is not None:
        # jax's large finite negative (not -inf): a fully masked row averages the values
        logits = jnp.where(per_head(mask), logits, -0.7 * jnp.finfo(dtype).max)
    weights = jax.nn.softmax(logits, axis=-1)
    if dropout > 0.0:
        keep = jax.random.bernoulli(need_rng("dot_product_attention", rng), 1.0 - dropout, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout), 0.0)
    weights = weights.astype(v.dtype)
    out = unfold(jnp.einsum(tsd, weights, heads(v)))
    return (out, weights.reshape(B, H, T, S)) if need_weights else out


def MultiHeadAttention(
    num_heads: int,
    *,
    head_dim: Optional[int] = None,
    out_dim: Optional[int] = None,
    use_bias: bool = True,
    dropout: float = 0.0,
    causal: bool = False,
    rope: bool = False,
    rope_base: float = 10000.0,
    cache_length: Optional[int] = None,
    W_init: Optional[Initializer] = None,
    b_init: Optional[Initializer] = None,
    out_W_init: Optional[Initializer] = None,
    implementation: Optional[str] = None,
    num_kv_heads: Optional[int] = None,
    add_bias_kv: bool = False,
    add_zero_attn: bool = False,
    need_weights: bool = False,
    average_attn_weights: bool = True,
) -> Layer:
    """Multi-head attention, as ``torch.nn.MultiheadAttention(batch_first=True)``.

    Inputs: ``x`` (self-attention, ``(B, T, E)``), ``(q, kv)`` or ``(q, k, v)``
    (cross-attention; ``k``/``v`` ``(B, S, kdim)``/``(B, S, vdim)``, torch's
    ``kdim``/``vdim``). With ``H = num_heads`` and ``D = head_dim`` (default
    ``E // H``):

    ```
    Q = q W_q + b_q,  K = k W_k + b_k,  V = v W_v + b_v      (split into H heads of D)
    head_h = softmax(Q_h K_h^T / sqrt(D) + mask) V_h
    y = concat_h(head_h) W_out + b_out                       (B, T, out_dim)
    ```

    ``out_dim`` defaults to ``E``. params ``{"query", "key", "value", "out"}``, each
    ``{"W": (in, out), "b": (out,)}`` like :func:`~funcnet.layers.Dense` (``use_bias=False``
    drops every ``b``). From torch: ``W_q = in_proj_weight[:E].T``,
    ``W_k = in_proj_weight[E:2E].T``, ``W_v = in_proj_weight[2E:].T`` (or
    ``q/k/v_proj_weight.T`` when kdim/vdim differ), the biases split
    ``in_proj_bias`` the same way, ``out = out_proj.weight.T, out_proj.bias``;
    [the porting guide](../../porting.md#pytorch-attention-and-transformers) has the code.

    Default init, as torch: ``W_q, W_k, W_v`` Glorot-uniform over the packed
    ``(E, 3E)`` matrix when ``kdim == vdim == E`` (torch draws ``in_proj_weight`` as
    one), each Glorot-uniform otherwise; ``W_out`` torch's Linear default; biases zero.
    ``W_init`` (q/k/v), ``out_W_init`` and ``b_init`` replace them.

    ``apply(params, state, inputs, *, rng=None, train=False, mask=None, bias=None)``:
    ``mask`` boolean, True = may attend, broadcastable to ``(B, H, T, S)`` (see
    :func:`causal_mask`, :func:`padding_mask`); ``bias`` an additive float mask.
    ``causal=True`` adds the causal mask (usable from ``serial``, where no mask can
    be passed). ``dropout`` drops attention weights when ``train=True`` (needs
    ``rng``). ``rope=True`` rotates queries and keys by their positions
    (:func:`funcnet.layers.rope`, base ``rope_base``) before the scores.
    ``implementation`` as :func:`dot_product_attention`.

    torch's options, with its semantics (tests/test_layers_attention_options_torch.py):

    * ``add_bias_kv=True``: params ``bias_k``, ``bias_v`` of shape ``(Hk * D,)``
      (torch's ``(1, 1, E)``, reshaped), drawn as torch's ``xavier_normal_`` on
      ``(1, 1, E)`` draws them, ``N(0, 1/E)``: one learned key and value appended after
      the projections (after ``rope``), visible to every query.
    * ``add_zero_attn=True``: a zero key and value appended per head after those.
      The masks are padded as torch pads its: the appended keys may be attended by
      every query (``causal`` included), so ``S`` grows by one per option.
    * ``need_weights=True``: the output is the pair ``(y, weights)``, the attention
      weights (after dropout, as torch's) averaged over heads, ``(B, T, S)``, with
      ``average_attn_weights=True``, or per head, ``(B, H, T, S)``. It takes the
      written-out path of :func:`dot_product_attention`. torch's default is
      ``need_weights=True``; funcnet's is False (the output is ``y`` alone), which is
      torch's ``need_weights=False``.
    * ``num_kv_heads=Hk``: grouped-query attention (torch has it in
      ``scaled_dot_product_attention(..., enable_gqa=True)``, not in
      ``nn.MultiheadAttention``): the key and value projections give ``Hk`` heads of
      ``D`` (``W_k``: ``(kdim, Hk * D)``), each serving ``H // Hk`` consecutive query
      heads; a decoding cache holds ``Hk`` heads. ``Hk`` must divide ``H``.

    Decoding (``cache_length=L``): the layer's state is a key/value cache
    ``{"key", "value": (B, L, Hk, D), "index": int32}`` (init: zeros and 0; the batch
    size of ``input_shape`` must be known). Each apply takes the next ``t`` tokens
    ``(B, t, E)`` (the prompt, then one at a time), writes their keys and values at
    ``index``, attends causally to every cached position up to them and returns
    ``index + t``: the same outputs as running the whole prefix (tested). Needs
    ``causal=True`` and self-attention. Params are the same as without the cache,
    so a decoding network shares the trained params. Going past ``L``: outside
    ``jit`` a ValueError; under ``jit`` the outputs are NaN (the write would
    otherwise land on the wrong slots silently).

    Args:
      num_heads: the number of heads ``H``, a positive int.
      head_dim: the size ``D`` of each head, a positive int; None for ``E // num_heads``.
      out_dim: the number of output features, a positive int; None for ``E``.
      use_bias: False drops the bias ``b`` of every projection.
      dropout: the probability of dropping each attention weight in train mode, in
        ``[0, 1)``.
      causal: True adds the causal mask: each query attends to its own position and the
        ones before it.
      rope: True rotates queries and keys by their positions (:func:`funcnet.layers.rope`)
        before the scores; the head dim must then be even.
      rope_base: the base of the rotary angles, > 0.
      cache_length: the length ``L`` of the key/value cache for decoding (needs
        ``causal=True``), or None for no cache.
      W_init: the initializer of ``W_q``, ``W_k`` and ``W_v``; None for torch's
        Glorot-uniform draws.
      b_init: the initializer of every bias; None for zeros.
      out_W_init: the initializer of ``W_out``; None for torch's Linear default.
      implementation: None, ``"xla"``, ``"cudnn"`` or ``"reference"``, as
        :func:`dot_product_attention`.
      num_kv_heads: the number of key/value heads ``Hk``, a positive int dividing
        ``num_heads``; None for ``num_heads``.
      add_bias_kv: True appends the learned key and value ``bias_k``, ``bias_v``.
      add_zero_attn: True appends a zero key and value.
      need_weights: True returns ``(y, weights)`` instead of ``y``.
      average_attn_weights: with ``need_weights``, True averages the weights over the
        heads.

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)``, with one shape
      ``(B, T, E)`` or the shapes of ``(q, kv)`` or ``(q, k, v)``, gives
      ``(output_shape, params, state)`` with output shape ``(B, T, out_dim)`` (with
      ``need_weights``, the pair of it and the weights' shape); params
      ``{"query", "key", "value", "out"}``, each ``{"W": (in, out), "b": (out,)}``
      (float32; ``W`` is ``(E, H * D)`` for ``query``, ``(kdim, Hk * D)`` for ``key``,
      ``(vdim, Hk * D)`` for ``value`` and ``(H * D, out_dim)`` for ``out``), and with
      ``add_bias_kv`` also ``bias_k``, ``bias_v`` ``(Hk * D,)``; and state
      ``()``, or with ``cache_length`` the cache
      ``{"key", "value": (B, L, Hk, D), "index": int32}``.

    Raises:
      ArgumentError: a bad ``num_heads``, ``head_dim``, ``out_dim``, ``dropout``,
        ``rope_base``, ``cache_length`` or ``num_kv_heads``, a flag that is not a bool,
        or an initializer that is not one.
      ValueError: an unknown ``implementation``; ``cache_length`` without
        ``causal=True``; ``num_kv_heads`` not dividing ``num_heads``; ``need_weights``
        with ``implementation="xla"`` or ``"cudnn"``; at ``init``, ``num_heads`` not dividing ``E`` (without
        ``head_dim``), an odd head dim with ``rope``, keys and values of different
        batch or length, or (decoding) an unknown batch size; at ``apply``, inputs that
        do not fit the params, a mask or bias that does not broadcast, a cache made for
        another batch size (or another layer), or (outside ``jit``) decoding past the
        cache.
      TypeError: at ``apply``, a non-boolean ``mask`` or a boolean ``bias``.

    Examples:
      >>> init, apply = MultiHeadAttention(num_heads=2, causal=True)
      >>> out_shape, params, state = init(jax.random.key(0), (-1, 5, 8))
      >>> out_shape, sorted(params)
      ((-1, 5, 8), ['key', 'out', 'query', 'value'])
      >>> apply(params, state, jnp.ones((3, 5, 8)))[0].shape
      (3, 5, 8)
      >>> gqa = MultiHeadAttention(4, num_kv_heads=2, add_zero_attn=True, need_weights=True)
      >>> (y_shape, w_shape), params, _ = gqa.init(jax.random.key(0), (-1, 5, 8))
      >>> y_shape, w_shape, params["key"]["W"].shape   # 5 keys and the zero one
      ((-1, 5, 8), (-1, 5, 6), (8, 4))
    """
    num_heads = checks.positive_int("MultiHeadAttention", "num_heads", num_heads)
    name = f"MultiHeadAttention({num_heads})"
    if head_dim is not None:
        head_dim = checks.positive_int(name, "head_dim", head_dim)
    if out_dim is not None:
        out_dim = checks.positive_int(name, "out_dim", out_dim)
    dropout = checks.real(name, "dropout", dropout, low=0.0, high=1.0, high_open=True)
    use_bias, causal, rope, add_bias_kv, add_zero_attn, need_weights, average_attn_weights = (
        checks.flag(name, n, v)
        for n, v in (
            ("use_bias", use_bias),
            ("causal", causal),
            ("rope", rope),
            ("add_bias_kv", add_bias_kv),
            ("add_zero_attn", add_zero_attn),
            ("need_weights", need_weights),
            ("average_attn_weights", average_attn_weights),
        )
    )
    rope_base = checks.real(name, "rope_base", rope_base, low=0.0, low_open=True)
    _check_implementation(name, implementation, need_weights)
    kv_heads = _check_kv_option(name, num_heads, num_kv_heads)
    cache_length = _check_cache_option(name, cache_length, causal)
    W_init = checks.initializer(name, "W_init", W_init)
    b_init = checks.initializer(name, "b_init", b_init) or initializers.zeros
    out_W_init = checks.initializer(name, "out_W_init", out_W_init) or initializers.torch_default()
    extra = int(add_bias_kv) + int(add_zero_attn)  # keys appended to each sequence

    def init(rng, input_shape):
        q_shape, k_shape, v_shape = _split_shapes(name, input_shape)
        E, kdim, vdim = q_shape[-1], k_shape[-1], v_shape[-1]
        D = _head_dim(name, E, num_heads, head_dim, rope)
        out = E if out_dim is None else out_dim
        params = _init_params(
            rng, (E, kdim, vdim), (num_heads * D, kv_heads * D), out, use_bias, W_init, b_init, out_W_init, add_bias_kv
        )
        state = () if cache_length is None else _init_cache(name, cache_length, q_shape, kv_heads, D)
        out_shape = q_shape[:-1] + (out,)
        if not need_weights:
            return out_shape, params, state
        S = cache_length if cache_length is not None else k_shape[1]
        heads = () if average_attn_weights else (num_heads,)
        weights_shape = (q_shape[0],) + heads + (q_shape[1], -1 if S == -1 else S + extra)
        return (out_shape, weights_shape), params, state

    def apply(params, state, inputs, *, rng=None, train=False, mask=None, bias=None):
        q_in, k_in, v_in = _split_inputs(name, inputs)
        if cache_length is not None and not (k_in is q_in and v_in is q_in):
            raise ValueError(f"{name}: decoding with a cache is for self-attention; got separate key/value inputs.")
        for what, x in zip(("query", "key", "value"), (q_in, k_in, v_in)):
            _check_features(name, what, x, params[what]["W"].shape[0])
        q, k, v = _project(params, q_in, k_in, v_in, num_heads)
        drop = dropout if train else 0.0
        if drop:
            need_rng(name, rng)
        how = _How(add_zero_attn, need_weights, implementation)
        if cache_length is None:
            if rope:
                q = _rope(q, base=rope_base)
                k = _rope(k, base=rope_base)
            y, weights = _attend(name, q, k, v, params, mask, bias, causal, drop, rng, train, how)
            new_state = state
        else:
            (y, weights), new_state = _decode(
                name, q, k, v, params, state, mask, bias, drop, rng, train, rope, rope_base, how
            )
        y = _mesh.merge_last(y, 2)
        y = linear(y, params["out"]["W"], params["out"].get("b"))
        if need_weights:
            y = (y, weights.mean(axis=1) if average_attn_weights else weights)
        return y, new_state

    return named(name, init, apply)


class _How(NamedTuple):
    """How apply attends: torch's zero key/value, the weights returned, the kernel."""

    add_zero_attn: bool
    need_weights: bool
    implementation: Optional[str]


def _check_implementation(name, implementation, need_weights):
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"{name}: implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}.")
    if need_weights and implementation in ("xla", "cudnn"):
        raise ValueError(
            f"{name}: need_weights=True returns the attention weights, which "
            f"jax's fused implementation={implementation!r} never forms. Leave "
            f"implementation=None (or 'reference'), or need_weights=False."
        )


def _check_cache_option(name, cache_length, causal):
    if cache_length is None:
        return None
    cache_length = checks.positive_int(name, "cache_length", cache_length)
    if not causal:
        raise ValueError(
            f"{name}: cache_length (decoding) needs causal=True: a token being "
            f"decoded can only attend to the ones before it."
        )
    return cache_length


def _check_kv_option(name, num_heads, num_kv_heads):
    """The number of key/value heads: ``num_heads``, or a divisor of it (grouped-query)."""
    if num_kv_heads is None:
        return num_heads
    num_kv_heads = checks.positive_int(name, "num_kv_heads", num_kv_heads)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"{name}: num_kv_heads={num_kv_heads} does not divide num_heads="
            f"{num_heads}: in grouped-query attention each key/value head serves "
            f"num_heads // num_kv_heads query heads. Pick num_kv_heads among the "
            f"divisors of {num_heads}."
        )
    return num_kv_heads


def _project(params, q_in, k_in, v_in, num_heads):
    """The queries ``(B, T, H, D)`` and keys, values ``(B, S, Hk, D)``."""
    D = params["query"]["W"].shape[1] // num_heads
    # Fused, the three kernels would be concatenated: not for kernels split over a
    # mesh (tensor parallel), which each projection uses as they lie.
    if q_in is k_in is v_in and not any(_is_split(params[p]["W"]) for p in ("query", "key", "value")):
        return _project_together(params, q_in, D)
    return tuple(
        _mesh.split_last(linear(x, params[p]["W"], params[p].get("b")), (params[p]["W"].shape[1] // D, D))
        for x, p in ((q_in, "query"), (k_in, "key"), (v_in, "value"))
    )


def _attend(name, q, k, v, params, mask, bias, causal, drop, rng, train, how):
    """Attention after torch's extra keys, ``(y, weights or None)``: ``bias_k``/``bias_v``
    (add_bias_kv), then a zero key/value (add_zero_attn), each appended to every sequence
    after the projections, as ``F.multi_head_attention_forward``. torch pads its masks
    with zeros for them (an additive 0, a boolean False = not masked out): every query may
    attend to them, causal or not."""
    B, T, H, _ = q.shape
    Hk, S = k.shape[2], k.shape[1]
    _check_kv_heads(name, q.shape, k.shape, v.shape)
    mask = _check_mask(name, mask, (B, H, T, S))
    bias = _check_mask(name, bias, (B, H, T, S), "bias")
    new_k, new_v = [], []
    if "bias_k" in params:
        new_k.append(params["bias_k"].reshape(Hk, -1))
        new_v.append(params["bias_v"].reshape(Hk, -1))
    if how.add_zero_attn:
        new_k.append(jnp.zeros(k.shape[2:], k.dtype))
        new_v.append(jnp.zeros(v.shape[2:], v.dtype))
    if new_k:
        if causal:  # made here: dot_product_attention's would line up the appended keys
            cm = causal_mask(T, S, offset=S - T)[None, None]
            mask, causal = (cm if mask is None else mask & cm), False
        n = len(new_k)
        k, v = (
            jnp.concatenate([x, jnp.broadcast_to(jnp.stack(rows).astype(x.dtype), (B, n) + x.shape[2:])], axis=1)
            for x, rows in ((k, new_k), (v, new_v))
        )
        wide = ((0, 0),) * 3 + ((0, n),)
        if mask is not None:
            mask = jnp.pad(jnp.broadcast_to(mask, mask.shape[:3] + (S,)), wide, constant_values=True)
        if bias is not None:
            bias = jnp.pad(jnp.broadcast_to(bias, bias.shape[:3] + (S,)), wide)
    if how.need_weights:
        return _reference_attention(q, k, v, mask, bias, causal, None, drop, rng, need_weights=True)
    return dot_product_attention(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        causal=causal,
        dropout=drop,
        rng=rng,
        train=train,
        implementation=how.implementation,
    ), None


def _head_dim(name, E, num_heads, head_dim, rope):
    if head_dim is None:
        if E % num_heads:
            raise ValueError(
                f"{name}: num_heads={num_heads} does not divide the model dimension "
                f"{E}. Pick num_heads dividing {E}, or give head_dim= explicitly."
            )
        head_dim = E // num_heads
    if rope and head_dim % 2:
        raise ValueError(
            f"{name}: rope rotates pairs of features, so it needs an even head "
            f"dim, got head_dim={head_dim}. Choose num_heads/head_dim so that "
            f"head_dim is even."
        )
    return head_dim


def _init_params(rng, dims, widths, out, use_bias, W_init, b_init, out_W_init, add_bias_kv):
    """The four projections' params (and torch's ``bias_k``, ``bias_v``); torch's draws
    unless initializers are given. ``widths``: the queries' ``H * D``, the keys' and
    values' ``Hk * D``."""
    E, kdim, vdim = dims
    inner, kv_inner = widths
    keys = jax.random.split(rng, 8)
    cols = (inner, kv_inner, kv_inner)
    if W_init is not None:
        w = [W_init(keys[i], (d, c), jnp.float32) for i, (d, c) in enumerate(zip(dims, cols))]
    elif kdim == vdim == E == inner == kv_inner:
        # torch draws the packed (3E, E) in_proj_weight as one Glorot-uniform matrix
        packed = initializers.xavier_uniform()(keys[0], (E, 3 * inner), jnp.float32)
        w = jnp.split(packed, 3, axis=1)
    else:
        w = [initializers.xavier_uniform()(keys[i], (d, c), jnp.float32) for i, (d, c) in enumerate(zip(dims, cols))]
    params = {n: {"W": wi} for n, wi in zip(("query", "key", "value"), w)}
    params["out"] = {"W": out_W_init(keys[3], (inner, out), jnp.float32)}
    if use_bias:
        for i, n in enumerate(("query", "key", "value")):
            params[n]["b"] = b_init(keys[4 + i], (cols[i],), jnp.float32)
        params["out"]["b"] = b_init(keys[7], (out,), jnp.float32)
    if add_bias_kv:
        # torch's xavier_normal_ on (1, 1, E): fan_in = fan_out = E, so std sqrt(2 / 2E).
        # Keys of their own: the draws above stay those of a layer without the option.
        k_key, v_key = jax.random.split(jax.random.fold_in(rng, 8))
        std = 1.0 / math.sqrt(kv_inner)
        params["bias_k"] = std * jax.random.normal(k_key, (kv_inner,), jnp.float32)
        params["bias_v"] = std * jax.random.normal(v_key, (kv_inner,), jnp.float32)
    return params


def _init_cache(name, cache_length, q_shape, num_heads, D):
    if q_shape[0] == -1:
        raise ValueError(
            f"{name}: decoding (cache_length={cache_length}) needs the batch "
            f"size in input_shape to size the cache, got {q_shape}; e.g. "
            f"init(rng, (4, 1, {q_shape[-1]}))."
        )
    B = q_shape[0]
    return {
        "key": jnp.zeros((B, cache_length, num_heads, D), jnp.float32),
        "value": jnp.zeros((B, cache_length, num_heads, D), jnp.float32),
        "index": jnp.zeros((), jnp.int32),
    }


def _decode(name, q, k, v, params, state, mask, bias, drop, rng, train, rope, rope_base, how):
    """One decoding apply: write the new keys/values at ``index``, attend to the cache
    (and to torch's appended keys after it); ``((y, weights or None), new_state)``."""
    need_state(name, state, _CACHE_KEYS)
    _check_cache_fits(name, k.shape, state)
    t, H = q.shape[1], q.shape[2]
    index = state["index"]
    L = state["key"].shape[1]
    known = checks.concrete(index)
    if known is not None and int(known) + t > L:
        raise ValueError(
            f"{name}: decoding past the cache: {int(known)} positions cached "
            f"and {t} more given, but cache_length is {L}. Start from a fresh "
            f"state (init) or build the layer with a larger cache_length."
        )
    if rope:
        pos = index + jnp.arange(t)
        q = _rope(q, pos, base=rope_base)
        k = _rope(k, pos, base=rope_base)
    at = tuple(jnp.asarray(i, index.dtype) for i in (0, index, 0, 0))  # one dtype under x64
    cache_k = lax.dynamic_update_slice(state["key"], k.astype(state["key"].dtype), at)
    cache_v = lax.dynamic_update_slice(state["value"], v.astype(state["value"].dtype), at)
    # query i (position index + i) sees every cached slot up to its own position
    allowed = (jnp.arange(L)[None, :] <= (index + jnp.arange(t))[:, None])[None, None]
    if mask is not None:
        allowed = allowed & _check_mask(name, mask, (q.shape[0], H, t, L))
    y, weights = _attend(
        name, q, cache_k.astype(q.dtype), cache_v.astype(v.dtype), params, allowed, bias, False, drop, rng, train, how
    )
    y = jnp.where(index + t > L, jnp.nan, y)  # past the cache under jit: visible, not wrong
    return (y, weights), {"key": cache_k, "value": cache_v, "index": index + t}


def _check_cache_fits(name, k_shape, state):
    """The cache was made for these keys: same batch size, heads and head dim (at trace
    time; a smaller batch would otherwise fill only the cache's first rows, silently)."""
    B, _, H, D = k_shape
    cache = tuple(jnp.shape(state["key"]))
    if len(cache) != 4:
        raise ValueError(
            f"{name}: the decoding cache's 'key' must be (batch, cache_length, "
            f"heads, head_dim), got shape {cache}. Pass the state this layer's "
            f"init returned."
        )
    if cache[0] != B:
        raise ValueError(
            f"{name}: the decoding cache was made for a batch of {cache[0]} but "
            f"the input has a batch of {B}. A cache holds one row per sequence: "
            f"make a new one for this batch size, init(rng, ({B}, 1, features)), "
            f"or pass {cache[0]} sequences."
        )
    if cache[2:] != (H, D):
        raise ValueError(
            f"{name}: the decoding cache holds {cache[2]} heads of {cache[3]} "
            f"but this layer computes {H} heads of {D}: it is another layer's "
            f"cache. Pass the state this layer's init returned."
        )


def _is_split(W) -> bool:
    return any(e is not None for e in getattr(jax.typeof(W).sharding, "spec", ()))


def _project_together(params, x, D):
    """Self-attention's three projections as one product with the weights side by side
    (nanoGPT's ``c_attn``): the same values as three products, one larger matrix product
    instead of three small ones."""
    names = ("query", "key", "value")
    W = jnp.concatenate([params[n]["W"] for n in names], axis=1)
    b = jnp.concatenate([params[n]["b"] for n in names]) if "b" in params["query"] else None
    widths = [params[n]["W"].shape[1] for n in names]
    y = linear(x, W, b)
    if len(set(widths)) == 1:
        y = y.reshape(x.shape[:-1] + (3, widths[0] // D, D))
        return y[..., 0, :, :], y[..., 1, :, :], y[..., 2, :, :]
    parts = jnp.split(y, np.cumsum(widths)[:-1].tolist(), axis=-1)  # grouped-query
    return tuple(p.reshape(x.shape[:-1] + (w // D, D)) for p, w in zip(parts, widths))


def cache_lengths(state) -> set:
    """The ``cache_length`` of every :func:`MultiHeadAttention` cache in a network's state.

    Used by :func:`funcnet.decoding.generate` to check, before tracing, that the prompt
    and the new tokens fit.

    Args:
      state: a network's state (any nesting of dicts, tuples and lists).

    Returns:
      The set of cache lengths found; empty when the network has no cache.

    Examples:
      >>> from funcnet.combinators import serial
      >>> net = serial(MultiHeadAttention(2, causal=True, cache_length=16),
      ...              MultiHeadAttention(2, causal=True, cache_length=8))
      >>> _, params, state = net.init(jax.random.key(0), (2, 1, 8))
      >>> sorted(cache_lengths(state)), cache_lengths(())
      ([8, 16], set())
    """
    found = set()

    def visit(node):
        if isinstance(node, dict):
            if set(_CACHE_KEYS) <= set(node) and getattr(node["key"], "ndim", 0) == 4:
                found.add(int(node["key"].shape[1]))
                return
            for v in node.values():
                visit(v)
        elif isinstance(node, (tuple, list)):
            for v in node:
                visit(v)

    visit(state)
    return found


def _split_shapes(name, input_shape):
    if isinstance(input_shape, (tuple, list)) and input_shape and isinstance(input_shape[0], (tuple, list)):
        if len(input_shape) == 2:
            q, kv = input_shape
            shapes = (q, kv, kv)
        elif len(input_shape) == 3:
            shapes = tuple(input_shape)
        else:
            raise ValueError(
                f"{name}: expected one shape (self-attention), (q, kv) or (q, k, v) "
                f"shapes, got {len(input_shape)} shapes {input_shape}."
            )
    else:
        shapes = (input_shape,) * 3
    q_shape, k_shape, v_shape = (
        check_shape(name, s, rank=3, what=w) for s, w in zip(shapes, ("query", "key", "value"))
    )
    for what, s in (("query", q_shape), ("key", k_shape), ("value", v_shape)):
        check_known(name, s, [-1], f"{what} feature dimension")
    if k_shape[:-1] != v_shape[:-1]:
        raise ValueError(
            f"{name}: key and value must have the same batch and length, got shapes {k_shape} and {v_shape}."
        )
    return q_shape, k_shape, v_shape


def _split_inputs(name, inputs):
    if isinstance(inputs, (tuple, list)):
        if len(inputs) == 2:
            return inputs[0], inputs[1], inputs[1]
        if len(inputs) == 3:
            return tuple(inputs)
        raise ValueError(
            f"{name}: expected x (self-attention), (q, kv) or (q, k, v), got a "
            f"{type(inputs).__name__} of {len(inputs)} arrays."
        )
    return inputs, inputs, inputs


def _check_features(name, what, x, size):
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected an array {what}, got {type(x).__name__}.")
    if len(shape) != 3:
        raise ValueError(f"{name}: expected a {what} of shape (batch, time, features), got {tuple(shape)}.")
    if shape[-1] != size:
        raise ValueError(
            f"{name}: the {what} has {shape[-1]} features but the params were built "
            f"for {size}: expected shape {tuple(shape[:-1]) + (size,)}, got "
            f"{tuple(shape)}. Re-run init with the right input_shape."
        )
