"""The pre-norm transformer block, built from funcnet's own layers and combinators."""

from __future__ import annotations

from typing import Callable, Optional

from funcnet import _checks as checks
from funcnet.combinators import Residual, serial
from funcnet.core import Layer, check_input, check_known, check_shape, named
from funcnet.initializers import Initializer
from funcnet.layers.activations import Gelu
from funcnet.layers.attention import MultiHeadAttention
from funcnet.layers.dense import Dense
from funcnet.layers.dropout import Dropout
from funcnet.layers.normalization import LayerNorm
from funcnet.precision import Policy, apply_policy, as_policy

__all__ = ["TransformerBlock"]


def TransformerBlock(
    num_heads: int,
    *,
    mlp_ratio: float = 4.0,
    dropout: float = 0.0,
    use_bias: bool = True,
    causal: bool = True,
    norm: Optional[Callable[[], Layer]] = None,
    activation: Optional[Layer] = None,
    W_init: Optional[Initializer] = None,
    out_W_init: Optional[Initializer] = None,
    b_init: Optional[Initializer] = None,
    rope: bool = False,
    cache_length: Optional[int] = None,
    implementation: Optional[str] = None,
    policy: Optional[Policy | str] = None,
) -> Layer:
    """A pre-norm transformer block (GPT-2, nanoGPT's ``Block``) on ``(B, T, E)``:

    ```
    x = x + Dropout(Attention(norm_1(x)))
    x = x + Dropout(W_2 act(W_1 norm_2(x)))          W_1: E -> mlp_ratio*E, W_2: back to E
    ```

    It is ``serial(attn=Residual(serial(norm, attn, drop)), mlp=Residual(serial(norm,
    fc, act, proj, drop)))``, so params read ``attn/norm``, ``attn/attn/{query,key,value,
    out}``, ``mlp/fc``, ``mlp/proj``, and everything (``summary``, ``paths``, masks
    for weight decay) sees through it. ``E`` comes from the input shape at init.

    ``norm``: a layer constructor called once per norm (default
    ``lambda: LayerNorm(use_bias=use_bias)``; e.g. ``RMSNorm``). ``activation``: a layer
    (default exact ``Gelu``, torch's ``nn.GELU()``). ``W_init`` initialises every
    projection but the two that write into the residual stream (the attention's output
    projection and ``mlp/proj``), which take ``out_W_init`` (GPT-2 scales those by
    ``1/sqrt(2 n_layer)``); both default to each layer's own default, and so does
    ``b_init`` (every bias; nanoGPT's are zeros). ``dropout``
    applies to the attention weights and after both residual branches, as nanoGPT.
    ``causal``, ``rope``, ``cache_length`` (decoding) and ``implementation`` go to
    :func:`MultiHeadAttention`, and so do ``mask`` and ``bias`` of ``apply(params,
    state, inputs, *, rng=None, train=False, mask=None, bias=None)``: ``mask`` boolean,
    True = may attend, broadcastable to ``(B, H, T, S)`` (a padding mask from
    :func:`~funcnet.layers.padding_mask`, a general one, or both joined by ``&``),
    ``bias`` an additive float mask, both on top of ``causal``.

    torch: with ``activation=Gelu`` (default), ``torch.nn.TransformerEncoderLayer(E, H,
    dim_feedforward=round(mlp_ratio * E), dropout=0.0, activation="gelu",
    batch_first=True, norm_first=True)`` gives the same outputs and gradients for the
    same weights (tests/test_layers_attention_options_torch.py). Its ``src_mask`` (a
    boolean one, True = masked out) is ``mask=~src_mask`` here, its
    ``src_key_padding_mask`` is ``mask=padding_mask(~src_key_padding_mask)`` (join
    both with ``&``), a float ``src_mask`` is ``bias=``; its ``is_causal=True`` (with
    ``src_mask`` the causal mask) is ``causal=True``, funcnet's default, and
    ``causal=False`` is torch's default. torch drops out between the MLP's activation
    and second product too (this block does not), so compare in eval mode or with
    ``dropout=0``.

    ``policy`` (a :class:`funcnet.precision.Policy` or its string) is the precision of
    the matrix products, ``torch.autocast``'s rule: the attention (its projections, the
    scores and the weighted sum) and the MLP's ``fc``, ``act`` and ``proj`` each run under
    :func:`funcnet.precision.apply_policy`; the norms, the dropouts (which act on the
    branches' outputs, in their dtype) and the residual adds do not. With
    ``"params=float32,compute=bfloat16"`` the params stay float32, the
    products take bfloat16 inputs (the attention's softmax is float32, as in every path
    of :func:`dot_product_attention`) and return bfloat16, the norms compute in float32
    on a float32 stream, and ``x + branch(x)`` adds a bfloat16 branch to the float32
    stream, which stays float32 -- where ``apply_policy(block, policy)`` would make the
    stream bfloat16. The params are the same arrays and tree as without a policy.

    Args:
      num_heads: the number of attention heads, a positive int dividing ``E``.
      mlp_ratio: the MLP's hidden width over ``E``, > 0 (the width is
        ``round(mlp_ratio * E)``).
      dropout: the probability of dropping attention weights and the outputs of both
        residual branches in train mode, in ``[0, 1)``.
      use_bias: False drops the bias of every projection and of the default norms.
      causal: True lets each token attend only to itself and the ones before it.
      norm: a layer constructor called with no arguments, once per norm; None for
        ``LayerNorm(use_bias=use_bias)``.
      activation: the MLP's activation layer; None for the exact ``Gelu``.
      W_init: the initializer of every projection but the two that write into the
        residual stream; None for each layer's default.
      out_W_init: the initializer of the attention's output projection and ``mlp/proj``;
        None for each layer's default.
      b_init: the initializer of every bias; None for each layer's default.
      rope: True applies rotary positions in the attention.
      cache_length: the key/value cache length for decoding, or None (as
        :func:`MultiHeadAttention`'s).
      implementation: the attention's implementation, as :func:`MultiHeadAttention`'s.
      policy: the precision policy of the attention and the MLP (above), or None for
        none (every product in the dtype of its inputs).

    Returns:
      The layer, an ``(init, apply)`` pair: ``init(rng, (B, T, E))`` gives
      ``((B, T, E), params, state)`` with params
      ``{"attn": {"norm", "attn", "drop"}, "mlp": {"norm", "fc", "act", "proj", "drop"}}``
      (``attn/attn`` as :func:`MultiHeadAttention`'s, ``mlp/fc`` and ``mlp/proj`` as
      :func:`Dense`'s, ``mlp/act`` and the dropouts ``()``) and state of the same
      structure, every entry ``()`` but ``attn/attn``, the cache with
      ``cache_length``.

    Raises:
      ArgumentError: a bad ``num_heads``, ``mlp_ratio``, ``use_bias`` or initializer;
        at ``init``, a bad ``dropout``, ``cache_length`` or flag (checked by the layers
        built there).
      TypeError: a ``norm`` that is not callable, or a ``policy`` that is not a
        :class:`funcnet.precision.Policy` or a string; at ``apply``, a non-boolean
        ``mask`` or a boolean ``bias``.
      ValueError: a ``policy`` string :func:`funcnet.precision.parse_policy` cannot read;
        at ``init``, an input not of rank 3, an unknown ``E``, or one that ``num_heads``
        does not divide; at ``apply``, a ``mask`` or ``bias`` that does not broadcast to
        ``(B, H, T, S)``.

    Examples:
      >>> block = TransformerBlock(num_heads=2)
      >>> out_shape, params, state = block.init(jax.random.key(0), (-1, 8, 16))
      >>> out, _ = block.apply(params, state, jnp.ones((2, 8, 16)))
      >>> out_shape, out.shape, sorted(params)
      ((-1, 8, 16), (2, 8, 16), ['attn', 'mlp'])
    """
    num_heads = checks.positive_int("TransformerBlock", "num_heads", num_heads)
    name = f"TransformerBlock({num_heads})"
    mlp_ratio = checks.real(name, "mlp_ratio", mlp_ratio, low=0.0, low_open=True)
    use_bias = checks.flag(name, "use_bias", use_bias)
    W_init = checks.initializer(name, "W_init", W_init)
    out_W_init = checks.initializer(name, "out_W_init", out_W_init)
    if norm is None:

        def norm():
            return LayerNorm(use_bias=use_bias)
    elif not callable(norm):
        raise TypeError(
            f"{name}: norm must be a layer constructor called with no arguments "
            f"(e.g. funcnet.layers.RMSNorm), got {type(norm).__name__}."
        )
    act = Gelu if activation is None else activation
    b_init = checks.initializer(name, "b_init", b_init)
    if policy is not None:
        policy = as_policy(policy, name)

    def mixed(layer: Layer) -> Layer:
        return layer if policy is None else apply_policy(layer, policy)

    def build(E: int, mask=None, bias=None) -> Layer:
        hidden = int(round(mlp_ratio * E))
        attn = MultiHeadAttention(
            num_heads,
            use_bias=use_bias,
            dropout=dropout,
            causal=causal,
            rope=rope,
            cache_length=cache_length,
            W_init=W_init,
            b_init=b_init,
            out_W_init=out_W_init,
            implementation=implementation,
        )
        if mask is not None or bias is not None:
            attn = _with_masks(attn, mask, bias)
        dense = dict(use_bias=use_bias, b_init=b_init)
        return serial(
            attn=Residual(serial(norm=norm(), attn=mixed(attn), drop=Dropout(dropout))),
            mlp=Residual(
                serial(
                    norm=norm(),
                    fc=mixed(Dense(hidden, W_init=W_init, **dense)),
                    act=mixed(act),
                    proj=mixed(Dense(E, W_init=out_W_init, **dense)),
                    drop=Dropout(dropout),
                )
            ),
        )

    def init(rng, input_shape):
        shape = check_shape(name, input_shape, rank=3)
        check_known(name, shape, [-1], "model dimension")
        return build(shape[-1]).init(rng, shape)

    def apply(params, state, inputs, *, rng=None, train=False, mask=None, bias=None):
        check_input(name, inputs, rank=3)
        E = inputs.shape[-1]
        return build(E, mask, bias).apply(params, state, inputs, rng=rng, train=train)

    return named(name, init, apply)


def _with_masks(attn: Layer, mask, bias) -> Layer:
    """``attn`` with ``mask``/``bias`` bound: ``serial`` passes only ``rng`` and ``train``
    to its layers, and the block's params, state and rng splits stay those of the
    unmasked block."""

    def apply(params, state, inputs, *, rng=None, train=False):
        return attn.apply(params, state, inputs, rng=rng, train=train, mask=mask, bias=bias)

    return named(attn.name, attn.init, apply)
