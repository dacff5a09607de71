"""fit's host batches from any framework: every leaf goes through np.asarray once, at the
host boundary (funcnet.loop._sources.host_arrays), or fails naming its type and batch."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import losses
from funcnet.loop._sources import host_arrays
from funcnet.loop import FitOptions, fit
from funcnet.train import Aux
from helpers.torch_ref import torch
from helpers.training import X, Y, fit_setup, mlp, params_equal

N = 128  # 4 batches of 32: enough steps to compare, small enough to stay fast


def _numpy_batches():
    return [[X[i : i + 32], Y[i : i + 32]] for i in range(0, N, 32)]


def _without_times(history):
    return [{k: v for k, v in h.items() if k not in ("seconds", "samples_per_s")} for h in history]


def _fit(train, eval_data, **kw):
    ts, loss_fn, opt, _, base = fit_setup(dropout=0.3)
    return fit(ts, loss_fn, opt, train, epochs=2, **dict(base, eval_data=eval_data, **kw))


@pytest.mark.parametrize("prefetch", [0, 2])  # converted here, or in the background thread
def test_a_torch_dataloader_trains_to_the_numpy_batches_params_bit_for_bit(prefetch):
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(X[:N]), torch.from_numpy(Y[:N]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=32)
    ref, h_ref = _fit(_numpy_batches(), _numpy_batches(), options=FitOptions(prefetch=prefetch))
    got, h_got = _fit(loader, loader, options=FitOptions(prefetch=prefetch))
    params_equal((got.params, got.opt_state), (ref.params, ref.opt_state))
    assert _without_times(h_got) == _without_times(h_ref)  # eval batches converted too


def test_a_dataloader_of_dict_batches_trains_like_its_numpy_twin():
    rows = [{"x": torch.from_numpy(X[i]), "y": torch.tensor(int(Y[i]))} for i in range(N)]
    loader = torch.utils.data.DataLoader(rows, batch_size=32)  # collated to dicts of tensors
    as_numpy = [{"x": X[i : i + 32], "y": Y[i : i + 32].astype(np.int64)} for i in range(0, N, 32)]
    ts, _, opt, _, _ = fit_setup(dropout=0.0)
    net = mlp(0.0)

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch["x"], rng=rng, train=True)
        return losses.cross_entropy(logits, batch["y"]), Aux(state=state)

    got, _ = fit(ts, loss_fn, opt, loader, epochs=2, progress=False)
    ref, _ = fit(ts, loss_fn, opt, as_numpy, epochs=2, progress=False)
    params_equal(got.params, ref.params)


class _EagerTensor:
    """What a tf.data (or grain) iterator yields: not NumPy, but readable by np.asarray."""

    def __init__(self, value):
        self._value = value

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._value, dtype=dtype)


class _TfDataLike:
    def __iter__(self):
        return ((_EagerTensor(x), _EagerTensor(y)) for x, y in _numpy_batches())


def test_a_tf_data_like_iterable_of_array_likes_trains():
    ref, _ = _fit(_numpy_batches(), _numpy_batches())
    got, _ = _fit(_TfDataLike(), _TfDataLike())
    params_equal(got.params, ref.params)


def test_numpy_and_jax_batches_pass_through_without_a_copy():
    batch = (X[:4], jnp.asarray(Y[:4]), 3)
    assert host_arrays(batch, "train_data", 0, 0) is batch
    converted = host_arrays({"x": _EagerTensor(X[:4])}, "train_data", 0, 0)
    assert type(converted["x"]) is np.ndarray and converted["x"].dtype == np.float32


def test_a_torch_cpu_tensor_is_read_in_place():
    t = torch.from_numpy(X[:4].copy())
    converted = host_arrays([t], "train_data", 0, 0)[0]
    assert np.shares_memory(converted, t.numpy())


def _bad_in_epoch_1(bad):
    good = _numpy_batches()
    return lambda epoch: good[:2] + [[X[64:96], bad]] if epoch == 1 else good


@pytest.mark.parametrize(
    "bad, kind", [(np.array(["cat"] * 32), "numpy.ndarray"), ("labels", "str"), (object(), "object")]
)
def test_a_leaf_that_is_not_numbers_names_its_type_batch_and_the_fix(bad, kind):
    ts, loss_fn, opt, _, _ = fit_setup(dropout=0.0)
    with pytest.raises(
        TypeError,
        match=re.escape(
            f"fit: batch 2 of epoch 1 of train_data has a leaf [1] of type {kind} that is not an array of numbers"
        ),
    ) as info:
        fit(ts, loss_fn, opt, _bad_in_epoch_1(bad), epochs=2, progress=False)
    assert "np.asarray" in str(info.value) and "token or class ids" in str(info.value)
    assert int(info.value.train_state.step) == 4 + 2  # the batches before it were trained


def test_an_unusable_first_batch_fails_before_training():
    ts, loss_fn, opt, _, kw = fit_setup(dropout=0.0)
    eval_data = [[X[:32], np.array([None] * 32)]]
    with pytest.raises(
        TypeError,
        match=r"batch 0 of epoch 0 of eval_data .* numpy\.ndarray "
        r".*dtype object",
    ) as info:
        fit(ts, loss_fn, opt, _numpy_batches(), epochs=1, **dict(kw, eval_data=eval_data))
    assert not hasattr(info.value, "train_state")  # raised by the checks before the first step


def test_a_torch_tensor_numpy_cannot_read_says_to_detach_it():
    x = torch.from_numpy(X[:32]).requires_grad_()
    y = torch.from_numpy(Y[:32])
    ts, loss_fn, opt, _, _ = fit_setup(dropout=0.0)
    with pytest.raises(
        TypeError,
        match=r"leaf \[0\] of type torch\.Tensor .*RuntimeError.*"
        r"tensor\.detach\(\)\.cpu\(\)",
    ):
        fit(ts, loss_fn, opt, [[x, y]], epochs=1, progress=False)
