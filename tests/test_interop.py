"""torch state_dicts into funcnet params: a CNN with BatchNorm, an LSTM classifier and
multi-head attention give torch's eval outputs; mismatches name both sides."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.torch_ref import HAVE_TORCH, torch

import funcnet
from funcnet import layers as L
from funcnet.errors import MismatchError
from funcnet.interop import StateDictMismatchError, load_torch_state_dict

if HAVE_TORCH:
    torch.manual_seed(0)


def _tree_ok(params, new):
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new)):
        assert a.shape == b.shape and a.dtype == b.dtype


def test_cnn_with_batchnorm_and_transposed_convs_gives_torchs_eval_outputs():
    tnet = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(8, 4, 2, stride=2),
        torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(4, 4, 3),  # square: named below
        torch.nn.Conv2d(4, 4, 3, padding=1),  # square and plain
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    )
    x = torch.randn(2, 3, 9, 9)
    tnet.train()
    tnet(torch.randn(6, 3, 9, 9) * 2 + 1)  # running statistics worth loading
    tnet.eval()
    want = tnet(x).detach().numpy()

    net = funcnet.serial(
        L.Conv(8, (3, 3)),
        L.BatchNorm(),
        L.Relu,
        L.ConvTranspose(4, (2, 2), strides=(2, 2)),
        L.Relu,
        L.ConvTranspose(4, (3, 3)),
        L.Conv(4, (3, 3), padding="SAME"),
        L.GlobalAvgPool,
        L.Dense(5),
    )
    _, params, state = net.init(jax.random.key(0), (-1, 9, 9, 3))
    new_p, new_s = load_torch_state_dict(params, state, tnet.state_dict(), conv_transpose=["5"])
    _tree_ok(params, new_p)
    got, _ = net.apply(new_p, new_s, jnp.asarray(x.numpy().transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(new_s[1]["var"]), tnet[1].running_var.numpy(), rtol=1e-6)


def test_lstm_classifier_from_numpy_arrays():
    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 8)
            self.lstm = torch.nn.LSTM(8, 6, num_layers=2, bidirectional=True, batch_first=True)
            self.fc = torch.nn.Linear(12, 3)

        def forward(self, ids):
            _, (h, _) = self.lstm(self.emb(ids))
            return self.fc(torch.cat([h[-2], h[-1]], dim=-1))

    tnet = Classifier().eval()
    ids = torch.randint(0, 20, (4, 7))
    want = tnet(ids).detach().numpy()
    net = funcnet.serial(
        L.Embedding(20, 8), L.LSTM(6, num_layers=2, bidirectional=True, return_sequences=False), L.Dense(3)
    )
    _, params, state = net.init(jax.random.key(0), (-1, 7))
    numpy_dict = {k: v.numpy() for k, v in tnet.state_dict().items()}  # no torch needed
    new_p, new_s = load_torch_state_dict(params, state, numpy_dict)
    got, _ = net.apply(new_p, new_s, jnp.asarray(ids.numpy()))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_multihead_attention_in_proj_is_split():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.attn(x, x, x, need_weights=False)[0])

    tnet = Block().eval()
    x = torch.randn(2, 5, 16)
    net = funcnet.serial(L.MultiHeadAttention(2), L.Dense(4))
    _, params, state = net.init(jax.random.key(0), (-1, 5, 16))
    new_p, new_s = load_torch_state_dict(params, state, tnet.state_dict())
    got, _ = net.apply(new_p, new_s, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(got), tnet(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_mismatches_name_the_funcnet_path_and_the_torch_key():
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    net = funcnet.serial(L.Dense(8), L.Relu, L.Dense(3))
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    with pytest.raises(
        StateDictMismatchError,
        match=r"'2/W' has shape \(8, 3\) but torch's "
        r"'2.weight' converts to \(8, 2\)",
    ):
        load_torch_state_dict(params, state, tnet.state_dict())
    with pytest.raises(StateDictMismatchError, match=r"2 layers with weights .* 1 modules"):
        load_torch_state_dict(params, state, {k: v for k, v in tnet.state_dict().items() if k.startswith("0.")})
    extra = dict(tnet.state_dict(), **{"2.scale": torch.ones(2)})
    net2 = funcnet.serial(L.Dense(8), L.Relu, L.Dense(2))
    _, p2, s2 = net2.init(jax.random.key(0), (-1, 4))
    with pytest.raises(StateDictMismatchError, match=r"unexpected key\(s\) in state_dict: \['2.scale'\]"):
        load_torch_state_dict(p2, s2, extra)
    missing = {k: v for k, v in tnet.state_dict().items() if k != "2.bias"}
    with pytest.raises(StateDictMismatchError, match=r"missing key\(s\) in state_dict: \['2.bias'\]"):
        load_torch_state_dict(p2, s2, missing)


def test_missing_and_unexpected_keys_of_the_whole_model_are_listed_in_one_error():
    tnet = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    net = funcnet.serial(L.Dense(8), L.Relu, L.Dense(8), L.Relu, L.Dense(2))
    _, params, state = net.init(jax.random.key(0), (-1, 4))
    sd = {k: v.numpy() for k, v in tnet.state_dict().items() if k not in ("0.bias", "4.bias")}
    sd.update({"2.extra": np.ones(1), "4.extra": np.ones(1)})
    sd["2.weight"] = np.ones((8, 7), np.float32)  # and a shape, in the same error
    with pytest.raises(MismatchError) as info:  # the error type
        load_torch_state_dict(params, state, sd)
    e = info.value
    assert isinstance(e, StateDictMismatchError) and isinstance(e, ValueError)
    assert e.missing == ["0.bias", "4.bias"] and e.unexpected == ["2.extra", "4.extra"]
    assert (
        "missing key(s) in state_dict: ['0.bias', '4.bias']; unexpected key(s) in state_dict: ['2.extra', '4.extra']"
    ) in str(e)
    assert "'2/W' has shape (8, 8) but torch's '2.weight' converts to (7, 8)" in str(e)


def test_conv1d_layernorm_gru_and_rnn_give_torchs_eval_outputs():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(2, 5, 3)
            self.norm = torch.nn.LayerNorm(5)
            self.gru = torch.nn.GRU(5, 4, num_layers=2, bidirectional=True, batch_first=True)
            self.rnn = torch.nn.RNN(8, 3, batch_first=True)
            self.fc = torch.nn.Linear(3, 2)

        def forward(self, x):  # x: (N, L, C), as funcnet's
            h = self.norm(self.conv(x.transpose(1, 2)).transpose(1, 2))
            _, h_n = self.rnn(self.gru(h)[0])
            return self.fc(h_n[0])

    tnet = Net().eval()
    with torch.no_grad():  # LayerNorm's affine away from 1, 0
        tnet.norm.weight.uniform_(0.5, 1.5)
        tnet.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 9, 2)
    net = funcnet.serial(
        L.Conv(5, (3,)),
        L.LayerNorm(),
        L.GRU(4, num_layers=2, bidirectional=True),
        L.RNN(3, return_sequences=False),
        L.Dense(2),
    )
    _, params, state = net.init(jax.random.key(0), (-1, 9, 2))
    new_p, new_s = load_torch_state_dict(params, state, tnet.state_dict())
    _tree_ok(params, new_p)
    got, _ = net.apply(new_p, new_s, jnp.asarray(x.numpy()))
    np.testing.assert_allclose(np.asarray(got), tnet(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new_p[1]["scale"]), tnet.norm.weight.detach().numpy())
