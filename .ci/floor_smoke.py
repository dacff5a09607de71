"""The dependency floor's smoke test: run by .ci/run in a venv with the lowest jax, optax and
chex that pyproject.toml admits. Import, one train step, one FSDP-sharded step on a 2-device
mesh that gives the one-device result, one prediction. Exits non-zero on any failure."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import funcnet  # noqa: E402
from funcnet import layers, losses, sharding  # noqa: E402


def main():
    print(
        "jax",
        jax.__version__,
        "jaxlib",
        jax.lib.__version__ if hasattr(jax.lib, "__version__") else "?",
        "optax",
        optax.__version__,
        "funcnet",
        funcnet.__version__,
    )
    net = funcnet.serial(layers.Dense(64), layers.Relu, layers.LayerNorm(), layers.Dense(10))
    opt = optax.sgd(0.1)
    ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 32))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch["x"], rng=rng, train=True)
        return losses.cross_entropy(logits, batch["y"]), funcnet.Aux(state=state)

    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(16, 32)).astype(np.float32), "y": rng.integers(0, 10, size=16).astype(np.int32)}
    step = jax.jit(funcnet.make_train_step(loss_fn, opt))
    one, metrics = step(ts, batch)
    assert np.isfinite(float(metrics["loss"])), metrics

    mesh = jax.make_mesh((2,), ("data",))
    placed = sharding.shard_params(ts, mesh, sharding.fsdp_rules("data", min_size=0))
    with jax.set_mesh(mesh):
        two, _ = jax.jit(funcnet.make_train_step(loss_fn, opt))(placed, funcnet.distributed.shard_batch(mesh, batch))
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

    out = funcnet.make_predict_fn(net, one.params, one.state)(jnp.asarray(batch["x"]))
    assert out.shape == (16, 10)
    print("floor smoke: ok")


if __name__ == "__main__":
    main()
