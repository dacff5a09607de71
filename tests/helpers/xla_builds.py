"""The suite's XLA flags against a default build, on a few programs (tests/test_conftest.py).

``python helpers/xla_builds.py OPTIONS`` (from tests/) prints, as JSON, what
:func:`compare` finds in a process started with the ``XLA_FLAGS`` the caller chose.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np


def _programs():
    """A dense tanh layer's gradient (products and sums: where FMAs form), a convolution's,
    a normalisation and log-softmax's, and a scan; fixed random inputs."""
    k1, k2 = jax.random.split(jax.random.key(0))
    w, x = jax.random.normal(k1, (32, 16)), jax.random.normal(k2, (8, 32))
    image, kernel = jax.random.normal(k1, (2, 9, 9, 3)), jax.random.normal(k2, (3, 3, 3, 4))

    def conv(k):
        y = jax.lax.conv_general_dilated(image, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.mean(jax.nn.relu(y))

    def norm(x):
        centred = x - x.mean(-1, keepdims=True)
        return jnp.sum(x * jax.nn.log_softmax(centred * jax.lax.rsqrt((centred**2).mean(-1, keepdims=True) + 1e-5)))

    return [
        (jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)), w),
        (jax.grad(conv), kernel),
        (jax.grad(norm), x),
        (lambda x: jax.lax.scan(lambda c, r: (jnp.tanh(c * r + r), c), x[0], x)[0], x),
    ]


def compare(default_options):
    """Each program built with this process's flags (the suite's) and with
    ``default_options`` (what a default build has for each of those flags): whether the
    optimised HLO is the same text when only the LLVM level differs, whether the results
    are the same bits, and the largest difference."""
    level = {"xla_backend_optimization_level": default_options["xla_backend_optimization_level"]}
    same_hlo, same_bits, largest = [], [], 0.0
    for f, x in _programs():
        lowered = jax.jit(f).lower(x)
        suite = lowered.compile()
        same_hlo.append(lowered.compile(level).as_text() == suite.as_text())
        ours, default = np.asarray(suite(x)), np.asarray(lowered.compile(default_options)(x))
        same_bits.append(bool(np.array_equal(ours, default)))
        largest = max(largest, float(np.max(np.abs(ours - default))))
    return {"same_hlo": same_hlo, "same_bits": same_bits, "largest": largest}


if __name__ == "__main__":
    print(json.dumps(compare(json.loads(sys.argv[1]))))
