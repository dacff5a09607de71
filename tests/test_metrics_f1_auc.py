"""funcnet.metrics.F1 and ROCAUC: hand-checked values, scikit-learn parity (when installed),
batches, jit, pmap, errors."""

import functools

import jax
import numpy as np
import pytest

from funcnet import metrics

RNG = np.random.default_rng(0)


@functools.lru_cache(maxsize=None)
def _jitted(metric):
    return jax.jit(metric.update), jax.jit(metric.compute)


def compute(metric, state):
    return _jitted(metric)[1](state)


def run(metric, *args):
    """compute(update(init(), *args)), jitted: one compilation costs less than many eager ops."""
    update, compute = _jitted(metric)
    return compute(update(metric.init(), *args))


def close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- #
# F1, by hand.
# --------------------------------------------------------------------------- #


def test_f1_binary_by_hand():
    y = np.array([1, 1, 0, 0, 1, 0])
    p = np.array([1, 0, 1, 0, 1, 0])  # tp 2, fp 1, fn 1: 2 * 2 / (4 + 1 + 1)
    close(run(metrics.F1(), p, y), 2 / 3)
    close(run(metrics.F1(), p.astype(bool), y.astype(bool)), 2 / 3)
    # Probabilities, thresholded at 0.5 (strictly above is positive); logits at 0.0.
    probs = np.array([0.9, 0.5, 0.7, 0.1, 0.51, 0.2], np.float32)
    close(run(metrics.F1(), probs, y), 2 / 3)
    close(run(metrics.F1(threshold=0.0), np.log(probs / (1 - probs)), y), 2 / 3)
    # Two-class scores: their argmax.
    two = np.stack([1 - probs, probs], -1)
    close(run(metrics.F1(), two, y), 2 / 3)
    # The mask leaves out the fourth and fifth pairs: tp 1, fp 1, fn 1.
    close(run(metrics.F1(), p, y, np.array([1, 1, 1, 0, 0, 1])), 0.5)
    # Labels or ids other than 0/1 (e.g. padding -1) are not counted.
    close(run(metrics.F1(), np.array([1, 1, 0]), np.array([1, -1, 0])), 1.0)


def test_f1_binary_zero_division_and_empty():
    no_positives = (np.zeros(4, np.int32), np.zeros(4, np.int32))
    close(run(metrics.F1(), *no_positives), 0.0)  # sklearn's default (with a warning)
    close(run(metrics.F1(zero_division=1.0), *no_positives), 1.0)
    assert np.isnan(run(metrics.F1(zero_division=float("nan")), *no_positives))
    assert np.isnan(compute(metrics.F1(), metrics.F1().init()))  # nothing counted


# sklearn's user guide example: per class F1 (0.8, 0, 0).
Y_TRUE = np.array([0, 1, 2, 0, 1, 2])
Y_PRED = np.array([0, 2, 1, 0, 0, 1])


def test_f1_multiclass_by_hand():
    close(run(metrics.F1("macro", num_classes=3), Y_PRED, Y_TRUE), 0.8 / 3)
    close(run(metrics.F1("micro", num_classes=3), Y_PRED, Y_TRUE), 2 / 6)  # the accuracy
    close(run(metrics.F1("weighted", num_classes=3), Y_PRED, Y_TRUE), 0.8 / 3)
    close(run(metrics.F1(None, num_classes=3), Y_PRED, Y_TRUE), [0.8, 0, 0])
    # Classes 3 and 4 never occur: macro leaves them out (sklearn's labels=None) ...
    close(run(metrics.F1("macro", num_classes=5), Y_PRED, Y_TRUE), 0.8 / 3)
    # ... and the per-class vector gives them zero_division.
    close(run(metrics.F1(None, num_classes=5), Y_PRED, Y_TRUE), [0.8, 0, 0, 0, 0])
    close(run(metrics.F1(None, num_classes=4, zero_division=1.0), Y_PRED, Y_TRUE), [0.8, 0, 0, 1])
    # A class only ever predicted counts in macro (as 0) but has no weight in weighted.
    close(run(metrics.F1("macro", num_classes=3), np.array([0, 2]), np.array([0, 0])), (2 / 3 + 0) / 2)
    close(run(metrics.F1("weighted", num_classes=3), np.array([0, 2]), np.array([0, 0])), 2 / 3)
    # Scores: their argmax; out-of-range ids and masked pairs are not counted.
    scores = np.eye(3, dtype=np.float32)[Y_PRED] + 0.1
    close(run(metrics.F1("macro", num_classes=3), scores, Y_TRUE), 0.8 / 3)
    close(run(metrics.F1("micro", num_classes=3), np.append(Y_PRED, [1, 0]), np.append(Y_TRUE, [-1, 3])), 2 / 6)
    close(run(metrics.F1("micro", num_classes=3), Y_PRED, Y_TRUE, Y_PRED == Y_TRUE), 1.0)
    macro = metrics.F1("macro", num_classes=3)
    assert np.isnan(compute(macro, macro.init()))


@pytest.mark.devices(4)
def test_f1_batches_add_jit_and_pmap_merge():
    n, c = 32, 4
    logits = RNG.normal(size=(n, c)).astype(np.float32)
    labels = RNG.integers(0, c, n).astype(np.int32)
    for metric, p, y in [
        (metrics.F1("macro", num_classes=c), logits, labels),
        (metrics.F1(), logits[:, 0], labels % 2),
    ]:
        full = run(metric, p, y)
        step = jax.jit(metric.update)
        parts = [step(metric.init(), p[i : i + 8], y[i : i + 8]) for i in range(0, n, 8)]
        close(metric.compute(jax.tree.map(lambda *xs: sum(xs), *parts)), full)
        state = metric.init()
        for i in range(0, n, 8):
            state = step(state, p[i : i + 8], y[i : i + 8])
        close(jax.jit(metric.compute)(state), full)

        def per_device(p, y):
            return metric.compute(metrics.merge(metric.update(metric.init(), p, y), "batch"))

        out = jax.pmap(per_device, axis_name="batch")(p.reshape((4, 8) + p.shape[1:]), y.reshape(4, 8))
        close(out, np.full(4, full))


def test_f1_errors():
    with pytest.raises(
        ValueError,
        match=r"F1: average must be one of 'binary', 'micro', "
        r"'macro', 'weighted', None, got 'samples'",
    ):
        metrics.F1("samples", num_classes=3)
    with pytest.raises(
        ValueError,
        match=r"average='macro' needs the number of classes, e.g. "
        r"F1\('macro', num_classes=10\)",
    ):
        metrics.F1("macro")
    with pytest.raises(
        ValueError,
        match=r"average='binary' is the F1 of class 1 among 2 "
        r"classes, got num_classes=3.*average='macro'",
    ):
        metrics.F1(num_classes=3)
    with pytest.raises(ValueError, match=r"zero_division must be 0.0, 1.0 or float\('nan'\)"):
        metrics.F1(zero_division="warn")
    with pytest.raises(ValueError, match=r"num_classes must be a positive int"):
        metrics.F1("micro", num_classes=0)
    f1 = metrics.F1()
    with pytest.raises(TypeError, match=r"labels must be 0/1 integers or bools"):
        f1.update(f1.init(), np.ones(3), np.ones(3, np.float32))
    with pytest.raises(
        ValueError,
        match=r"predictions of shape \(3, 4\) do not fit labels of "
        r"shape \(3,\): expected \(3,\) or \(3, 2\)",
    ):
        f1.update(f1.init(), np.ones((3, 4)), np.ones(3, np.int32))
    macro = metrics.F1("macro", num_classes=3)
    with pytest.raises(ValueError, match=r"scores have 4 classes, the metric num_classes=3"):
        macro.update(macro.init(), np.ones((2, 4), np.float32), np.ones(2, np.int32))
    with pytest.raises(ValueError, match=r"F1.update: the state does not fit this metric"):
        macro.update(f1.init(), Y_PRED, Y_TRUE)


# --------------------------------------------------------------------------- #
# ROCAUC, by hand.
# --------------------------------------------------------------------------- #


def test_roc_auc_by_hand():
    auc = metrics.ROCAUC(capacity=16)
    # sklearn's docstring example: 3 of the 4 (positive, negative) pairs are ordered.
    close(run(auc, np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])), 0.75)
    # A tie counts one half: pairs (.5, .5) tie, (.5, .2), (.9, .5), (.9, .2) win.
    close(run(auc, np.array([0.5, 0.5, 0.2, 0.9]), np.array([0, 1, 0, 1])), 3.5 / 4)
    close(run(auc, np.zeros(6), np.array([0, 1, 0, 1, 1, 0])), 0.5)  # all tied
    close(run(auc, np.array([3, 1, 2]), np.array([True, False, True])), 1.0)  # ints, bools
    close(run(auc, np.array([-np.inf, 0.0, np.inf]), np.array([0, 1, 1])), 1.0)
    # -1 labels and masked entries are not counted.
    close(run(auc, np.array([0.1, 0.9, 0.4, 0.35, 0.8]), np.array([0, -1, 0, 1, 1])), 0.75)
    close(run(auc, np.array([0.1, 0.4, 0.35, 0.8, 0.0]), np.array([0, 0, 1, 1, 1]), np.array([1, 1, 1, 1, 0])), 0.75)
    # 2-D batches: every element is an example.
    close(run(auc, np.array([[0.1, 0.4], [0.35, 0.8]]), np.array([[0, 0], [1, 1]])), 0.75)


def test_roc_auc_undefined_is_nan():
    auc = metrics.ROCAUC(capacity=8)
    assert np.isnan(compute(auc, auc.init()))
    assert np.isnan(run(auc, np.array([0.2, 0.3]), np.array([1, 1])))  # one class: sklearn raises
    assert np.isnan(run(auc, np.array([0.2, np.nan]), np.array([0, 1])))


def test_roc_auc_batches_jit_capacity_and_overflow():
    n = 40
    scores = RNG.integers(0, 6, n).astype(np.float32)  # many ties across batches
    labels = RNG.integers(0, 2, n).astype(np.int32)
    auc = metrics.ROCAUC(capacity=n)
    full = run(auc, scores, labels)
    step = jax.jit(auc.update)
    state = auc.init()
    for i in range(0, n, 16):  # uneven last batch
        state = step(state, scores[i : i + 16], labels[i : i + 16])
    assert int(state["count"]) == n
    close(jax.jit(auc.compute)(state), full)
    # Past the capacity: an error outside jit, NaN under it.
    with pytest.raises(
        ValueError,
        match=r"ROCAUC.update: 40 examples seen plus this batch of 1 "
        r"exceed capacity=40",
    ):
        auc.update(state, scores[:1], labels[:1])
    assert np.isnan(compute(auc, step(state, scores[:1], labels[:1])))
    with pytest.raises(
        ValueError,
        match=r"a batch of 41 examples does not fit the buffer of "
        r"capacity=40",
    ):
        auc.update(auc.init(), np.zeros(41), np.zeros(41, np.int32))


@pytest.mark.devices(4)
def test_roc_auc_pmap_all_gather():
    n = 32
    scores = RNG.normal(size=n).astype(np.float32)
    labels = RNG.integers(0, 2, n).astype(np.int32)
    auc = metrics.ROCAUC(capacity=8)
    full = run(metrics.ROCAUC(capacity=n), scores, labels)

    def per_device(s, y):
        state = auc.update(auc.init(), s, y)
        return auc.compute(jax.lax.all_gather(state, "batch"))

    out = jax.pmap(per_device, axis_name="batch")(scores.reshape(4, 8), labels.reshape(4, 8))
    close(out, np.full(4, full))
    # Per-device states brought back from pmap pool the same way.
    states = jax.pmap(lambda s, y: auc.update(auc.init(), s, y))(scores.reshape(4, 8), labels.reshape(4, 8))
    close(compute(auc, states), full)


def test_roc_auc_errors():
    with pytest.raises(
        ValueError,
        match=r"ROCAUC: capacity is required.*"
        r"ROCAUC\(capacity=len\(eval_labels\)\)",
    ):
        metrics.ROCAUC()
    with pytest.raises(ValueError, match=r"capacity must be a positive int"):
        metrics.ROCAUC(0)
    auc = metrics.ROCAUC(8)
    with pytest.raises(
        ValueError,
        match=r"predictions of shape \(3, 2\) do not fit labels of "
        r"shape \(3,\).*positive class's column, predictions\[..., 1\]",
    ):
        auc.update(auc.init(), np.ones((3, 2)), np.ones(3, np.int32))
    with pytest.raises(TypeError, match=r"labels must be 0/1 integers or bools"):
        auc.update(auc.init(), np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match=r"ROCAUC.update: the state does not fit"):
        auc.update(metrics.ROCAUC(4).init(), np.ones(3), np.ones(3, np.int32))


# --------------------------------------------------------------------------- #
# scikit-learn parity, where it is installed.
# --------------------------------------------------------------------------- #


def test_f1_matches_sklearn():
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    size, c = 40, 5
    f1 = {average: metrics.F1(average, num_classes=c) for average in ("micro", "macro", "weighted", None)}
    binary = {zd: metrics.F1(zero_division=zd) for zd in (0.0, 1.0)}
    for trial in range(40):
        # One shape for every trial (one compilation): the mask marks the n real pairs.
        n, k = int(rng.integers(1, size + 1)), int(rng.integers(2, c + 1))  # k classes occur
        y, p = rng.integers(0, k, size), rng.integers(0, k, size)
        mask = np.arange(size) < n
        for average, metric in f1.items():
            want = (
                skm.f1_score(y[:n], p[:n], average=average)
                if average
                else skm.f1_score(y[:n], p[:n], average=None, labels=range(c), zero_division=0)
            )
            close(run(metric, p, y, mask), want)
        for zd, metric in binary.items():
            close(run(metric, p % 2, y % 2, mask), skm.f1_score(y[:n] % 2, p[:n] % 2, zero_division=zd))


def test_roc_auc_matches_sklearn():
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    auc = metrics.ROCAUC(capacity=64)
    update = _jitted(auc)[0]
    for trial in range(30):
        n = int(rng.integers(2, 60))
        y = rng.integers(0, 2, n)
        if y.min() == y.max():
            y[0] = 1 - y[0]
        s = rng.integers(0, 4, n).astype(np.float32) if trial % 2 else rng.normal(size=n).astype(np.float32)
        state = auc.init()
        for i in range(0, n, 7):
            state = update(state, s[i : i + 7], y[i : i + 7])
        close(compute(auc, state), skm.roc_auc_score(y, s))
