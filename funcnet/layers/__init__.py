"""Layers, one module per family. Each constructor returns a :class:`funcnet.Layer`.

Constructors take arguments (``Dense(10)``, ``Dropout(0.5)``); parameter-free
layers that need no configuration are values, as in stax (``Relu``, ``Flatten``,
``GlobalAvgPool``).
"""

from funcnet.layers.activations import (
    Celu,
    Elu,
    Gelu,
    Glu,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyRelu,
    LogSigmoid,
    LogSoftmax,
    Mish,
    Prelu,
    Relu,
    Relu6,
    Selu,
    Sigmoid,
    Silu,
    Softmax,
    Softplus,
    Softsign,
    Swish,
    Tanh,
    Tanhshrink,
    Threshold,
    elementwise,
)
from funcnet.layers.conv import Conv, ConvTranspose
from funcnet.layers.dense import Dense
from funcnet.layers.dropout import Dropout, SpatialDropout
from funcnet.layers.attention import MultiHeadAttention, causal_mask, dot_product_attention, padding_mask
from funcnet.layers.embedding import Embedding, TiedEmbedding, embedding_renorm
from funcnet.layers.normalization import BatchNorm, GroupNorm, InstanceNorm, LayerNorm, RMSNorm
from funcnet.layers.pooling import (
    AdaptiveAvgPool,
    AdaptiveMaxPool,
    AvgPool,
    GlobalAvgPool,
    GlobalMaxPool,
    MaxPool,
    MaxUnpool,
)
from funcnet.layers.pixel_shuffle import PixelShuffle, PixelUnshuffle
from funcnet.layers.resize import Upsample, ZeroPad
from funcnet.layers.recurrent import GRU, LSTM, RNN
from funcnet.layers.shape import Flatten, Reshape
from funcnet.layers.position import LearnedPositions, SinusoidalPositions, rope, sinusoidal_table
from funcnet.layers.transformer import TransformerBlock

__all__ = [
    "Dense",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AvgPool",
    "GlobalAvgPool",
    "Flatten",
    "Reshape",
    "Dropout",
    "BatchNorm",
    "LayerNorm",
    "Embedding",
    "RNN",
    "LSTM",
    "GRU",
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Gelu",
    "Sigmoid",
    "Tanh",
    "Softplus",
    "Softmax",
    "LogSoftmax",
    "elementwise",
    "MultiHeadAttention",
    "dot_product_attention",
    "causal_mask",
    "padding_mask",
    "TiedEmbedding",
    "embedding_renorm",
    "TransformerBlock",
    "LearnedPositions",
    "SinusoidalPositions",
    "rope",
    "sinusoidal_table",
    "RMSNorm",
    "GroupNorm",
    "InstanceNorm",
    "GlobalMaxPool",
    "SpatialDropout",
    "Upsample",
    "ZeroPad",
    "Relu6",
    "Prelu",
    "Celu",
    "Hardtanh",
    "Hardsigmoid",
    "Hardswish",
    "Silu",
    "Swish",
    "Mish",
    "MaxUnpool",
    "AdaptiveAvgPool",
    "AdaptiveMaxPool",
    "Glu",
    "LogSigmoid",
    "Softsign",
    "Tanhshrink",
    "Threshold",
    "PixelShuffle",
    "PixelUnshuffle",
]
