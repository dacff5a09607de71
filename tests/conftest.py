"""Test setup: four simulated CPU devices, so pmap tests run on any machine.

XLA reads the flag once, when jax first initialises its backend, so it must be
set before anything imports jax.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=4").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
