"""PyTorch's CPU random generator, reproduced with numpy, for runs that must see a torch
script's own random numbers without torch (examples/shakespeare_char.py's ``--rng=torch``).

``torch.manual_seed(s)`` seeds a 32-bit Mersenne Twister (MT19937) exactly as numpy's legacy
``RandomState(s)`` does, so the two produce the same 32-bit words. What torch's CPU kernels
make of the words, restated from ATen (``DistributionTemplates.h``, ``DistributionKernels.cpp``)
and checked against torch 2.13 by tests/test_example_shakespeare.py:

- ``torch.randint(high, (n,))``, ``high < 2**32``: one word each, ``word % high``.
- ``Tensor.uniform_`` on float32: one word each (only the count matters here).
- ``Tensor.normal_(mean, std)`` on a contiguous float32 tensor of >= 16 elements: one
  uniform ``u = (word & 0xFFFFFF) / 2**24`` per element, then Box-Muller over each block of 16,
  ``r = sqrt(-2 log(1 - u[j]))``, ``theta = 2 pi u[j+8]``, ``x[j] = mean + std r cos(theta)``,
  ``x[j+8] = mean + std r sin(theta)`` for j < 8; when the size is not a multiple of 16 the last
  16 elements are redrawn from 16 more words. Torch's vectorised log/cos/sin round differently
  from numpy's, so values agree to float32 rounding (a few ulp), not bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TorchCPUGenerator"]


class TorchCPUGenerator:
    """The draws of ``torch.manual_seed(seed)``'s CPU generator, in call order."""

    def __init__(self, seed: int):
        if not 0 <= seed < 2**32:
            raise ValueError(
                f"TorchCPUGenerator: seed {seed} is outside [0, 2**32), where "
                "torch's seed and numpy's legacy seeding agree"
            )
        self._mt = np.random.RandomState(seed)

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` 32-bit outputs of the twister, as uint64."""
        return self._mt.randint(0, 2**32, size=n, dtype=np.uint64)

    def randint(self, high: int, n: int) -> np.ndarray:
        """``torch.randint(high, (n,))``."""
        if not 0 < high < 2**32:
            raise ValueError(
                f"randint: high={high}; torch draws one word per value only below 2**32, the case reproduced here"
            )
        return (self.words(n) % high).astype(np.int64)

    def skip_uniform(self, n: int) -> None:
        """Advance past a float32 ``uniform_`` of ``n`` elements (e.g. nn.Linear's own init)."""
        self.words(n)

    def _uniform(self, n):
        """float32 ``uniform_(0, 1)``: the word's low 24 bits over 2**24 (exact in float64)."""
        return (self.words(n) & 0xFFFFFF).astype(np.float64) / 2**24

    def normal(self, shape, std: float, mean: float = 0.0) -> np.ndarray:
        """``torch.empty(shape).normal_(mean, std)`` in float32, row-major as torch fills it."""
        size = int(np.prod(shape))
        if size < 16:
            raise ValueError(
                f"normal: {size} elements; torch draws tensors of fewer than 16 "
                "elements another way, not reproduced here"
            )
        out = np.empty(size)
        blocks = size // 16 * 16
        out[:blocks] = _box_muller(self._uniform(size)[:blocks].reshape(-1, 16)).reshape(-1)
        if size % 16:  # torch recomputes the last 16 from fresh words
            out[size - 16 :] = _box_muller(self._uniform(16).reshape(1, 16)).reshape(-1)
        return (out * std + mean).astype(np.float32).reshape(shape)


def _box_muller(u):
    """Torch's normal_fill_16 on rows of 16 uniforms: the first 8 give the radii."""
    radius = np.sqrt(-2.0 * np.log(1.0 - u[:, :8]))
    theta = 2.0 * np.pi * u[:, 8:]
    return np.concatenate([radius * np.cos(theta), radius * np.sin(theta)], axis=1)
