"""funcnet.optim against torch.optim: whole trajectories, float64 on both sides.

Each side computes its own gradients of the same small MLP-ish loss (three
parameter tensors), so a difference anywhere in the recipe (order of weight
decay and momentum, first-step buffer, dampening, eps placement, bias
correction, schedule indexing) shows up in the parameters. float64 keeps the
rounding differences between the two implementations near 1e-15, far below the
1e-6 relative tolerance, so a tolerance failure means a semantic difference.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from funcnet import optim

STEPS = 20
RTOL = 1e-6

_rng = np.random.default_rng(0)
X = _rng.normal(size=(8, 3))
Y = _rng.normal(size=(8, 2))
P0 = {"w": _rng.normal(size=(3, 4)), "b": _rng.normal(size=(4,)) * 0.1,
      "v": _rng.normal(size=(4, 2))}
NAMES = ("w", "b", "v")


def _jax_loss(p):
    h = jnp.tanh(jnp.asarray(X) @ p["w"] + p["b"])
    return jnp.sum((h @ p["v"] - jnp.asarray(Y)) ** 2)


_jax_grad = jax.jit(jax.grad(_jax_loss))


def torch_trajectory(make_opt, make_sched=None, steps=STEPS):
    params = [torch.tensor(P0[n], dtype=torch.float64, requires_grad=True) for n in NAMES]
    opt = make_opt(params)
    sched = make_sched(opt) if make_sched else None
    x, y = torch.tensor(X), torch.tensor(Y)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        w, b, v = params
        loss = ((torch.tanh(x @ w + b) @ v - y) ** 2).sum()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        out.append({n: p.detach().numpy().copy() for n, p in zip(NAMES, params)})
    return out


def funcnet_trajectory(tx, steps=STEPS, jit=False):
    with jax.enable_x64(True):
        params = {n: jnp.asarray(P0[n], jnp.float64) for n in NAMES}
        state = tx.init(params)

        def step(params, state):
            updates, state = tx.update(_jax_grad(params), state, params)
            return optax.apply_updates(params, updates), state

        if jit:
            step = jax.jit(step)
        out = []
        for _ in range(steps):
            params, state = step(params, state)
            assert params["w"].dtype == jnp.float64
            out.append({n: np.asarray(params[n]) for n in NAMES})
    return out


def assert_same_trajectory(ours, ref):
    assert len(ours) == len(ref)
    moved = max(np.max(np.abs(ref[-1][n] - P0[n])) for n in NAMES)
    assert moved > 1e-2, "the reference did not move: the test would be vacuous"
    for t, (a, b) in enumerate(zip(ours, ref)):
        for n in NAMES:
            np.testing.assert_allclose(a[n], b[n], rtol=RTOL, atol=0,
                                       err_msg=f"param {n!r} after step {t + 1}")


SGD_CASES = [
    dict(momentum=m, dampening=d, nesterov=nest, weight_decay=wd)
    for m, d, nest, wd in itertools.product((0.0, 0.9), (0.0, 0.5), (False, True), (0.0, 0.1))
    if not nest or (m > 0 and d == 0)
]


@pytest.mark.parametrize("kw", SGD_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_sgd_matches_torch(kw):
    lr = 0.05
    ref = torch_trajectory(lambda ps: torch.optim.SGD(ps, lr=lr, **kw))
    assert_same_trajectory(funcnet_trajectory(optim.sgd(lr, **kw)), ref)


def test_sgd_covers_every_valid_combination():
    assert len(SGD_CASES) == 10


@pytest.mark.parametrize("momentum,dampening", [(0.0, 0.0), (0.9, 0.5)])
def test_sgd_nesterov_rules_match_torch(momentum, dampening):
    with pytest.raises(ValueError):
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=momentum,
                        dampening=dampening, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.sgd(0.1, momentum=momentum, dampening=dampening, nesterov=True)


@pytest.mark.parametrize("kw", [
    dict(),
    dict(weight_decay=0.1),
    dict(b1=0.5, b2=0.9, eps=1e-2),              # large eps: its placement matters
    dict(b1=0.8, b2=0.95, eps=0.3, weight_decay=0.05),
])
def test_adam_matches_torch(kw):
    lr = 0.03
    tkw = dict(kw)
    if "b1" in tkw:
        tkw["betas"] = (tkw.pop("b1"), tkw.pop("b2"))
    ref = torch_trajectory(lambda ps: torch.optim.Adam(ps, lr=lr, **tkw))
    assert_same_trajectory(funcnet_trajectory(optim.adam(lr, **kw)), ref)


def test_adam_is_not_adamw():
    # Sanity check of the test itself: decoupled decay gives a different path.
    ref = torch_trajectory(lambda ps: torch.optim.Adam(ps, lr=0.03, weight_decay=0.5))
    other = funcnet_trajectory(optax.adamw(0.03, weight_decay=0.5))
    with pytest.raises(AssertionError):
        assert_same_trajectory(other, ref)


def test_sgd_step_schedule_matches_torch_steplr():
    kw = dict(momentum=0.9, nesterov=True, weight_decay=0.01)
    ref = torch_trajectory(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw),
                           lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5))
    # StepLR as a schedule of the update count. (optax.exponential_decay would
    # do, but it returns float32, and a learning rate rounded to float32 moves a
    # float64 trajectory by ~1e-7 absolute: beyond 1e-6 relative near zero.)
    sched = lambda count: 0.05 * 0.5 ** (count // 5)  # noqa: E731
    assert_same_trajectory(funcnet_trajectory(optim.sgd(sched, **kw)), ref)


def test_sgd_schedule_with_dampening_matches_torch_lambdalr():
    kw = dict(momentum=0.8, dampening=0.3)
    ref = torch_trajectory(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw),
                           lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 + 0.1 * e))
    assert_same_trajectory(funcnet_trajectory(optim.sgd(lambda c: 0.05 * (1.0 + 0.1 * c), **kw)), ref)


def test_adam_schedule_matches_torch_lambdalr():
    ref = torch_trajectory(lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.01),
                           lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + 0.3 * e)))
    tx = optim.adam(lambda c: 0.05 / (1 + 0.3 * c), weight_decay=0.01)
    assert_same_trajectory(funcnet_trajectory(tx), ref)


def test_inject_hyperparams_under_jit_matches_torch():
    kw = dict(momentum=0.9, dampening=0.2, weight_decay=0.01)
    ref = torch_trajectory(lambda ps: torch.optim.SGD(ps, lr=0.05, **kw))
    tx = optax.inject_hyperparams(optim.sgd)(learning_rate=0.05, **kw)
    assert_same_trajectory(funcnet_trajectory(tx, jit=True), ref)


def test_inject_hyperparams_zero_momentum_is_plain_sgd():
    # A traced momentum of 0 must bypass the buffer (and dampening) as torch does.
    ref = torch_trajectory(lambda ps: torch.optim.SGD(ps, lr=0.05, dampening=0.5), steps=5)
    tx = optax.inject_hyperparams(optim.sgd)(learning_rate=0.05, momentum=0.0, dampening=0.5)
    ours = funcnet_trajectory(tx, steps=5, jit=True)
    for a, b in zip(ours, ref):
        for n in NAMES:
            np.testing.assert_allclose(a[n], b[n], rtol=RTOL, atol=0)


@pytest.mark.parametrize("make", [lambda: optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
                                  lambda: optim.adam(0.1, weight_decay=0.1)])
def test_float32_params_stay_float32(make):
    params = {n: jnp.asarray(P0[n], jnp.float32) for n in NAMES}
    tx = make()
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
        params = optax.apply_updates(params, updates)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))


@pytest.mark.parametrize("bad", [
    lambda: optim.sgd(-0.1),
    lambda: optim.sgd(0.1, momentum=-0.5),
    lambda: optim.sgd(0.1, weight_decay=-1.0),
    lambda: optim.adam(0.1, b1=1.0),
    lambda: optim.adam(0.1, b2=-0.1),
    lambda: optim.adam(0.1, eps=-1e-8),
    lambda: optim.adam(None),
])
def test_invalid_hyperparameters_raise(bad):
    with pytest.raises(ValueError):
        bad()
