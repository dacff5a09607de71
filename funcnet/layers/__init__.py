"""Layers, one module per family. Each constructor returns a :class:`funcnet.Layer`."""

from funcnet.layers.dense import Dense

__all__ = ["Dense"]
