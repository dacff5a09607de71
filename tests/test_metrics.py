"""funcnet.metrics against NumPy references; jit, tree-add and pmap merging."""

import jax
import numpy as np
import pytest

from funcnet import metrics

RNG = np.random.default_rng(0)
B, C = 24, 4
LOGITS = RNG.normal(size=(B, C)).astype(np.float32)
LABELS = RNG.integers(0, C, size=(B,)).astype(np.int32)
MASK = RNG.uniform(size=(B,)) > 0.3
PRED = RNG.normal(size=(B, 3)).astype(np.float32)
TARGET = RNG.normal(size=(B, 3)).astype(np.float32)
LOSS = RNG.uniform(size=(B,)).astype(np.float32)
WEIGHTS = RNG.uniform(0.1, 2, size=(B,)).astype(np.float32)


def run(metric, *args, **kwargs):
    return metric.compute(metric.update(metric.init(), *args, **kwargs))


def confusion_reference(y_true, y_pred, n, mask=None):
    m = np.zeros((n, n), np.int64)
    for i, (a, b) in enumerate(zip(y_true, y_pred)):
        if (mask is None or mask[i]) and 0 <= a < n and 0 <= b < n:
            m[a, b] += 1
    return m


def test_accuracy():
    pred = LOGITS.argmax(-1)
    np.testing.assert_allclose(run(metrics.Accuracy(), LOGITS, LABELS), np.mean(pred == LABELS))
    np.testing.assert_allclose(run(metrics.Accuracy(), pred, LABELS), np.mean(pred == LABELS))
    np.testing.assert_allclose(
        run(metrics.Accuracy(), LOGITS, LABELS, MASK), np.sum((pred == LABELS) & MASK) / MASK.sum(), rtol=1e-6
    )
    # Sequence labels: (B, T) ids with (B, T, C) scores.
    seq = LOGITS.reshape(6, 4, C)
    np.testing.assert_allclose(run(metrics.Accuracy(), seq, LABELS.reshape(6, 4)), np.mean(pred == LABELS))
    assert np.isnan(metrics.Accuracy().compute(metrics.Accuracy().init()))


def test_topk_accuracy():
    order = np.argsort(-LOGITS, axis=-1)
    for k in (1, 2, 3, C):
        expected = np.mean([LABELS[i] in order[i, :k] for i in range(B)])
        np.testing.assert_allclose(run(metrics.TopKAccuracy(k), LOGITS, LABELS), expected)
    expected = np.sum([(LABELS[i] in order[i, :2]) and MASK[i] for i in range(B)]) / MASK.sum()
    np.testing.assert_allclose(run(metrics.TopKAccuracy(2), LOGITS, LABELS, mask=MASK), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="exceeds"):
        run(metrics.TopKAccuracy(C + 1), LOGITS, LABELS)
    with pytest.raises(ValueError, match="k must be"):
        metrics.TopKAccuracy(0)


def test_mean_and_errors():
    np.testing.assert_allclose(run(metrics.Mean(), LOSS), LOSS.mean(), rtol=1e-6)
    np.testing.assert_allclose(run(metrics.Mean(), LOSS, WEIGHTS), np.sum(LOSS * WEIGHTS) / WEIGHTS.sum(), rtol=1e-6)
    np.testing.assert_allclose(run(metrics.Mean(), 2.5), 2.5)
    err = PRED.astype(np.float64) - TARGET
    np.testing.assert_allclose(run(metrics.MSE(), PRED, TARGET), np.mean(err**2), rtol=1e-6)
    np.testing.assert_allclose(run(metrics.MAE(), PRED, TARGET), np.mean(np.abs(err)), rtol=1e-6)
    np.testing.assert_allclose(run(metrics.RMSE(), PRED, TARGET), np.sqrt(np.mean(err**2)), rtol=1e-6)
    row_mask = MASK[:, None]
    np.testing.assert_allclose(
        run(metrics.MSE(), PRED, TARGET, row_mask), np.sum(err**2 * row_mask) / (3 * MASK.sum()), rtol=1e-6
    )
    with pytest.raises(ValueError, match="same shape"):
        run(metrics.MSE(), PRED, TARGET[:, :2])
    with pytest.raises(ValueError, match="weights"):
        run(metrics.Mean(), LOSS, WEIGHTS[:5])


def test_confusion_matrix():
    pred = LOGITS.argmax(-1)
    np.testing.assert_array_equal(run(metrics.ConfusionMatrix(C), LOGITS, LABELS), confusion_reference(LABELS, pred, C))
    np.testing.assert_array_equal(
        run(metrics.ConfusionMatrix(C), pred, LABELS, MASK), confusion_reference(LABELS, pred, C, MASK)
    )
    # Rows are true classes: one sample of class 0 predicted as 2 lands at [0, 2].
    m = run(metrics.ConfusionMatrix(3), np.array([2]), np.array([0]))
    assert m[0, 2] == 1 and m.sum() == 1
    # Out-of-range ids (e.g. a padding label -1) are not counted, nothing wraps.
    labels = np.array([0, -1, 3, 1])
    m = run(metrics.ConfusionMatrix(3), np.array([0, 2, 1, 1]), labels)
    np.testing.assert_array_equal(m, confusion_reference(labels, [0, 2, 1, 1], 3))


def test_bad_inputs():
    acc = metrics.Accuracy()
    with pytest.raises(TypeError, match="integer class ids"):
        acc.update(acc.init(), LOGITS[:, 0], LABELS)  # float preds, labels' shape
    with pytest.raises(TypeError, match="labels must be integer"):
        acc.update(acc.init(), LOGITS, LABELS.astype(np.float32))
    with pytest.raises(ValueError, match="do not fit"):
        acc.update(acc.init(), LOGITS[:5], LABELS)
    with pytest.raises(ValueError, match="mask"):
        acc.update(acc.init(), LOGITS, LABELS, MASK[:3])
    with pytest.raises(ValueError, match="scores have"):
        metrics.ConfusionMatrix(C + 1).update(metrics.ConfusionMatrix(C + 1).init(), LOGITS, LABELS)


def test_collection():
    col = metrics.collection(acc=metrics.Accuracy(), loss=metrics.Mean(), mse=metrics.MSE())
    state = col.update(col.init(), acc=(LOGITS, LABELS), loss=LOSS, mse={"predictions": PRED, "labels": TARGET})
    state = col.update(state, loss=(LOSS[:4],))  # partial update: others unchanged
    out = col.compute(state)
    assert set(out) == {"acc", "loss", "mse"}
    np.testing.assert_allclose(out["acc"], np.mean(LOGITS.argmax(-1) == LABELS))
    np.testing.assert_allclose(out["loss"], np.concatenate([LOSS, LOSS[:4]]).mean(), rtol=1e-6)
    np.testing.assert_allclose(out["mse"], np.mean((PRED - TARGET) ** 2), rtol=1e-6)
    with pytest.raises(ValueError, match="no metric named"):
        col.update(col.init(), accuracy=(LOGITS, LABELS))
    with pytest.raises(TypeError, match="Call the constructor"):
        metrics.collection(acc=metrics.Accuracy)


def _everything():
    return metrics.collection(
        acc=metrics.Accuracy(),
        top2=metrics.TopKAccuracy(2),
        loss=metrics.Mean(),
        rmse=metrics.RMSE(),
        mae=metrics.MAE(),
        cm=metrics.ConfusionMatrix(C),
    )


def _update(col, state, logits, labels, mask, loss, w, pred, target):
    return col.update(
        state,
        acc=(logits, labels, mask),
        top2=(logits, labels, mask),
        loss=(loss, w),
        rmse=(pred, target),
        mae=(pred, target),
        cm=(logits, labels, mask),
    )


ARGS = (LOGITS, LABELS, MASK, LOSS, WEIGHTS, PRED, TARGET)


def _assert_tree_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5)


def test_jit_and_tree_add_equals_concatenation():
    col = _everything()
    full = col.compute(_update(col, col.init(), *ARGS))
    step = jax.jit(lambda s, *a: _update(col, s, *a))
    parts = [step(col.init(), *[a[i : i + 8] for a in ARGS]) for i in range(0, B, 8)]
    added = jax.tree.map(lambda *xs: sum(xs), *parts)
    _assert_tree_close(col.compute(added), full)
    # Sequential jitted updates give the same as well.
    state = col.init()
    for i in range(0, B, 8):
        state = step(state, *[a[i : i + 8] for a in ARGS])
    _assert_tree_close(jax.jit(col.compute)(state), full)
    np.testing.assert_allclose(full["acc"], np.sum((LOGITS.argmax(-1) == LABELS) & MASK) / MASK.sum(), rtol=1e-6)


@pytest.mark.devices(4)
def test_merge_under_pmap():
    devices = 4
    col = _everything()
    full = col.compute(_update(col, col.init(), *ARGS))

    def per_device(*args):
        return col.compute(metrics.merge(_update(col, col.init(), *args), "batch"))

    sharded = [a.reshape((devices, -1) + a.shape[1:]) for a in ARGS]
    out = jax.pmap(per_device, axis_name="batch")(*sharded)
    for d in range(devices):
        _assert_tree_close(jax.tree.map(lambda x: x[d], out), full)


def test_another_metrics_state_is_a_clear_error_not_a_key_error():
    acc, mean, cm = metrics.Accuracy(), metrics.Mean(), metrics.ConfusionMatrix(C)
    with pytest.raises(
        ValueError,
        match=r"funcnet.metrics.Accuracy.update: the state does not "
        r"fit this metric: it expects \{'correct': int32\[\], 'count': int32\[\]\}, "
        r"got \{'total': float32\[\], 'weight': float32\[\]\}.*init\(\)",
    ):
        acc.update(mean.init(), LOGITS, LABELS)
    with pytest.raises(ValueError, match=r"Accuracy.compute: the state does not fit"):
        acc.compute(mean.init())
    with pytest.raises(ValueError, match=r"ConfusionMatrix.update: .*int32\[4, 4\].*int32\[5, 5\]"):
        cm.update(metrics.ConfusionMatrix(C + 1).init(), LOGITS, LABELS)
    col = metrics.collection(acc=acc, loss=mean)
    with pytest.raises(
        ValueError,
        match=r"collection.update: the state does not fit this "
        r"collection: it expects a dict of \['acc', 'loss'\], got "
        r"\{'correct': int32\[\], 'count': int32\[\]\}",
    ):
        col.update(acc.init(), acc=(LOGITS, LABELS))
    swapped = {"acc": mean.init(), "loss": acc.init()}
    with pytest.raises(
        ValueError,
        match=r"collection.compute: state\['acc'\] does not fit "
        r"metric 'acc' \(funcnet.metrics.Accuracy\)",
    ):
        col.compute(swapped)
    # A leading axis (per-device states from pmap) still computes, one value per device.
    per_device = jax.tree.map(lambda x: np.stack([x] * 2), acc.update(acc.init(), LOGITS, LABELS))
    assert acc.compute(per_device).shape == (2,)


def test_accuracy_with_one_hot_labels_says_so():
    acc = metrics.Accuracy()
    one_hot = np.eye(C, dtype=np.int32)[LABELS]
    with pytest.raises(
        ValueError,
        match=r"labels of shape \(24, 4\) look one-hot.*"
        r"argmax\(-1\).*class ids",
    ):
        acc.update(acc.init(), LOGITS, one_hot)
    with pytest.raises(ValueError, match=r"look one-hot"):
        metrics.TopKAccuracy(2).update(acc.init(), LOGITS, one_hot)
