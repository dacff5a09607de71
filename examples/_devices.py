"""Shared by the examples: simulate CPU devices, which only works before jax starts."""

import os
import sys


def simulate_cpu_devices(n):
    """On a CPU-only run, ask XLA for ``n`` host devices so a data-parallel example can run.

    Does nothing when jax is already imported, when the flag is already set, or when
    another platform (GPU/TPU) was requested.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if (
        not n
        or "jax" in sys.modules
        or "--xla_force_host_platform_device_count" in flags
        or os.environ.get("JAX_PLATFORMS", "cpu") != "cpu"
    ):
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
