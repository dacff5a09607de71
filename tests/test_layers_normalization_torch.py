"""BatchNorm and InstanceNorm options against torch.nn.BatchNorm*d / InstanceNorm*d: random
configurations, weights and running buffers copied across, forward, every gradient and the
running statistics, in float32 and float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet.errors import ArgumentError
from funcnet.layers.normalization import BatchNorm, InstanceNorm

from helpers.torch_ref import torch

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
_TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


def _torch_module(kind, spatial, c, **kw):
    dims = max(spatial, 1)
    cls = getattr(torch.nn, f"{kind}{dims}d")
    return cls(c, **kw)


_DRAW = object()


def _run_config(kind, rng, dtype, tol, momentum_=_DRAW, track_=_DRAW):
    """One random configuration: a few train steps (outputs, gradients, running stats),
    then an eval step, compared with torch."""
    # a few fixed shapes: jax compiles each operation once per shape, and that is most of
    # the time here
    # (the layers' code does not depend on the rank: 3-D inputs run BatchNorm3d's code)
    spatial = int(rng.integers(0 if kind == "BatchNorm" else 1, 3))
    n, c, *sizes = [(4, 3), (3, 2, 4), (2, 3, 2, 3)][spatial]
    # torch's InstanceNorm passes momentum=None on as 0: running stats that never move
    momentum = [0.1, 0.35, None if kind == "BatchNorm" else 1.0][rng.integers(3)]
    affine = bool(rng.integers(2))
    track = bool(rng.integers(2))
    momentum = momentum if momentum_ is _DRAW else momentum_  # forced (drawn all the same)
    track = track if track_ is _DRAW else track_
    eps = float([1e-5, 1e-3][rng.integers(2)])
    torch_kw = dict(eps=eps, momentum=momentum, affine=affine, track_running_stats=track)
    tm = _torch_module(kind, spatial, c, **torch_kw).to(_TORCH_DTYPE[dtype])
    ours_momentum = None if momentum is None else 1.0 - momentum
    if kind == "BatchNorm":
        layer = BatchNorm(
            axis=1, momentum=ours_momentum, epsilon=eps, center=affine, scale=affine, track_running_stats=track
        )
    else:
        layer = InstanceNorm(axis=1, momentum=ours_momentum, epsilon=eps, affine=affine, track_running_stats=track)
    shape = (n, c, *sizes)
    _, params, state = layer.init(jax.random.key(0), shape)
    if affine:
        w, b = rng.uniform(0.5, 2.0, c), rng.standard_normal(c)
        with torch.no_grad():
            tm.weight.copy_(torch.tensor(w))
            tm.bias.copy_(torch.tensor(b))
        params = {"scale": jnp.asarray(w, dtype), "bias": jnp.asarray(b, dtype)}
    state = jax.tree.map(lambda a: a.astype(dtype) if a.dtype == jnp.float32 else a, state)
    if track:
        assert set(state) == {"mean", "var"} | ({"num_batches_tracked"} if momentum is None else set())
    else:
        assert state == ()

    def loss(p, x, g, s):
        y, new_s = layer.apply(p, s, x, train=True)
        return jnp.sum(y * g), (y, new_s)

    grad = jax.grad(loss, argnums=(0, 1), has_aux=True)
    cfg = dict(kind=kind, shape=shape, **torch_kw)
    tm.train()
    for _ in range(int(rng.integers(1, 4))):
        x = (rng.standard_normal(shape) * rng.uniform(0.5, 3.0) + rng.standard_normal()).astype(dtype)
        g = rng.standard_normal(shape).astype(dtype)
        xt = torch.tensor(x, requires_grad=True)
        tm.zero_grad()
        yt = tm(xt)
        (yt * torch.tensor(g)).sum().backward()
        (gp, gx), (y, state) = grad(params, jnp.asarray(x), jnp.asarray(g), state)
        np.testing.assert_allclose(y, yt.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
        np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
        if affine:
            np.testing.assert_allclose(gp["scale"], tm.weight.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
            np.testing.assert_allclose(gp["bias"], tm.bias.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
        if track:
            np.testing.assert_allclose(state["mean"], tm.running_mean.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
            np.testing.assert_allclose(state["var"], tm.running_var.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
            if momentum is None:
                assert int(state["num_batches_tracked"]) == int(tm.num_batches_tracked)
    tm.eval()
    x = rng.standard_normal(shape).astype(dtype)
    y, same = layer.apply(params, state, jnp.asarray(x), train=False)
    assert same is state
    with torch.no_grad():
        np.testing.assert_allclose(y, tm(torch.tensor(x)).numpy(), rtol=tol, atol=tol, err_msg=str(cfg))


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_batchnorm_options_match_torch(dtype, tol):
    """momentum (incl. None, the cumulative average), affine, track_running_stats, eps;
    the running variance is torch's unbiased one by default."""
    rng = np.random.default_rng(0)
    cumulative = untracked = 0
    with jax.enable_x64(dtype == np.float64):
        for i in range(30):
            # momentum=None in 20 configurations, track_running_stats=False in 20 (both in
            # 10); the other values in the rest
            momentum = None if i % 3 != 2 else _DRAW
            track = False if i % 3 != 1 else True
            _run_config("BatchNorm", rng, dtype, tol, momentum_=momentum, track_=track)
            cumulative += momentum is None
            untracked += not track
    assert min(cumulative, untracked) >= 20, (cumulative, untracked)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_instancenorm_matches_torch(dtype, tol):
    rng = np.random.default_rng(1)
    with jax.enable_x64(dtype == np.float64):
        for _ in range(20):
            _run_config("InstanceNorm", rng, dtype, tol)


def test_instancenorm_channels_last_default_and_defaults():
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    layer = InstanceNorm()
    out_shape, params, state = layer.init(jax.random.key(0), x.shape)
    assert (out_shape, params, state) == (x.shape, {}, ())  # affine=False, no running stats
    y, _ = layer.apply(params, state, jnp.asarray(x))  # eval: instance statistics
    ref = torch.nn.InstanceNorm1d(3)(torch.tensor(x).transpose(1, 2)).transpose(1, 2)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("transform", ["pmap", "shard_map"])
@pytest.mark.devices(4)
def test_batchnorm_momentum_none_synced_counts_global_batch(transform):
    """Synced, the unbiased correction uses the global count n (all devices' values)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    c = 2
    x = (
        np.random.default_rng(3).standard_normal((4, 3, c)).astype(np.float32)
        + np.arange(4, dtype=np.float32)[:, None, None]
    )
    synced = BatchNorm(momentum=None, axis_name="d")
    _, params, state = synced.init(jax.random.key(0), (-1, c))
    if transform == "pmap":
        _, new = jax.pmap(lambda v: synced.apply(params, state, v, train=True), axis_name="d")(x)
        new = jax.tree.map(lambda a: a[0], new)
    else:
        mesh = jax.make_mesh((4,), ("d",))
        run = jax.jit(
            jax.shard_map(
                lambda v: synced.apply(params, state, v, train=True)[1], mesh=mesh, in_specs=P("d"), out_specs=P()
            )
        )
        new = run(jax.device_put(x.reshape(12, c), NamedSharding(mesh, P("d"))))
    tm = torch.nn.BatchNorm1d(c, momentum=None)
    tm(torch.tensor(x.reshape(12, c)))
    np.testing.assert_allclose(new["var"], tm.running_var.numpy(), rtol=1e-5)
    np.testing.assert_allclose(new["mean"], tm.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    assert int(new["num_batches_tracked"]) == 1


def test_batchnorm_without_running_stats_uses_batch_stats_in_eval():
    layer = BatchNorm(track_running_stats=False)
    _, params, state = layer.init(jax.random.key(0), (-1, 3))
    assert state == ()
    x = jnp.asarray(np.random.default_rng(4).standard_normal((5, 3)).astype(np.float32))
    y_eval, s = layer.apply(params, state, x)
    y_train, _ = layer.apply(params, state, x, train=True)
    assert s == ()
    np.testing.assert_allclose(y_eval, y_train)
    # as torch: one value per channel is refused in eval mode too (no running stats)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        layer.apply(params, state, x[:1])
    # synced, eval mode needs no pmap: each device's own batch, as torch's SyncBatchNorm
    synced = BatchNorm(track_running_stats=False, axis_name="d")
    np.testing.assert_allclose(synced.apply(params, state, x)[0], y_eval)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: BatchNorm(running_var="torch"), "running_var must be 'unbiased'.*or 'biased'"),
        (lambda: BatchNorm(running_var=True), "running_var must be 'unbiased'"),
        (lambda: BatchNorm(momentum=1.5), "momentum.*None for torch's cumulative average"),
        (lambda: BatchNorm(track_running_stats=1), "track_running_stats must be True or False"),
        (lambda: InstanceNorm(affine="yes"), "affine must be True or False"),
        (lambda: InstanceNorm(momentum=-0.1), "momentum"),
        (lambda: InstanceNorm(momentum=None), "momentum=None is not supported.*momentum=1.0"),
        (lambda: InstanceNorm(axis=None), "axis must be an int"),
    ],
)
def test_bad_options_are_refused(make, match):
    with pytest.raises(ArgumentError, match=match):
        make()


def test_instancenorm_bad_inputs_as_torch():
    layer = InstanceNorm(axis=1)
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        # torch: "Expected more than 1 spatial element when training"
        layer.apply({}, (), jnp.ones((2, 3, 1)))
    with pytest.raises(ValueError, match="axis 0 is the batch"):
        InstanceNorm(axis=0).init(jax.random.key(0), (2, 3, 4))
    with pytest.raises(ValueError):
        layer.init(jax.random.key(0), (2, 3))  # no spatial axis


def test_load_torch_state_dict_carries_the_cumulative_count():
    from funcnet.interop import load_torch_state_dict

    rng = np.random.default_rng(5)
    tm = torch.nn.BatchNorm1d(3, momentum=None)
    for _ in range(2):
        tm(torch.tensor(rng.standard_normal((4, 3)).astype(np.float32)))
    layer = BatchNorm(momentum=None)
    _, params, state = layer.init(jax.random.key(0), (-1, 3))
    params, state = load_torch_state_dict(params, state, tm.state_dict())
    assert int(state["num_batches_tracked"]) == 2 and state["num_batches_tracked"].dtype == jnp.int32
    x = rng.standard_normal((4, 3)).astype(np.float32)
    _, state = layer.apply(params, state, jnp.asarray(x), train=True)
    tm(torch.tensor(x))
    np.testing.assert_allclose(state["var"], tm.running_var.numpy(), rtol=1e-5)
    np.testing.assert_allclose(state["mean"], tm.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    # a funcnet BatchNorm with a momentum has no count: torch's is dropped, as before
    _, p2, s2 = BatchNorm().init(jax.random.key(0), (-1, 3))
    _, s2 = load_torch_state_dict(p2, s2, tm.state_dict())
    assert set(s2) == {"mean", "var"}
