"""Benchmark harness: funcnet against hand-written JAX, stax, Flax, Haiku, Equinox and PyTorch.

Run ``python -m benchmarks.run --help``. Each (workload, case, peer) runs in its own
subprocess so that PyTorch's and XLA's thread pools never share a process; see
:mod:`benchmarks.run` for the thread pinning and the output format.
"""
