"""funcnet.losses against torch.nn.functional, option by option: 20 random configurations per
loss and dtype, the value and the gradient of every float argument, float32 and float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import losses
from funcnet.errors import ArgumentError

from helpers.torch_ref import torch

F = torch.nn.functional

DTYPES = [(np.float32, 2e-5), (np.float64, 1e-10)]
REDUCTIONS = ["mean", "sum", "none"]


def _compare(ours, theirs, arrays, grad_args, tol, cfg):
    """``ours(*jnp arrays)`` vs ``theirs(*torch tensors)``: values, and the gradients of
    ``sum(out * g)`` (a random ``g``) with respect to ``arrays[i]`` for ``i in grad_args``."""
    out = ours(*[jnp.asarray(a) for a in arrays])
    g = np.random.default_rng(len(str(cfg))).standard_normal(np.shape(out)).astype(arrays[grad_args[0]].dtype)

    def f(*diff):
        args = [jnp.asarray(a) for a in arrays]
        for i, d in zip(grad_args, diff):
            args[i] = d
        return jnp.sum(ours(*args) * g)

    grads = jax.grad(f, argnums=tuple(range(len(grad_args))))(*[jnp.asarray(arrays[i]) for i in grad_args])
    ts = [torch.tensor(a, requires_grad=i in grad_args) for i, a in enumerate(arrays)]
    t_out = theirs(*ts)
    (t_out * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=tol, atol=tol, err_msg=f"value {cfg}")
    for i, gr in zip(grad_args, grads):
        np.testing.assert_allclose(gr, ts[i].grad.numpy(), rtol=tol, atol=tol, err_msg=f"grad of argument {i} {cfg}")


def _configs(seed, n=20):
    rng = np.random.default_rng(seed)
    for i in range(n):
        yield rng, REDUCTIONS[i % 3]


def _x64(dtype):
    return jax.enable_x64(dtype == np.float64)


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_binary_cross_entropy(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(0):
            shape = (3, 4)
            p = rng.uniform(0.02, 0.98, shape)
            # probabilities at the ends, where torch clamps the log at -100
            p.flat[rng.integers(0, p.size, 2)] = rng.choice([0.0, 1.0, 1e-50], 2)
            p = p.astype(dtype)
            y = rng.uniform(0, 1, shape).astype(dtype)
            if rng.integers(2):
                y = (y > 0.5).astype(dtype)
            w = rng.uniform(0.5, 2, (4,)).astype(dtype) if rng.integers(2) else None
            cfg = dict(reduction=red, weight=w is not None)
            _compare(
                lambda a, b: losses.binary_cross_entropy(
                    a, b, weight=None if w is None else jnp.asarray(w), reduction=red
                ),
                lambda a, b: F.binary_cross_entropy(a, b, weight=None if w is None else torch.tensor(w), reduction=red),
                [p, y],
                [0, 1],
                tol,
                cfg,
            )


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss")
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_kl_div(dtype, tol):
    with _x64(dtype):
        for i, (rng, _) in enumerate(_configs(1)):
            red = ["mean", "sum", "none", "batchmean"][i % 4]
            log_target = bool(rng.integers(2))
            x = np.log(rng.dirichlet(np.ones(5), 3)).astype(dtype)
            t = rng.dirichlet(np.ones(5), 3)
            t = (np.log(t) if log_target else t).astype(dtype)
            cfg = dict(reduction=red, log_target=log_target)
            _compare(
                lambda a, b: losses.kl_div(a, b, reduction=red, log_target=log_target),
                lambda a, b: F.kl_div(a, b, reduction=red, log_target=log_target),
                [x, t],
                [0, 1],
                tol,
                cfg,
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_multiclass_hinge_p(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(2):
            p = int(rng.integers(1, 3))
            margin = float(rng.uniform(0.1, 2.0))
            x = rng.standard_normal((4, 5)).astype(dtype)
            y = rng.integers(0, 5, 4)
            w = rng.uniform(0.5, 2, 5).astype(dtype) if rng.integers(2) else None
            cfg = dict(reduction=red, p=p, margin=margin, weight=w is not None)
            _compare(
                lambda a: losses.multiclass_hinge(
                    a, jnp.asarray(y), p=p, margin=margin, reduction=red, weight=None if w is None else jnp.asarray(w)
                ),
                lambda a: F.multi_margin_loss(
                    a, torch.tensor(y), p=p, margin=margin, reduction=red, weight=None if w is None else torch.tensor(w)
                ),
                [x],
                [0],
                tol,
                cfg,
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_cosine_embedding_loss(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(3):
            batched = bool(rng.integers(4))
            shape = (4, 3) if batched else (3,)
            margin = float(rng.uniform(-0.5, 0.5))
            x1 = rng.standard_normal(shape).astype(dtype)
            x2 = rng.standard_normal(shape).astype(dtype)
            y = rng.choice([-1, 1], shape[:-1])
            cfg = dict(reduction=red, margin=margin, shape=shape)
            _compare(
                lambda a, b: losses.cosine_embedding_loss(a, b, jnp.asarray(y), margin=margin, reduction=red),
                lambda a, b: F.cosine_embedding_loss(a, b, torch.tensor(y), margin=margin, reduction=red),
                [x1, x2],
                [0, 1],
                tol,
                cfg,
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_margin_ranking_loss(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(4):
            margin = float(rng.uniform(-0.5, 1.0))
            x1, x2 = rng.standard_normal((2, 6)).astype(dtype)
            y = rng.choice([-1.0, 1.0], 6).astype(dtype)
            _compare(
                lambda a, b, c: losses.margin_ranking_loss(a, b, c, margin=margin, reduction=red),
                lambda a, b, c: F.margin_ranking_loss(a, b, c, margin=margin, reduction=red),
                [x1, x2, y],
                [0, 1],
                tol,
                dict(reduction=red, margin=margin),
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_triplet_margin_loss(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(5):
            kw = dict(
                margin=float(rng.uniform(0.1, 2.0)),
                p=float(rng.choice([1.0, 2.0, 3.0, 1.5])),
                eps=float(rng.choice([1e-6, 1e-3, 0.0])),
                swap=bool(rng.integers(2)),
                reduction=red,
            )
            shape = (4, 3) if rng.integers(4) else (3,)
            a, p, n = rng.standard_normal((3,) + shape).astype(dtype)
            _compare(
                lambda *xs: losses.triplet_margin_loss(*xs, **kw),
                lambda *xs: F.triplet_margin_loss(*xs, **kw),
                [a, p, n],
                [0, 1, 2],
                tol,
                dict(kw, shape=shape),
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_poisson_nll_loss(dtype, tol):
    with _x64(dtype):
        for rng, red in _configs(6):
            kw = dict(
                log_input=bool(rng.integers(2)),
                full=bool(rng.integers(2)),
                eps=float(rng.choice([1e-8, 1e-3])),
                reduction=red,
            )
            x = (rng.standard_normal((3, 4)) if kw["log_input"] else rng.uniform(0.1, 3.0, (3, 4))).astype(dtype)
            y = rng.poisson(2.0, (3, 4)).astype(dtype)  # 0, 1 and > 1 (Stirling's term)
            if kw["full"]:
                # torch's gradient with respect to a target of 0 is NaN there (0 * log 0's
                # derivative through its mask); ours is 0
                y = np.maximum(y, 1.0).astype(dtype)
            _compare(
                lambda a, b: losses.poisson_nll_loss(a, b, **kw),
                lambda a, b: F.poisson_nll_loss(a, b, **kw),
                [x, y],
                [0, 1],
                tol,
                kw,
            )


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_gaussian_nll_loss(dtype, tol):
    shape = (3, 2, 4)
    var_shapes = [shape, shape[:-1], (3, 2, 1), (1, 2, 4), (3, 1, 4)]
    with _x64(dtype):
        for i, (rng, red) in enumerate(_configs(7)):
            kw = dict(full=bool(rng.integers(2)), eps=float(rng.choice([1e-6, 0.1])), reduction=red)
            vs = var_shapes[i % len(var_shapes)]
            x, y = rng.standard_normal((2,) + shape).astype(dtype)
            # some variances below eps: torch's clamp, which keeps var's gradient path
            var = rng.uniform(0.0, 2.0, vs).astype(dtype)
            _compare(
                lambda a, b, v: losses.gaussian_nll_loss(a, b, v, **kw),
                lambda a, b, v: F.gaussian_nll_loss(a, b, v, **kw),
                [x, y, var],
                [0, 1, 2],
                tol,
                dict(kw, var_shape=vs),
            )
        # a number as var
        x, y = rng.standard_normal((2,) + shape).astype(dtype)
        np.testing.assert_allclose(
            losses.gaussian_nll_loss(x, y, 0.7),
            F.gaussian_nll_loss(torch.tensor(x), torch.tensor(y), 0.7).numpy(),
            rtol=tol,
        )


# (blank, zero_infinity), each compiled once (all three reductions in one program) for K
# random configurations at a time (vmapped): 20 configurations per dtype
CTC_OPTIONS = [(0, True), (3, False)]


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-9)])
def test_ctc_loss(dtype, tol):
    N, T, C, S, K = 3, 8, 4, 4, 10
    rng = np.random.default_rng(8)
    with _x64(dtype):
        for blank, zero_infinity in CTC_OPTIONS:
            cfgs = []
            for _ in range(K):
                logits = rng.standard_normal((N, T, C)).astype(dtype)
                targets = rng.choice([c for c in range(C) if c != blank], (N, S))
                target_lengths = rng.integers(0, S + 1, N)
                input_lengths = np.maximum(rng.integers(1, T + 1, N), 2 * target_lengths)
                if zero_infinity:  # an impossible alignment: torch's inf, zeroed
                    targets[0, :2] = targets[0, 0]
                    target_lengths[0], input_lengths[0] = 2, 2
                gs = tuple(rng.standard_normal(shape).astype(dtype) for shape in [(), (), (N,)])
                cfgs.append((logits, targets, input_lengths, target_lengths, gs))

            def weighted(lg, tg, il, tl, gs):
                values = [
                    losses.ctc_loss(
                        jax.nn.log_softmax(lg), tg, il, tl, blank=blank, reduction=red, zero_infinity=zero_infinity
                    )
                    for red in REDUCTIONS
                ]
                return [jnp.sum(v * g) for v, g in zip(values, gs)], values

            grads, values = jax.jit(jax.vmap(jax.jacrev(weighted, has_aux=True)))(
                *[np.stack(a) for a in zip(*[c[:4] for c in cfgs])],
                tuple(np.stack(g) for g in zip(*[c[4] for c in cfgs])),
            )
            for k, (logits, targets, il, tl, gs) in enumerate(cfgs):
                for r, red in enumerate(REDUCTIONS):
                    cfg = dict(
                        reduction=red, blank=blank, zero_infinity=zero_infinity, input_lengths=il, target_lengths=tl
                    )
                    lg = torch.tensor(logits, requires_grad=True)
                    out = F.ctc_loss(
                        lg.log_softmax(-1).transpose(0, 1),
                        torch.tensor(targets),
                        torch.tensor(il),
                        torch.tensor(tl),
                        blank=blank,
                        reduction=red,
                        zero_infinity=zero_infinity,
                    )
                    (out * torch.tensor(gs[r])).sum().backward()
                    np.testing.assert_allclose(values[r][k], out.detach().numpy(), rtol=tol, atol=tol, err_msg=str(cfg))
                    np.testing.assert_allclose(grads[r][k], lg.grad.numpy(), rtol=tol, atol=tol, err_msg=str(cfg))


def test_ctc_loss_infinite_without_zero_infinity_and_log_probs_gradient():
    rng = np.random.default_rng(9)
    lp = np.log(rng.dirichlet(np.ones(3), (2, 4))).astype(np.float32)
    targets = np.array([[1, 1, 2], [1, 2, 0]])
    args = (targets, np.array([3, 4]), np.array([3, 2]))

    def ours(x):  # one program: per-sequence values, and the gradient of the zeroed sum
        return (
            losses.ctc_loss(x, *args, reduction="none"),
            jax.grad(lambda y: losses.ctc_loss(y, *args, reduction="sum", zero_infinity=True))(x),
        )

    values, g = jax.jit(ours)(lp)
    theirs = F.ctc_loss(torch.tensor(lp).transpose(0, 1), *map(torch.tensor, args), reduction="none")
    assert np.isinf(values[0]) and np.isinf(theirs[0].item())
    np.testing.assert_allclose(values[1], theirs[1].item(), rtol=1e-5)
    # gradient with respect to the log-probabilities themselves, torch's formula
    t = torch.tensor(lp, requires_grad=True)
    F.ctc_loss(t.transpose(0, 1), *map(torch.tensor, args), reduction="sum", zero_infinity=True).backward()
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: losses.multiclass_hinge(jnp.ones((2, 3)), jnp.array([0, 1]), p=3), ArgumentError, "p must be 1 or 2"),
        (
            lambda: losses.binary_cross_entropy(jnp.array([0.5, 1.5]), jnp.array([0.0, 1.0])),
            ValueError,
            "probs must lie in \\[0, 1\\].*sigmoid_binary_cross_entropy",
        ),
        (
            lambda: losses.kl_div(jnp.ones(3), jnp.ones(3), reduction="batch_mean"),
            ValueError,
            "reduction must be one of",
        ),
        (
            lambda: losses.triplet_margin_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), margin=0.0),
            ArgumentError,
            "margin .*greater than 0",
        ),
        (
            lambda: losses.triplet_margin_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((2, 3)), p=0),
            ArgumentError,
            "p \\(the norm degree\\)",
        ),
        (
            lambda: losses.cosine_embedding_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.array([0, 1])),
            ValueError,
            "labels must be 1 or -1.*2 \\* y - 1",
        ),
        (
            lambda: losses.gaussian_nll_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), jnp.ones((3, 2))),
            ValueError,
            "var is of incorrect size",
        ),
        (
            lambda: losses.gaussian_nll_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), -jnp.ones((2, 3))),
            ValueError,
            "var has negative entry",
        ),
        (
            lambda: losses.poisson_nll_loss(jnp.ones(3), jnp.ones(3), log_input=1),
            ArgumentError,
            "log_input must be True or False",
        ),
        (
            lambda: losses.ctc_loss(jnp.zeros((1, 4, 3)), jnp.array([[1]]), jnp.array([4]), jnp.array([1]), blank=3),
            ValueError,
            "blank must be in label range",
        ),
        (
            lambda: losses.ctc_loss(jnp.zeros((1, 4, 3)), jnp.array([[0]]), jnp.array([4]), jnp.array([1])),
            ValueError,
            "other than blank=0",
        ),
        (
            lambda: losses.ctc_loss(jnp.zeros((1, 4, 3)), jnp.array([[1]]), jnp.array([5]), jnp.array([1])),
            ValueError,
            "input_lengths must lie in \\[0, 4\\]",
        ),
        (
            lambda: losses.ctc_loss(jnp.zeros((4, 3)), jnp.array([[1]]), jnp.array([4]), jnp.array([1])),
            ValueError,
            "swapaxes",
        ),
        (
            lambda: losses.ctc_loss(
                jnp.zeros((1, 4, 3)), jnp.array([[1]]), jnp.array([4]), jnp.array([1]), reduction="sum_mean"
            ),
            ValueError,
            "reduction must be one of 'mean', 'sum', 'none'",
        ),
    ],
)
def test_bad_options_are_refused(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_new_losses_under_jit_match_torch():
    """Traced arguments: the checks that read concrete values step aside."""
    rng = np.random.default_rng(10)
    x, y, z = rng.standard_normal((3, 4, 3)).astype(np.float32)
    p = rng.uniform(0.1, 0.9, (4, 3)).astype(np.float32)
    b = (y > 0).astype(np.float32)
    signs = np.array([1, -1, 1, -1])
    lp = np.log(rng.dirichlet(np.ones(3), (2, 5))).astype(np.float32)
    ctc_args = (np.array([[1, 2], [2, 2]]), np.array([5, 4]), np.array([2, 2]))
    calls = [
        (losses.binary_cross_entropy, F.binary_cross_entropy, (p, b), {}),
        (losses.kl_div, F.kl_div, (np.log(p), p[::-1].copy()), dict(reduction="batchmean")),
        (losses.multiclass_hinge, F.multi_margin_loss, (x, np.array([0, 2, 1, 0])), dict(p=2)),
        (losses.cosine_embedding_loss, F.cosine_embedding_loss, (x, y, signs), {}),
        (losses.margin_ranking_loss, F.margin_ranking_loss, (x[:, 0], y[:, 0], signs.astype(np.float32)), {}),
        (losses.triplet_margin_loss, F.triplet_margin_loss, (x, y, z), dict(swap=True)),
        (losses.poisson_nll_loss, F.poisson_nll_loss, (x, np.abs(y) * 3), dict(full=True)),
        (losses.gaussian_nll_loss, F.gaussian_nll_loss, (x, y, p[:, 0]), {}),
    ]
    # one program for all of them: a compile each would cost more than the check
    jitted = jax.jit(
        lambda every, lp: (
            [ours(*args, **kw) for (ours, _, _, kw), args in zip(calls, every)],
            losses.ctc_loss(lp, *ctc_args),
        )
    )([args for _, _, args, _ in calls], lp)
    for (_, theirs, args, kw), value in zip(calls, jitted[0]):
        np.testing.assert_allclose(
            value, theirs(*map(torch.tensor, args), **kw).item(), rtol=1e-5, err_msg=theirs.__name__
        )
    np.testing.assert_allclose(
        jitted[1], F.ctc_loss(torch.tensor(lp).transpose(0, 1), *map(torch.tensor, ctc_args)).item(), rtol=1e-5
    )
