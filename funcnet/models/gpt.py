"""GPT as nanoGPT writes it (karpathy/nanoGPT ``model.py``), from funcnet's layers."""

from __future__ import annotations

import math

from funcnet import _checks as checks
from funcnet import initializers
from funcnet.combinators import Remat, Scan, serial
from funcnet.core import Layer
from funcnet.layers.dropout import Dropout
from funcnet.layers.embedding import TiedEmbedding
from funcnet.layers.normalization import LayerNorm
from funcnet.layers.position import LearnedPositions
from funcnet.layers.transformer import TransformerBlock

__all__ = ["GPT"]


def GPT(vocab_size: int, block_size: int, *, n_layer: int = 12, n_head: int = 12,
        n_embd: int = 768, dropout: float = 0.0, bias: bool = True, decode: bool = False,
        scan: bool = False, remat: bool = False, implementation=None) -> Layer:
    """nanoGPT's ``GPT``: token ids ``(B, T)`` -> logits ``(B, T, vocab_size)``.

    ::

        x = wte[ids] + wpe[0:T];  x = Dropout(x)
        x = Block(x)  n_layer times                      (TransformerBlock: pre-norm, GELU MLP 4x)
        logits = LayerNorm(x) @ wte^T                    (the head tied to the token table)

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

    Returns:
      The network, a :class:`~funcnet.core.Layer`.

    Raises:
      ArgumentError: a non-positive size, or a bad option of the layers inside.

    Examples:
      >>> net = GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
      >>> out_shape, params, state = net.init(jax.random.key(0), (-1, 8))
      >>> out_shape, params["E"].shape
      ((-1, 8, 11), (11, 8))
      >>> jax.jit(net.apply)(params, state, jnp.zeros((2, 8), jnp.int32))[0].shape
      (2, 8, 11)
    """
    n_layer = checks.positive_int("GPT", "n_layer", n_layer)
    w = initializers.normal(0.02)
    proj = initializers.normal(0.02 / math.sqrt(2 * n_layer))
    block = TransformerBlock(n_head, dropout=dropout, use_bias=bias, W_init=w, out_W_init=proj,
                             b_init=initializers.zeros if bias else None,
                             cache_length=block_size if decode else None,
                             implementation=implementation)
    if remat:
        block = Remat(block)
    blocks = Scan(block, n_layer) if scan else serial(*[block] * n_layer)
    body = serial(pos=LearnedPositions(block_size, n_embd, E_init=w, decode=decode),
                  drop=Dropout(dropout), blocks=blocks, ln_f=LayerNorm(use_bias=bias))
    return TiedEmbedding(vocab_size, n_embd, body, E_init=w)
