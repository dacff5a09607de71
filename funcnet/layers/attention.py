"""Multi-head attention, its masks, and the key/value cache used for decoding.

Layouts: sequences are ``(batch, time, features)``; inside the layer, heads are
``(batch, time, heads, head_dim)``, the layout of :func:`jax.nn.dot_product_attention`.

Masks are boolean and ``True`` means *may attend*, as in ``jax.nn.dot_product_attention``
and Flax. PyTorch's boolean masks mean the opposite (``True`` = masked out): pass
``~torch_mask`` (see docs/porting.md). An additive float mask goes in ``bias=``.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from funcnet import _checks as checks
from funcnet import initializers
from funcnet import _mesh
from funcnet.core import Layer, check_known, check_shape, named, need_rng, need_state
from funcnet.layers.dense import linear
from funcnet.layers.position import rope as _rope

__all__ = ["MultiHeadAttention", "dot_product_attention", "causal_mask", "padding_mask",
           "cache_lengths"]

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


def padding_mask(valid) -> jax.Array:
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
        raise TypeError(f"padding_mask: expected booleans of shape (batch, k_len) with True at "
                        f"real tokens, got {valid.dtype} of shape {tuple(valid.shape)}. From "
                        f"lengths: jnp.arange(k_len)[None, :] < lengths[:, None].")
    return valid[:, None, None, :]


def _check_mask(where: str, mask, target: tuple, what: str = "mask"):
    """A boolean mask broadcastable to ``(batch, heads, q_len, k_len)``, as rank 4."""
    if mask is None:
        return None
    mask = jnp.asarray(mask)
    if what == "mask" and mask.dtype != jnp.bool_:
        raise TypeError(f"{where}: mask must be boolean with True = may attend (the "
                        f"convention of jax.nn.dot_product_attention and Flax), got dtype "
                        f"{mask.dtype}. An additive float mask (torch's float attn_mask) goes in "
                        f"bias=; a torch boolean mask (True = masked out) is ~mask here.")
    if what == "bias" and not jnp.issubdtype(mask.dtype, jnp.floating):
        raise TypeError(f"{where}: bias must be a float array added to the attention logits, "
                        f"got dtype {mask.dtype}. A boolean mask goes in mask=.")
    shape = tuple(mask.shape)
    try:
        if len(shape) > 4:
            raise ValueError
        np.broadcast_shapes(shape, target)
    except ValueError:
        raise ValueError(f"{where}: {what} of shape {shape} cannot broadcast to (batch, heads, "
                         f"q_len, k_len) = {target}. Use (q_len, k_len) for one mask for all, "
                         f"(batch, 1, 1, k_len) for padding (funcnet.layers.padding_mask), or "
                         f"(batch, heads, q_len, k_len).") from None
    return mask.reshape((1,) * (4 - len(shape)) + shape)


def dot_product_attention(query, key, value, *, mask=None, bias=None, causal: bool = False,
                          dropout: float = 0.0, rng=None, train: bool = False,
                          implementation: Optional[str] = None, scale: Optional[float] = None):
    """``softmax(q k^T * scale + bias, masked) v`` per head, on ``(B, T, H, D)`` arrays.

    The values may have their own head size ``Dv`` (``(B, S, H, Dv)``), as in
    ``torch.nn.functional.scaled_dot_product_attention``; the output has it too.
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
      key: ``(B, S, H, D)``.
      value: ``(B, S, H, Dv)``; ``Dv`` may differ from ``D``.
      mask: booleans broadcastable to ``(B, H, T, S)``, True = may attend, or None.
      bias: floats broadcastable to ``(B, H, T, S)``, added to the logits, or None.
      causal: each query attends to the keys up to its own position (the last
        query lined up with the last key when ``S > T``).
      dropout, rng, train: dropout on the attention weights, applied only with
        ``train=True`` and ``dropout > 0``.
      implementation: None, ``"xla"``, ``"cudnn"`` or ``"reference"`` (above).
      scale: the factor of the logits, default ``1/sqrt(D)``.

    Returns:
      ``(B, T, H, Dv)``: each head's weighted sum of the values.

    Raises:
      ValueError: an unknown ``implementation``; a mask or bias that does not
        broadcast to ``(B, H, T, S)``; dropout, or ``Dv != D``, with a forced jax
        implementation.
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
        raise ValueError(f"dot_product_attention: implementation must be one of "
                         f"{_IMPLEMENTATIONS}, got {implementation!r}.")
    B, T, H, D = query.shape
    S = key.shape[1]
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
        raise ValueError(f"dot_product_attention: implementation={implementation!r} needs "
                         f"the values' head size to equal the queries' and keys' ({D}), got "
                         f"{value.shape[-1]}. Leave implementation=None (or 'reference') for "
                         f"a value head size of its own.")
    if implementation == "reference" or (implementation is None
                                         and (drop or wide or on_cpu or own_dv)):
        return _reference_attention(query, key, value, mask, bias, causal, scale,
                                    dropout if drop else 0.0, rng)
    if drop:
        raise ValueError(f"dot_product_attention: dropout on the attention weights needs the "
                         f"reference path; implementation={implementation!r} has none. Leave "
                         f"implementation=None.")
    if causal and T != S:
        # jax's is_causal aligns the first query with the first key; we align the last ones.
        cm = causal_mask(T, S, offset=S - T)[None, None]
        mask = cm if mask is None else mask & cm
        causal = False
    return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask, scale=scale,
                                        is_causal=causal, implementation=implementation)


def _reference_attention(q, k, v, mask, bias, causal, scale, dropout, rng):
    B, T, H, D = q.shape
    S = k.shape[1]
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
        keep = jax.random.bernoulli(need_rng("dot_product_attention", rng), 1.0 - dropout,
                                    weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout), 0.0)
    return unfold(jnp.einsum(tsd, weights.astype(v.dtype), heads(v)))


def MultiHeadAttention(num_heads: int, *, head_dim: Optional[int] = None,
                       out_dim: Optional[int] = None, use_bias: bool = True,
                       dropout: float = 0.0, causal: bool = False, rope: bool = False,
                       rope_base: float = 10000.0, cache_length: Optional[int] = None,
                       W_init=None, b_init=None, out_W_init=None,
                       implementation: Optional[str] = None) -> Layer:
    """Multi-head attention, as ``torch.nn.MultiheadAttention(batch_first=True)``.

    Inputs: ``x`` (self-attention, ``(B, T, E)``), ``(q, kv)`` or ``(q, k, v)``
    (cross-attention; ``k``/``v`` ``(B, S, kdim)``/``(B, S, vdim)``, torch's
    ``kdim``/``vdim``). With ``H = num_heads`` and ``D = head_dim`` (default
    ``E // H``)::

        Q = q W_q + b_q,  K = k W_k + b_k,  V = v W_v + b_v      (split into H heads of D)
        head_h = softmax(Q_h K_h^T / sqrt(D) + mask) V_h
        y = concat_h(head_h) W_out + b_out                       (B, T, out_dim)

    ``out_dim`` defaults to ``E``. params ``{"query", "key", "value", "out"}``, each
    ``{"W": (in, out), "b": (out,)}`` like :func:`~funcnet.layers.Dense` (``use_bias=False``
    drops every ``b``). From torch: ``W_q = in_proj_weight[:E].T``,
    ``W_k = in_proj_weight[E:2E].T``, ``W_v = in_proj_weight[2E:].T`` (or
    ``q/k/v_proj_weight.T`` when kdim/vdim differ), the biases split
    ``in_proj_bias`` the same way, ``out = out_proj.weight.T, out_proj.bias``;
    docs/porting.md has the code.

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

    Decoding (``cache_length=L``): the layer's state is a key/value cache
    ``{"key", "value": (B, L, H, D), "index": int32}`` (init: zeros and 0; the batch
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

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, input_shape)``, with one shape
      ``(B, T, E)`` or the shapes of ``(q, kv)`` or ``(q, k, v)``, gives
      ``(output_shape, params, state)`` with output shape ``(B, T, out_dim)``; params
      ``{"query", "key", "value", "out"}``, each ``{"W": (in, out), "b": (out,)}``
      (float32; ``W`` is ``(E, H * D)`` for ``query``, ``(kdim, H * D)`` for ``key``,
      ``(vdim, H * D)`` for ``value`` and ``(H * D, out_dim)`` for ``out``); and state
      ``()``, or with ``cache_length`` the cache
      ``{"key", "value": (B, L, H, D), "index": int32}``.

    Raises:
      ArgumentError: a bad ``num_heads``, ``head_dim``, ``out_dim``, ``dropout``,
        ``rope_base`` or ``cache_length``, a flag that is not a bool, or an initializer
        that is not one.
      ValueError: an unknown ``implementation``; ``cache_length`` without
        ``causal=True``; at ``init``, ``num_heads`` not dividing ``E`` (without
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
    """
    num_heads = checks.positive_int("MultiHeadAttention", "num_heads", num_heads)
    name = f"MultiHeadAttention({num_heads})"
    if head_dim is not None:
        head_dim = checks.positive_int(name, "head_dim", head_dim)
    if out_dim is not None:
        out_dim = checks.positive_int(name, "out_dim", out_dim)
    dropout = checks.real(name, "dropout", dropout, low=0.0, high=1.0, high_open=True)
    use_bias, causal, rope = (checks.flag(name, n, v) for n, v in
                              (("use_bias", use_bias), ("causal", causal), ("rope", rope)))
    rope_base = checks.real(name, "rope_base", rope_base, low=0.0, low_open=True)
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"{name}: implementation must be one of {_IMPLEMENTATIONS}, got "
                         f"{implementation!r}.")
    if cache_length is not None:
        cache_length = checks.positive_int(name, "cache_length", cache_length)
        if not causal:
            raise ValueError(f"{name}: cache_length (decoding) needs causal=True: a token being "
                             f"decoded can only attend to the ones before it.")
    W_init = checks.initializer(name, "W_init", W_init)
    b_init = checks.initializer(name, "b_init", b_init) or initializers.zeros
    out_W_init = checks.initializer(name, "out_W_init", out_W_init) or initializers.torch_default()

    def init(rng, input_shape):
        q_shape, k_shape, v_shape = _split_shapes(name, input_shape)
        for what, s in (("query", q_shape), ("key", k_shape), ("value", v_shape)):
            check_known(name, s, [-1], f"{what} feature dimension")
        if k_shape[:-1] != v_shape[:-1]:
            raise ValueError(f"{name}: key and value must have the same batch and length, got "
                             f"shapes {k_shape} and {v_shape}.")
        E, kdim, vdim = q_shape[-1], k_shape[-1], v_shape[-1]
        D = _head_dim(name, E, num_heads, head_dim, rope)
        out = E if out_dim is None else out_dim
        params = _init_params(rng, (E, kdim, vdim), num_heads * D, out, use_bias, W_init,
                              b_init, out_W_init)
        state = () if cache_length is None else _init_cache(name, cache_length, q_shape,
                                                               num_heads, D)
        return q_shape[:-1] + (out,), params, state

    def apply(params, state, inputs, *, rng=None, train=False, mask=None, bias=None):
        q_in, k_in, v_in = _split_inputs(name, inputs)
        if cache_length is not None and not (k_in is q_in and v_in is q_in):
            raise ValueError(f"{name}: decoding with a cache is for self-attention; got "
                             f"separate key/value inputs.")
        for what, x, p in (("query", q_in, "query"), ("key", k_in, "key"),
                           ("value", v_in, "value")):
            _check_features(name, what, x, params[p]["W"].shape[0])
        D = params["query"]["W"].shape[1] // num_heads

        def project(x, p):
            return _mesh.split_last(linear(x, params[p]["W"], params[p].get("b")),
                                       (num_heads, D))

        # Fused, the three kernels would be concatenated: not for kernels split over a
        # mesh (tensor parallel), which each projection uses as they lie.
        if q_in is k_in is v_in and not any(_is_split(params[p]["W"]) for p in
                                            ("query", "key", "value")):
            q, k, v = _project_together(params, q_in, num_heads, D)
        else:
            q, k, v = project(q_in, "query"), project(k_in, "key"), project(v_in, "value")
        drop = dropout if train else 0.0
        if drop:
            need_rng(name, rng)
        if cache_length is None:
            if rope:
                q = _rope(q, base=rope_base)
                k = _rope(k, base=rope_base)
            y = dot_product_attention(q, k, v, mask=mask, bias=bias, causal=causal,
                                      dropout=drop, rng=rng, train=train,
                                      implementation=implementation)
            new_state = state
        else:
            y, new_state = _decode(name, q, k, v, state, mask, bias, drop, rng, train,
                                   rope, rope_base, implementation)
        y = _mesh.merge_last(y, 2)
        return linear(y, params["out"]["W"], params["out"].get("b")), new_state

    return named(name, init, apply)


def _head_dim(name, E, num_heads, head_dim, rope):
    if head_dim is None:
        if E % num_heads:
            raise ValueError(f"{name}: num_heads={num_heads} does not divide the model dimension "
                             f"{E}. Pick num_heads dividing {E}, or give head_dim= explicitly.")
        head_dim = E // num_heads
    if rope and head_dim % 2:
        raise ValueError(f"{name}: rope rotates pairs of features, so it needs an even head "
                         f"dim, got head_dim={head_dim}. Choose num_heads/head_dim so that "
                         f"head_dim is even.")
    return head_dim


def _init_params(rng, dims, inner, out, use_bias, W_init, b_init, out_W_init):
    """The four projections' params; torch's draws unless initializers are given."""
    E, kdim, vdim = dims
    keys = jax.random.split(rng, 8)
    if W_init is not None:
        w = [W_init(keys[i], (d, inner), jnp.float32) for i, d in enumerate(dims)]
    elif kdim == vdim == E == inner:
        # torch draws the packed (3E, E) in_proj_weight as one Glorot-uniform matrix
        packed = initializers.xavier_uniform()(keys[0], (E, 3 * inner), jnp.float32)
        w = jnp.split(packed, 3, axis=1)
    else:
        w = [initializers.xavier_uniform()(keys[i], (d, inner), jnp.float32)
             for i, d in enumerate(dims)]
    params = {n: {"W": wi} for n, wi in zip(("query", "key", "value"), w)}
    params["out"] = {"W": out_W_init(keys[3], (inner, out), jnp.float32)}
    if use_bias:
        for i, n in enumerate(("query", "key", "value")):
            params[n]["b"] = b_init(keys[4 + i], (inner,), jnp.float32)
        params["out"]["b"] = b_init(keys[7], (out,), jnp.float32)
    return params


def _init_cache(name, cache_length, q_shape, num_heads, D):
    if q_shape[0] == -1:
        raise ValueError(f"{name}: decoding (cache_length={cache_length}) needs the batch "
                         f"size in input_shape to size the cache, got {q_shape}; e.g. "
                         f"init(rng, (4, 1, {q_shape[-1]})).")
    B = q_shape[0]
    return {"key": jnp.zeros((B, cache_length, num_heads, D), jnp.float32),
            "value": jnp.zeros((B, cache_length, num_heads, D), jnp.float32),
            "index": jnp.zeros((), jnp.int32)}


def _decode(name, q, k, v, state, mask, bias, drop, rng, train, rope, rope_base,
            implementation):
    """One decoding apply: write the new keys/values at ``index``, attend to the cache."""
    need_state(name, state, _CACHE_KEYS)
    _check_cache_fits(name, q.shape, state)
    t, H = q.shape[1], q.shape[2]
    index = state["index"]
    L = state["key"].shape[1]
    known = checks.concrete(index)
    if known is not None and int(known) + t > L:
        raise ValueError(f"{name}: decoding past the cache: {int(known)} positions cached "
                         f"and {t} more given, but cache_length is {L}. Start from a fresh "
                         f"state (init) or build the layer with a larger cache_length.")
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
    y = dot_product_attention(q, cache_k.astype(q.dtype), cache_v.astype(v.dtype),
                              mask=allowed, bias=bias, dropout=drop, rng=rng, train=train,
                              implementation=implementation)
    y = jnp.where(index + t > L, jnp.nan, y)  # past the cache under jit: visible, not wrong
    return y, {"key": cache_k, "value": cache_v, "index": index + t}


def _check_cache_fits(name, q_shape, state):
    """The cache was made for these queries: same batch size, heads and head dim (at trace
    time; a smaller batch would otherwise fill only the cache's first rows, silently)."""
    B, _, H, D = q_shape
    cache = tuple(jnp.shape(state["key"]))
    if len(cache) != 4:
        raise ValueError(f"{name}: the decoding cache's 'key' must be (batch, cache_length, "
                         f"heads, head_dim), got shape {cache}. Pass the state this layer's "
                         f"init returned.")
    if cache[0] != B:
        raise ValueError(f"{name}: the decoding cache was made for a batch of {cache[0]} but "
                         f"the input has a batch of {B}. A cache holds one row per sequence: "
                         f"make a new one for this batch size, init(rng, ({B}, 1, features)), "
                         f"or pass {cache[0]} sequences.")
    if cache[2:] != (H, D):
        raise ValueError(f"{name}: the decoding cache holds {cache[2]} heads of {cache[3]} "
                         f"but this layer computes {H} heads of {D}: it is another layer's "
                         f"cache. Pass the state this layer's init returned.")


def _is_split(W) -> bool:
    return any(e is not None for e in getattr(jax.typeof(W).sharding, "spec", ()))


def _project_together(params, x, H, D):
    """Self-attention's three projections as one product with the weights side by side
    (nanoGPT's ``c_attn``): the same values as three products, one larger matrix product
    instead of three small ones."""
    names = ("query", "key", "value")
    W = jnp.concatenate([params[n]["W"] for n in names], axis=1)
    b = (jnp.concatenate([params[n]["b"] for n in names]) if "b" in params["query"] else None)
    y = linear(x, W, b).reshape(x.shape[:-1] + (3, H, D))
    return y[..., 0, :, :], y[..., 1, :, :], y[..., 2, :, :]


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
    if isinstance(input_shape, (tuple, list)) and input_shape and isinstance(
            input_shape[0], (tuple, list)):
        if len(input_shape) == 2:
            q, kv = input_shape
            shapes = (q, kv, kv)
        elif len(input_shape) == 3:
            shapes = tuple(input_shape)
        else:
            raise ValueError(f"{name}: expected one shape (self-attention), (q, kv) or (q, k, v) "
                             f"shapes, got {len(input_shape)} shapes {input_shape}.")
    else:
        shapes = (input_shape,) * 3
    return tuple(check_shape(name, s, rank=3, what=w)
                 for s, w in zip(shapes, ("query", "key", "value")))


def _split_inputs(name, inputs):
    if isinstance(inputs, (tuple, list)):
        if len(inputs) == 2:
            return inputs[0], inputs[1], inputs[1]
        if len(inputs) == 3:
            return tuple(inputs)
        raise ValueError(f"{name}: expected x (self-attention), (q, kv) or (q, k, v), got a "
                         f"{type(inputs).__name__} of {len(inputs)} arrays.")
    return inputs, inputs, inputs


def _check_features(name, what, x, size):
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: expected an array {what}, got {type(x).__name__}.")
    if len(shape) != 3:
        raise ValueError(f"{name}: expected a {what} of shape (batch, time, features), got "
                         f"{tuple(shape)}.")
    if shape[-1] != size:
        raise ValueError(f"{name}: the {what} has {shape[-1]} features but the params were built "
                         f"for {size}: expected shape {tuple(shape[:-1]) + (size,)}, got "
                         f"{tuple(shape)}. Re-run init with the right input_shape.")
