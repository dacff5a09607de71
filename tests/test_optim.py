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
from helpers.torch_ref import torch

from funcnet import optim

STEPS = 20
RTOL = 1e-6

_rng = np.random.default_rng(0)
X = _rng.normal(size=(8, 3))
Y = _rng.normal(size=(8, 2))
P0 = {"w": _rng.normal(size=(3, 4)), "b": _rng.normal(size=(4,)) * 0.1, "v": _rng.normal(size=(4, 2))}
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
            np.testing.assert_allclose(a[n], b[n], rtol=RTOL, atol=0, err_msg=f"param {n!r} after step {t + 1}")


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
        torch.optim.SGD(
            [torch.zeros(1, requires_grad=True)], lr=0.1, momentum=momentum, dampening=dampening, nesterov=True
        )
    with pytest.raises(ValueError, match="Nesterov"):
        optim.sgd(0.1, momentum=momentum, dampening=dampening, nesterov=True)


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(weight_decay=0.1),
        dict(b1=0.5, b2=0.9, eps=1e-2),  # large eps: its placement matters
        dict(b1=0.8, b2=0.95, eps=0.3, weight_decay=0.05),
    ],
)
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
    ref = torch_trajectory(
        lambda ps: torch.optim.SGD(ps, lr=0.05, **kw),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5),
    )
    # StepLR as a schedule of the update count. (optax.exponential_decay would
    # do, but it returns float32, and a learning rate rounded to float32 moves a
    # float64 trajectory by ~1e-7 absolute: beyond 1e-6 relative near zero.)
    sched = lambda count: 0.05 * 0.5 ** (count // 5)  # noqa: E731
    assert_same_trajectory(funcnet_trajectory(optim.sgd(sched, **kw)), ref)


def test_sgd_schedule_with_dampening_matches_torch_lambdalr():
    kw = dict(momentum=0.8, dampening=0.3)
    ref = torch_trajectory(
        lambda ps: torch.optim.SGD(ps, lr=0.05, **kw),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 + 0.1 * e),
    )
    assert_same_trajectory(funcnet_trajectory(optim.sgd(lambda c: 0.05 * (1.0 + 0.1 * c), **kw)), ref)


def test_adam_schedule_matches_torch_lambdalr():
    ref = torch_trajectory(
        lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.01),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1 / (1 + 0.3 * e)),
    )
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


@pytest.mark.parametrize(
    "make",
    [lambda: optim.sgd(0.1, momentum=0.9, nesterov=True, weight_decay=0.1), lambda: optim.adam(0.1, weight_decay=0.1)],
)
def test_float32_params_stay_float32(make):
    params = {n: jnp.asarray(P0[n], jnp.float32) for n in NAMES}
    tx = make()
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
        params = optax.apply_updates(params, updates)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))
    assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))


@pytest.mark.parametrize(
    "bad",
    [
        lambda: optim.sgd(-0.1),
        lambda: optim.sgd(0.1, momentum=-0.5),
        lambda: optim.sgd(0.1, weight_decay=-1.0),
        lambda: optim.adam(0.1, b1=1.0),
        lambda: optim.adam(0.1, b2=-0.1),
        lambda: optim.adam(0.1, eps=-1e-8),
        lambda: optim.adam(None),
    ],
)
def test_invalid_hyperparameters_raise(bad):
    with pytest.raises(ValueError):
        bad()


# --------------------------------------------------------------------------- #
# rmsprop, adagrad, adamw, radam, adadelta against torch.optim
# --------------------------------------------------------------------------- #


def _ids(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()) or "defaults"


def _torch_betas(kw):
    tkw = dict(kw)
    if "b1" in tkw or "b2" in tkw:
        tkw["betas"] = (tkw.pop("b1", 0.9), tkw.pop("b2", 0.999))
    return tkw


RMSPROP_CASES = [
    dict(momentum=m, centered=c, weight_decay=wd)
    for m, c, wd in itertools.product((0.0, 0.9), (False, True), (0.0, 0.1))
] + [dict(alpha=0.9, eps=0.3, momentum=0.5, centered=True)]  # large eps: its placement matters


@pytest.mark.parametrize("kw", RMSPROP_CASES, ids=_ids)
def test_rmsprop_matches_torch(kw):
    ref = torch_trajectory(lambda ps: torch.optim.RMSprop(ps, lr=0.01, **kw))
    assert_same_trajectory(funcnet_trajectory(optim.rmsprop(0.01, **kw)), ref)


ADAGRAD_CASES = [
    dict(lr_decay=d, weight_decay=wd, initial_accumulator_value=a)
    for d, wd, a in itertools.product((0.0, 0.1), (0.0, 0.1), (0.0, 0.5))
] + [dict(eps=0.3, lr_decay=0.05)]


@pytest.mark.parametrize("kw", ADAGRAD_CASES, ids=_ids)
def test_adagrad_matches_torch(kw):
    ref = torch_trajectory(lambda ps: torch.optim.Adagrad(ps, lr=0.1, **kw))
    assert_same_trajectory(funcnet_trajectory(optim.adagrad(0.1, **kw)), ref)


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(weight_decay=0.0), dict(weight_decay=0.5), dict(b1=0.5, b2=0.9, eps=0.1, weight_decay=0.2)],
    ids=_ids,
)
def test_adamw_matches_torch(kw):
    ref = torch_trajectory(lambda ps: torch.optim.AdamW(ps, lr=0.03, **_torch_betas(kw)))
    assert_same_trajectory(funcnet_trajectory(optim.adamw(0.03, **kw)), ref)


def test_adamw_mask_equals_torch_param_groups():
    """nanoGPT's groups: decay the matrices (ndim >= 2), not the bias."""
    ref = torch_trajectory(
        lambda ps: torch.optim.AdamW(
            [{"params": [ps[0], ps[2]], "weight_decay": 0.3}, {"params": [ps[1]], "weight_decay": 0.0}],
            lr=0.03,
            betas=(0.9, 0.99),
        )
    )
    tx = optim.adamw(0.03, b2=0.99, weight_decay=0.3, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    assert_same_trajectory(funcnet_trajectory(tx), ref)


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(weight_decay=0.1), dict(b2=0.9, eps=0.1), dict(b1=0.5, b2=0.95, eps=0.3, weight_decay=0.05)],
    ids=_ids,
)
def test_radam_matches_torch(kw):
    ref = torch_trajectory(lambda ps: torch.optim.RAdam(ps, lr=0.03, **_torch_betas(kw)))
    assert_same_trajectory(funcnet_trajectory(optim.radam(0.03, **kw)), ref)


@pytest.mark.parametrize("b2", [0.999, 0.9, 0.95])
def test_radam_cases_cover_both_branches(b2):
    # torch's rho_t is <= 5 for the first updates (plain momentum) and > 5 later
    # (rectified): the 20-step parity tests above see both and the switch.
    t = np.arange(1, STEPS + 1)
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * b2**t / (1 - b2**t)
    assert rho_t[0] <= 5 < rho_t[-1]


@pytest.mark.parametrize(
    "lr,kw", [(1.0, dict()), (0.5, dict(weight_decay=0.1)), (2.0, dict(rho=0.5, eps=1e-3))], ids=str
)
def test_adadelta_matches_torch(lr, kw):
    ref = torch_trajectory(lambda ps: torch.optim.Adadelta(ps, lr=lr, **kw))
    ours = optim.adadelta(**kw) if lr == 1.0 else optim.adadelta(lr, **kw)  # torch's default lr
    assert_same_trajectory(funcnet_trajectory(ours), ref)


@pytest.mark.parametrize("name", ["rmsprop", "adagrad", "adamw", "radam", "adadelta"])
def test_new_recipes_follow_a_torch_lambdalr_schedule(name):
    factor = lambda e: 1.0 / (1.0 + 0.3 * e)  # noqa: E731
    make_torch, make_ours, lr = {
        "rmsprop": (
            lambda ps, lr: torch.optim.RMSprop(ps, lr=lr, momentum=0.9, centered=True),
            lambda s: optim.rmsprop(s, momentum=0.9, centered=True),
            0.01,
        ),
        "adagrad": (
            lambda ps, lr: torch.optim.Adagrad(ps, lr=lr, lr_decay=0.1, weight_decay=0.1),
            lambda s: optim.adagrad(s, lr_decay=0.1, weight_decay=0.1),
            0.1,
        ),
        "adamw": (
            lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.3),
            lambda s: optim.adamw(s, weight_decay=0.3),
            0.05,
        ),
        "radam": (
            lambda ps, lr: torch.optim.RAdam(ps, lr=lr, weight_decay=0.1),
            lambda s: optim.radam(s, weight_decay=0.1),
            0.05,
        ),
        "adadelta": (lambda ps, lr: torch.optim.Adadelta(ps, lr=lr), lambda s: optim.adadelta(s), 1.0),
    }[name]
    ref = torch_trajectory(lambda ps: make_torch(ps, lr), lambda o: torch.optim.lr_scheduler.LambdaLR(o, factor))
    assert_same_trajectory(funcnet_trajectory(make_ours(lambda c: lr * factor(c))), ref)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("rmsprop", dict(learning_rate=0.01, momentum=0.9, weight_decay=0.1, alpha=0.9)),
        ("adagrad", dict(learning_rate=0.1, lr_decay=0.1, weight_decay=0.1)),
        ("radam", dict(learning_rate=0.03, b2=0.95, eps=0.1, weight_decay=0.1)),
    ],
)
def test_new_recipes_under_inject_hyperparams_and_jit(name, kw):
    torch_kw = _torch_betas({("lr" if k == "learning_rate" else k): v for k, v in kw.items()})
    make_torch = {"rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad, "radam": torch.optim.RAdam}[name]
    ref = torch_trajectory(lambda ps: make_torch(ps, **torch_kw))
    tx = optax.inject_hyperparams(getattr(optim, name))(**kw)
    assert_same_trajectory(funcnet_trajectory(tx, jit=True), ref)


@pytest.mark.parametrize(
    "plain,torch_opt",
    [
        # optax.rmsprop: eps inside the root by default.
        (
            lambda: optax.rmsprop(0.01, decay=0.9, eps=0.3),
            lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=0.3),
        ),
        # optax.adagrad: eps inside the root, accumulator starts at 0.1 by default.
        (
            lambda: optax.adagrad(0.1, initial_accumulator_value=0.0, eps=0.3),
            lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=0.3),
        ),
        (lambda: optax.adagrad(0.1, eps=1e-10), lambda ps: torch.optim.Adagrad(ps, lr=0.1)),
        # optax.radam: eps added after the bias correction.
        (
            lambda: optax.radam(0.03, b2=0.9, eps=0.1),
            lambda ps: torch.optim.RAdam(ps, lr=0.03, betas=(0.9, 0.9), eps=0.1),
        ),
        # optax.adadelta's default learning_rate=None scales by nothing, not by -1: it ascends.
        (lambda: optax.adadelta(), lambda ps: torch.optim.Adadelta(ps)),
    ],
    ids=["rmsprop-eps", "adagrad-eps", "adagrad-initial", "radam-eps", "adadelta-default-lr"],
)
def test_plain_optax_differs_where_the_docs_say(plain, torch_opt):
    # The differences docs/optimizers.md lists, shown on a trajectory; also proves
    # the parity tests above can see each of them.
    ref = torch_trajectory(torch_opt)
    with pytest.raises(AssertionError):
        assert_same_trajectory(funcnet_trajectory(plain()), ref)


@pytest.mark.parametrize(
    "plain,torch_opt",
    [
        (lambda: optax.adamw(0.03, weight_decay=0.01), lambda ps: torch.optim.AdamW(ps, lr=0.03)),
        (lambda: optax.adadelta(1.0), lambda ps: torch.optim.Adadelta(ps)),
        (
            lambda: optax.rmsprop(0.01, decay=0.99, eps_in_sqrt=False, momentum=0.9),
            lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9),
        ),
        (
            lambda: optax.sgd(0.05, momentum=0.9, nesterov=True),
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
        ),
        (lambda: optax.adam(0.03), lambda ps: torch.optim.Adam(ps, lr=0.03)),
    ],
    ids=["adamw", "adadelta", "rmsprop-constant-lr", "sgd-nesterov", "adam"],
)
def test_plain_optax_matches_where_the_docs_say(plain, torch_opt):
    assert_same_trajectory(funcnet_trajectory(plain()), torch_trajectory(torch_opt))


def test_optax_rmsprop_momentum_differs_under_a_schedule():
    # optax scales by the learning rate before the trace; torch multiplies the buffer.
    factor = lambda e: 1.0 / (1.0 + 0.3 * e)  # noqa: E731
    ref = torch_trajectory(
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.9),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, factor),
    )
    plain = optax.rmsprop(lambda c: 0.01 * factor(c), decay=0.99, eps_in_sqrt=False, momentum=0.9)
    with pytest.raises(AssertionError):
        assert_same_trajectory(funcnet_trajectory(plain), ref)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.rmsprop(0.1, momentum=0.9, centered=True, weight_decay=0.1),
        lambda: optim.adagrad(0.1, lr_decay=0.1, weight_decay=0.1),
        lambda: optim.adamw(0.1),
        lambda: optim.radam(0.1, weight_decay=0.1),
        lambda: optim.adadelta(weight_decay=0.1),
    ],
    ids=["rmsprop", "adagrad", "adamw", "radam", "adadelta"],
)
def test_new_recipes_keep_float32(make):
    test_float32_params_stay_float32(make)


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda: optim.rmsprop(-0.1), "rmsprop: learning_rate"),
        (lambda: optim.rmsprop(0.1, alpha=-0.5), "rmsprop: alpha"),
        (lambda: optim.rmsprop(0.1, momentum=-0.5), "rmsprop: momentum"),
        (lambda: optim.rmsprop(0.1, eps=-1.0), "rmsprop: eps"),
        (lambda: optim.adagrad(0.1, lr_decay=-0.1), "adagrad: lr_decay"),
        (lambda: optim.adagrad(0.1, initial_accumulator_value=-1.0), "adagrad: initial_accumulator"),
        (lambda: optim.adagrad(None), "adagrad: learning_rate is required"),
        (lambda: optim.adamw(0.1, b1=1.0), r"adamw: b1 must be a finite real number in \[0, 1\)"),
        (lambda: optim.adamw(0.1, weight_decay=-0.1), "adamw: weight_decay"),
        (lambda: optim.radam(0.1, b2=-0.1), "radam: b2"),
        (lambda: optim.radam(0.1, eps=-1e-8), "radam: eps"),
        (lambda: optim.adadelta(rho=1.5), r"adadelta: rho must be a finite real number in \[0, 1\]"),
        (lambda: optim.adadelta(-1.0), "adadelta: learning_rate"),
    ],
)
def test_new_recipes_reject_what_torch_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
    optim.adadelta(rho=1.0)  # torch allows rho == 1


# --------------------------------------------------------------------------- #
# float32: torch computes the step scalars (1 - b**t, RAdam's rho_t) in Python
# double; funcnet computes them in float32 without cancellation.
# --------------------------------------------------------------------------- #

STEPS_F32 = 30
RTOL_F32 = 1e-5


def _trajectories_f32(make_torch, tx):
    """30 steps in float32 on both sides, each computing its own float32 gradients."""
    params = [torch.tensor(P0[n], dtype=torch.float32, requires_grad=True) for n in NAMES]
    opt = make_torch(params)
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor(Y, dtype=torch.float32)
    ref = []
    for _ in range(STEPS_F32):
        opt.zero_grad()
        w, b, v = params
        ((torch.tanh(x @ w + b) @ v - y) ** 2).sum().backward()
        opt.step()
        ref.append({n: p.detach().numpy().copy() for n, p in zip(NAMES, params)})

    def loss(p):
        h = jnp.tanh(jnp.asarray(X, jnp.float32) @ p["w"] + p["b"])
        return jnp.sum((h @ p["v"] - jnp.asarray(Y, jnp.float32)) ** 2)

    @jax.jit
    def step(p, s):
        updates, s = tx.update(jax.grad(loss)(p), s, p)
        return optax.apply_updates(p, updates), s

    p = {n: jnp.asarray(P0[n], jnp.float32) for n in NAMES}
    s = tx.init(p)
    ours = []
    for _ in range(STEPS_F32):
        p, s = step(p, s)
        ours.append({n: np.asarray(p[n]) for n in NAMES})
    return ours, ref


@pytest.mark.parametrize(
    "name,kw",
    [
        ("adam", dict()),
        ("adam", dict(b1=0.8, b2=0.95, eps=0.3, weight_decay=0.05)),
        ("adamw", dict()),
        ("adamw", dict(weight_decay=0.5)),
        ("radam", dict()),
        ("radam", dict(weight_decay=0.1)),
        ("radam", dict(b2=0.9, eps=0.1)),
    ],
    ids=lambda v: v if isinstance(v, str) else _ids(v),
)
def test_float32_trajectories_track_torch_float32(name, kw):
    # Relative to each tensor's largest entry: entries that pass near zero have no
    # meaningful elementwise relative error in float32. Before the cancellation-free
    # scalars, radam's defaults drifted 5.6e-5 and adam's 7e-6 on this measure (now
    # < 1e-6).
    make_torch = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "radam": torch.optim.RAdam}[name]
    ours, ref = _trajectories_f32(
        lambda ps: make_torch(ps, lr=0.03, **_torch_betas(kw)), getattr(optim, name)(0.03, **kw)
    )
    assert max(np.max(np.abs(ref[-1][n] - P0[n])) for n in NAMES) > 1e-2
    for t, (a, b) in enumerate(zip(ours, ref)):
        for n in NAMES:
            assert a[n].dtype == np.float32
            np.testing.assert_allclose(
                a[n],
                b[n],
                rtol=0,
                atol=RTOL_F32 * np.max(np.abs(b[n])),
                err_msg=f"{name} param {n!r} after step {t + 1}",
            )


@pytest.mark.parametrize("b", [0.9, 0.95, 0.999, 0.9999])
def test_float32_step_scalars_match_python_double(b):
    # The scalars alone, against torch's Python-double formulas: the textbook
    # float32 forms are off by up to 2e-4 (1 - b**t) and 2.6e-2 (rho_t, b = 0.999) here.
    t = np.arange(1, STEPS_F32 + 1)
    count = jnp.asarray(t, jnp.int32)
    with jax.enable_x64(False):
        bc = np.asarray(optim._one_minus_power(b, optim._float_count(count)))
        rectify, r_t = jax.vmap(lambda c: optim._radam_rectification(c, b))(count)
    assert bc.dtype == np.float32
    np.testing.assert_allclose(bc, [1 - b ** int(k) for k in t], rtol=5e-7)
    rho_inf = 2 / (1 - b) - 1
    rho_t = np.array([rho_inf - 2 * k * b**k / (1 - b**k) for k in t.tolist()])
    ref_r = np.sqrt(
        np.maximum(rho_t - 4, 0) * np.maximum(rho_t - 2, 0) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
    )
    np.testing.assert_array_equal(np.asarray(rectify), rho_t > 5)
    np.testing.assert_allclose(np.asarray(r_t)[rho_t > 5], ref_r[rho_t > 5], rtol=5e-7)
