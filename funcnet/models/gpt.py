"""GPT as nanoGPT writes it (karpathy/nanoGPT ``model.py``), from funcnet's layers."""

from __future__ import annotations

import math
from typing import Optional

from funcnet import _checks as checks
from funcnet import initializers
from funcnet.combinators import Remat, Scan, serial
from funcnet.core import Layer
from funcnet.layers.dropout import Dropout
from funcnet.layers.embedding import TiedEmbedding
from funcnet.layers.normalization import LayerNorm
from funcnet.layers.position import LearnedPositions
from funcnet.layers.transformer import TransformerBlock
from funcnet.precision import Policy, apply_policy, as_policy

__all__ = ["GPT"]


def GPT(
    vocab_size: int,
    block_size: int,
    *,
    n_layer: int = 12,
    n_head: int = 12,
    n_embd: int = 768,
    dropout: float = 0.0,
    bias: bool = True,
    decode: bool = False,
    scan: bool = False,
    remat: bool = False,
    implementation: Optional[str] = None,
    policy: Optional[Policy | str] = None,
) -> Layer:
    """nanoGPT's ``GPT``: token ids ``(B, T)`` -> logits ``(B, T, vocab_size)``.

    ```
    x = wte[ids] + wpe[0:T];  x = Dropout(x)
    x = Block(x)  n_layer times                      (TransformerBlock: pre-norm, GELU MLP 4x)
    logits = LayerNorm(x) @ wte^T                    (the head tied to the token table)
    ```

    nanoGPT's init: every weight ``N(0, 0.02)`` (embeddings too), the two projections
    into the residual stream ``N(0, 0.02 / sqrt(2 n_layer))``, biases zero, LayerNorms
    ones. ``bias=False`` drops the biases of every projection and LayerNorm (nanoGPT
    ``train.py``'s default). Params: ``E`` (``wte``, shared with ``lm_head``),
    ``body/pos/E`` (``wpe``), ``body/blocks/...`` and ``body/ln_f``.

    ``decode=True`` builds the decoding form for :func:`funcnet.generate`: the same
    params, and a state holding each block's key/value cache for ``block_size``
    positions (init with the batch size known: ``init(rng, (B, 1))``).

    ``scan=True`` runs the blocks with :func:`funcnet.Scan` (params stacked on a
    leading ``n_layer`` axis under ``body/blocks``; one compiled block instead of
    ``n_layer``) and ``remat=True`` wraps each block in :func:`funcnet.Remat`.

    ``policy`` (a :class:`funcnet.precision.Policy` or its string) runs the matrix
    products in its compute dtype and the rest in float32, as nanoGPT's training under
    ``torch.autocast(dtype=...)`` does. With ``"params=float32,compute=bfloat16"``:

    * float32: the params (and so their gradients and the optimizer's updates), the
      embedding lookups and their sum, every LayerNorm, the residual stream;
    * bfloat16 (each under :func:`funcnet.precision.apply_policy`): each block's
      attention -- the q/k/v projections, the scores and the weighted sum (the softmax
      in float32, as every path of :func:`funcnet.layers.dot_product_attention`), the
      output projection -- and its MLP's ``fc``, GELU and ``proj``, whose bfloat16
      outputs the residual adds promote to float32 (torch: ``float32 + bfloat16`` is
      float32);
    * ``ln_f`` computes in float32 and returns the compute dtype, so the tied head's
      product ``h @ E^T`` runs in it and the logits are bfloat16, as autocast's
      ``lm_head``; :mod:`funcnet.losses` compute in float32 from them (autocast's
      ``cross_entropy``).

    ``apply_policy(GPT(...), policy)`` instead would make the whole forward, residual
    stream and LayerNorm outputs included, bfloat16. The params are the same tree and
    arrays with or without ``policy``, so checkpoints and hand-built params fit both.
    float16 compute wants loss scaling (``TrainState.create(..., loss_scale=
    funcnet.precision.dynamic_loss_scale())``, torch's ``GradScaler``).

    Args:
      vocab_size: the number of token ids.
      block_size: the longest sequence (positions of ``wpe``; the cache length with
        ``decode=True``).
      n_layer: the number of blocks.
      n_head: attention heads per block.
      n_embd: the width of the residual stream (a multiple of ``n_head``).
      dropout: the dropout rate after the embeddings and inside each block.
      bias: whether projections and LayerNorms have biases.
      decode: build the decoding form (a key/value cache in the state).
      scan: run the blocks with :func:`funcnet.Scan`.
      remat: wrap each block in :func:`funcnet.Remat`.
      implementation: the attention implementation, as
        :class:`funcnet.layers.TransformerBlock` takes it.
      policy: the precision policy of the matrix products (above), or None (everything
        in the params' dtype, float32).

    Returns:
      The network, a :class:`~funcnet.core.Layer`.

    Raises:
      ArgumentError: a non-positive size, or a bad option of the layers inside.
      TypeError: a ``policy`` that is not a :class:`funcnet.precision.Policy` or a string.
      ValueError: a ``policy`` string :func:`funcnet.precision.parse_policy` cannot read.

    Examples:
      >>> net = GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
      >>> out_shape, params, state = net.init(jax.random.key(0), (-1, 8))
      >>> out_shape, params["E"].shape
      ((-1, 8, 11), (11, 8))
      >>> jax.jit(net.apply)(params, state, jnp.zeros((2, 8), jnp.int32))[0].shape
      (2, 8, 11)
    """
    n_layer = checks.positive_int("GPT", "n_layer", n_layer)
    ln_f = LayerNorm(use_bias=bias)
    if policy is not None:
        policy = as_policy(policy, "GPT")
        # float32 as autocast's layer_norm; the output in the head's compute dtype
        ln_f = apply_policy(ln_f, Policy.make("float32", "float32", policy.compute_dtype))
    w = initializers.normal(0.02)
    proj = initializers.normal(0.02 / math.sqrt(2 * n_layer))
    block = TransformerBlock(
        n_head,
        dropout=dropout,
        use_bias=bias,
        W_init=w,
        out_W_init=proj,
        b_init=initializers.zeros if bias else None,
        cache_length=block_size if decode else None,
        implementation=implementation,
        policy=policy,
    )
    if remat:
        block = Remat(block)
    blocks = Scan(block, n_layer) if scan else serial(*[block] * n_layer)
    body = serial(
        pos=LearnedPositions(block_size, n_embd, E_init=w, decode=decode),
        drop=Dropout(dropout),
        blocks=blocks,
        ln_f=ln_f,
    )
    return TiedEmbedding(vocab_size, n_embd, body, E_init=w)
