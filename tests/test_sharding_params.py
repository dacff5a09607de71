"""Sharding a model's params and optimizer state by rules (funcnet.sharding): FSDP,
tensor parallel, in the step, in fit and through checkpoints, on 4 simulated CPU devices.

Every training case is checked against the same step on one device (SGD with
momentum, whose update is linear in the gradient: Adam's scale invariance would hide
a gradient N times too large), and its outputs must keep the layout they came in
with.
"""

import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import funcnet
from funcnet import callbacks, checkpoint, data, distributed, losses, sharding
from funcnet.loop._resume import EpochSums
from funcnet.layers import Dense, LayerNorm, Relu
from funcnet.models import GPT
from funcnet.train import Aux, TrainState, make_train_step

OPT = optax.sgd(0.1, momentum=0.9)


def _mlp():
    return funcnet.serial(Dense(64), Relu, Dense(32), LayerNorm(), Relu, Dense(8))


def _mlp_case():
    net = _mlp()
    ts = TrainState.create(net, OPT, jax.random.key(0), (-1, 18))

    def loss_fn(params, state, batch, rng):
        out, state = net.apply(params, state, batch[0])
        return jnp.mean((out - batch[1]) ** 2), Aux(state=state)

    r = np.random.default_rng(0)
    batch = (r.normal(size=(16, 18)).astype(np.float32), r.normal(size=(16, 8)).astype(np.float32))
    return ts, loss_fn, batch


def _gpt_case():
    net = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, bias=True)
    ts = TrainState.create(net, OPT, jax.random.key(0), (-1, 16))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch[0])
        return losses.cross_entropy(logits.reshape(-1, 64), batch[1].reshape(-1)), Aux(state=state)

    r = np.random.default_rng(0)
    batch = tuple(r.integers(0, 64, (8, 16)).astype(np.int32) for _ in range(2))
    return ts, loss_fn, batch


def _mesh(shape=(4,), names=("data",), auto=False):
    kind = AxisType.Auto if auto else AxisType.Explicit
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(names))


def _two_steps(step, ts, batch, mesh=None):
    if mesh is None:
        f = jax.jit(step)
        ts, _ = f(ts, batch)
        return f(ts, batch)[0]
    batch = distributed.shard_batch(mesh, batch)
    with jax.set_mesh(mesh):
        f = jax.jit(step, donate_argnums=0)
        ts, _ = f(ts, batch)
        return f(ts, batch)[0]


def _assert_same_layout(got, want):
    for (path, a), b in zip(funcnet.paths(got).items(), jax.tree.leaves(want)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            continue
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim), (
            f"{path}: came in as {b.sharding.spec}, left as {a.sharding.spec}"
        )


def _assert_close(got, want, tol=1e-5):
    for (path, a), b in zip(funcnet.paths(got).items(), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol, err_msg=path)


# --------------------------------------------------------------------------- #
# Rules and placement
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_first_matching_rule_wins_by_re_search_and_the_rest_is_replicated():
    ts, _, _ = _mlp_case()
    mesh = _mesh()
    rules = [(r"0/W$", P(None, "data")), (r"W$", P("data", None)), (r"5/b", P("data"))]
    specs = sharding.param_specs(ts.params, mesh, rules)
    got = {k: v for k, v in funcnet.paths(specs).items()}
    assert got["0/W"] == P(None, "data")  # the first rule, though the second matches
    assert got["2/W"] == P("data", None)  # re.search: "W$" is found in "2/W"
    assert got["5/W"] == P("data", None)
    assert got["5/b"] == P("data")
    assert got["0/b"] == P() and got["3/scale"] == P()  # no rule: replicated
    placed = sharding.shard_params(ts.params, mesh, rules)
    for (path, x), orig in zip(funcnet.paths(placed).items(), jax.tree.leaves(ts.params)):
        assert x.sharding == NamedSharding(mesh, got[path])
        np.testing.assert_array_equal(np.asarray(x), np.asarray(orig))
    assert placed[0]["W"].addressable_shards[0].data.shape == (18, 16)


@pytest.mark.devices(4)
def test_train_state_optimizer_moments_follow_their_params():
    net = _mlp()
    for opt in (
        optax.adam(1e-3),
        optax.sgd(0.1, momentum=0.9),
        funcnet.optim.adamw(1e-3, weight_decay=0.1, mask=funcnet.kernel_mask),
        funcnet.freeze(optax.adam(1e-3), lambda p: funcnet.subtree_mask(p, "0")),
    ):
        ts = TrainState.create(net, opt, jax.random.key(0), (-1, 18))
        if isinstance(ts.opt_state, tuple) and not jax.tree.leaves(ts.opt_state):
            continue
        placed = sharding.shard_params(ts, _mesh(), sharding.fsdp_rules(min_size=0))
        params = funcnet.paths(placed.params)
        mirrored = 0
        for path, x in funcnet.paths(placed.opt_state).items():
            owner = [k for k in params if path.endswith("/" + k)]
            if owner and x.shape == params[owner[0]].shape:
                assert x.sharding.spec == params[owner[0]].sharding.spec, path
                mirrored += 1
            else:
                assert x.sharding.is_fully_replicated, path  # counts and the like
        assert mirrored >= len(params) // 2, opt
        assert placed.rng.sharding.is_fully_replicated and placed.step.sharding.is_fully_replicated


@pytest.mark.devices(4)
def test_fsdp_splits_the_largest_divisible_dimension_and_replicates_the_small():
    spec = sharding.fsdp("data", min_size=100)
    mesh = _mesh()
    assert spec((64, 20), mesh) == P("data", None)
    assert spec((20, 64), mesh) == P(None, "data")
    assert spec((6, 64, 64), mesh) == P(None, "data", None)  # ties: the first
    assert spec((7, 33), mesh) == P()  # nothing divides: whole
    assert spec((8,), mesh) == P()  # small: whole
    assert sharding.fsdp_rules("data", 0)[0][0] == ".*"


@pytest.mark.devices(4)
def test_explain_reports_one_nth_per_device_under_fsdp():
    net = funcnet.serial(Dense(512), Relu, Dense(512), Relu, Dense(16))
    ts = TrainState.create(net, optax.adam(1e-3), jax.random.key(0), (-1, 256))
    mesh = _mesh()
    full = sharding.explain(distributed.replicate_on(mesh, ts), print_fn=None)
    lines = []
    fsdp = sharding.explain(sharding.shard_params(ts, mesh, sharding.fsdp_rules()), print_fn=lines.append)
    assert full.bytes_per_device == full.bytes_total
    assert fsdp.bytes_total == full.bytes_total
    assert fsdp.bytes_per_device <= 1.1 * full.bytes_per_device / 4
    assert "P('data', None)" in lines[0] and "params/0/W" in lines[0]


# --------------------------------------------------------------------------- #
# The step
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
@pytest.mark.devices(4)
def test_fsdp_step_equals_one_device_and_keeps_the_layout(auto):
    ts, loss_fn, batch = _mlp_case()
    step = make_train_step(loss_fn, OPT)
    want = _two_steps(step, ts, batch)
    mesh = _mesh(auto=auto)
    placed = sharding.shard_params(ts, mesh, sharding.fsdp_rules(min_size=0))
    assert placed.params[0]["W"].sharding.spec == P(None, "data")
    assert placed.params[2]["W"].sharding.spec == P("data", None)  # split over the batch's axis
    inputs = jax.tree.leaves(placed)
    got = _two_steps(step, placed, batch, mesh)
    _assert_close(got.params, want.params)
    _assert_same_layout(got, placed)
    assert all(x.is_deleted() for x in inputs if not jnp.issubdtype(x.dtype, jax.dtypes.prng_key))


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
@pytest.mark.devices(4)
def test_tensor_parallel_and_2d_layouts_equal_one_device(auto):
    ts, loss_fn, batch = _mlp_case()
    step = make_train_step(loss_fn, OPT)
    want = _two_steps(step, ts, batch)
    mesh = _mesh((2, 2), ("data", "model"), auto=auto)
    for rules in (
        sharding.megatron_rules(column=["0"], row=["2"]),
        sharding.megatron_rules(column=["0"], row=["2"], fsdp_axis="data") + sharding.fsdp_rules("data", min_size=0),
    ):
        placed = sharding.shard_params(ts, mesh, rules)
        assert placed.params[0]["W"].sharding.spec[-1] == "model"  # column-parallel
        assert placed.params[2]["W"].sharding.spec[0] == "model"  # row-parallel
        got = _two_steps(step, placed, batch, mesh)
        _assert_close(got.params, want.params)
        _assert_same_layout(got, placed)


@functools.cache
def _gpt_one_device():
    """The GPT case's two steps on one device (as host arrays), shared by the layouts."""
    ts, loss_fn, batch = _gpt_case()
    return jax.device_get(_two_steps(make_train_step(loss_fn, OPT), ts, batch))


# Pure tensor parallel, 2-D and Auto meshes are also checked on the MLP above; the GPT
# adds attention's head split and the tied embedding (on Explicit meshes only).
@pytest.mark.parametrize("layout", ["fsdp", "megatron", "megatron+fsdp"])
@pytest.mark.devices(4)
def test_gpt_sharded_step_equals_one_device(layout):
    ts, loss_fn, batch = _gpt_case()
    step = make_train_step(loss_fn, OPT)
    want = _gpt_one_device()
    if layout.startswith("fsdp"):
        mesh, rules = _mesh(auto=layout.endswith("auto")), sharding.fsdp_rules(min_size=0)
    else:
        mesh = _mesh((2, 2), ("data", "model"))
        rules = sharding.megatron_rules(fsdp_axis="data" if "fsdp" in layout else None)
        rules += sharding.fsdp_rules("data", min_size=0) if "fsdp" in layout else []
    placed = sharding.shard_params(ts, mesh, rules)
    if "megatron" in layout:
        qkv = placed.params["body"]["blocks"][0]["attn"]["attn"]["query"]["W"]
        assert "model" in qkv.sharding.spec
        assert ("data" in qkv.sharding.spec) == ("fsdp" in layout)
    got = _two_steps(step, placed, batch, mesh)
    _assert_close(got.params, want.params)
    _assert_same_layout(got, placed)


# --------------------------------------------------------------------------- #
# fit and checkpoints
# --------------------------------------------------------------------------- #


def _fit_data():
    r = np.random.default_rng(1)
    return r.normal(size=(64, 18)).astype(np.float32), r.normal(size=(64, 8)).astype(np.float32)


@pytest.mark.parametrize("layout", ["fsdp", "2d"])
@pytest.mark.devices(4)
def test_fit_keeps_a_sharded_state_and_equals_one_device(layout):
    ts, loss_fn, _ = _mlp_case()
    arrays = _fit_data()
    want, _ = funcnet.fit(ts, loss_fn, OPT, data.DeviceData(arrays, 16, shuffle=True, rng=0), epochs=2)
    if layout == "fsdp":
        mesh, rules = _mesh(), sharding.fsdp_rules(min_size=0)
    else:
        mesh = _mesh((2, 2), ("data", "model"))
        rules = sharding.megatron_rules(column=["0"], row=["2"]) + sharding.fsdp_rules("data", 0)
    placed = sharding.shard_params(ts, mesh, rules)
    for train in (
        data.DeviceData(arrays, 16, shuffle=True, rng=0),
        lambda e: data.batches(arrays, 16, shuffle=True, rng=0, epoch=e),
    ):
        got, _ = funcnet.fit(placed, loss_fn, OPT, train, epochs=2, mesh=mesh)
        _assert_close(got.params, want.params)
        _assert_same_layout(got, placed)


@pytest.mark.devices(4)
def test_fit_resumes_a_sharded_state_from_orbax_in_its_shardings(tmp_path):
    pytest.importorskip("orbax.checkpoint")
    ts, loss_fn, _ = _mlp_case()
    arrays = _fit_data()
    mesh = _mesh()
    placed = sharding.shard_params(ts, mesh, sharding.fsdp_rules(min_size=0))
    train = data.DeviceData(arrays, 16, shuffle=True, rng=0)
    full, _ = funcnet.fit(placed, loss_fn, OPT, train, epochs=2, mesh=mesh)
    ck = callbacks.Checkpoint(tmp_path, every_epochs=1, backend="orbax")
    funcnet.fit(placed, loss_fn, OPT, train, epochs=1, mesh=mesh, callbacks=[ck])
    # What fit's Checkpoint writes: the state, the loop position, the data layout it
    # checks on resume, the (here no) callback states and the epoch's metric sums.
    layout = dict.fromkeys(("batch_size", "n", "drop_remainder", "shuffle", "seed"), np.int64(0))
    restored = ck.checkpointer.restore(
        {
            "train_state": placed,
            "epoch": np.int64(0),
            "batch_in_epoch": np.int64(0),
            "data": layout,
            "callbacks": {},
            "epoch_metrics": EpochSums.empty_tree(),
        }
    )
    _assert_same_layout(restored["train_state"], placed)
    resumed, _ = funcnet.fit(placed, loss_fn, OPT, train, epochs=2, mesh=mesh, resume_from=ck.checkpointer)
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(full.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _assert_same_layout(resumed, placed)


@pytest.mark.devices(4)
def test_npz_checkpointer_gathers_a_sharded_state_and_refuses_past_its_limit(tmp_path):
    ts, _, _ = _mlp_case()
    mesh = _mesh()
    placed = sharding.shard_params(ts, mesh, sharding.fsdp_rules(min_size=0))
    ck = checkpoint.NpzCheckpointer(tmp_path / "ok")
    ck.save(1, placed)
    back = ck.restore(placed)
    _assert_same_layout(back, placed)
    _assert_close(back.params, placed.params, tol=0)
    small = checkpoint.NpzCheckpointer(tmp_path / "no", max_gather_bytes=1000)
    with pytest.raises(ValueError, match=r"gather all .* max_gather_bytes=1000.*orbax"):
        small.save(1, placed)
    small.save(1, jax.device_get(placed))  # host arrays: nothing to gather


# --------------------------------------------------------------------------- #
# Bad input
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_bad_rules_are_named():
    ts, _, _ = _mlp_case()
    mesh = _mesh()
    with pytest.raises(ValueError, match=r"'0/W'.*axis 'model', which the mesh does not have"):
        sharding.shard_params(ts.params, mesh, [("0/W", P(None, "model"))])
    with pytest.raises(
        ValueError,
        match=r"'0/W' has shape \(18, 64\).*dimension 0 \(18\).*"
        r"size 4.*fsdp_rules",
    ):
        sharding.shard_params(ts.params, mesh, [("0/W", P("data"))])
    with pytest.raises(ValueError, match=r"names 3 dimensions; the leaf has 1"):
        sharding.shard_params(ts.params, mesh, [("0/b", P(None, None, "data"))])
    with pytest.raises(TypeError, match="sequence of \\(pattern, spec\\) pairs"):
        sharding.shard_params(ts.params, mesh, "fsdp")
    with pytest.raises(TypeError, match="rule 0"):
        sharding.shard_params(ts.params, mesh, [("0/W",)])
    with pytest.raises(ValueError, match="not a regular expression"):
        sharding.shard_params(ts.params, mesh, [("0/W(", P())])
    with pytest.raises(ValueError, match="no axis 'model'"):
        sharding.shard_params(ts.params, mesh, sharding.fsdp_rules("model"))


@pytest.mark.devices(4)
def test_a_rule_that_matches_nothing_is_warned_about_once():
    ts, _, _ = _mlp_case()
    pattern = "mpl/fc/W"  # a typo
    with pytest.warns(UserWarning, match=re.escape(f"{pattern!r} matches no leaf")):
        sharding.shard_params(ts.params, _mesh(), [(pattern, P("data"))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sharding.shard_params(ts.params, _mesh(), [(pattern, P("data"))])


@pytest.mark.devices(4)
def test_optimizer_state_that_does_not_mirror_the_params_is_refused():
    ts, _, _ = _mlp_case()
    odd = ts._replace(opt_state={"flat": [x for x in jax.tree.leaves(ts.params)]})
    with pytest.raises(ValueError, match="does not mirror|no part of it has the params' structure"):
        sharding.shard_params(odd, _mesh(), sharding.fsdp_rules(min_size=0))


@pytest.mark.devices(4)
def test_a_batch_the_data_axis_does_not_divide_is_refused_on_a_2d_mesh():
    mesh = _mesh((2, 2), ("data", "model"))
    ok = distributed.shard_batch(mesh, np.zeros((4, 3), np.float32))
    assert ok.sharding.spec == P("data")
    local = distributed.shard_local_batch(mesh, np.arange(12, dtype=np.float32).reshape(4, 3))
    assert local.sharding.spec == P("data") and local.shape == (4, 3)  # one process: all rows
    np.testing.assert_array_equal(np.asarray(local), np.arange(12).reshape(4, 3))
    with pytest.raises(ValueError, match=r"batch of 3 examples.*2 devices \(mesh axis 'data'\)"):
        distributed.shard_batch(mesh, np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="name the one batches are split over 'data'"):
        distributed.shard_batch(_mesh((2, 2), ("x", "y")), np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("layout", ["fsdp", "2d"])
@pytest.mark.devices(4)
def test_fit_refuses_a_batch_the_data_axis_does_not_divide(layout):
    """fit(mesh=) with a sharded state: a batch size (or an epoch's last batch) the data
    axis does not divide is refused naming both numbers, from DeviceData before any
    step and from the host pipeline at that batch, and the given state survives."""
    ts, loss_fn, _ = _mlp_case()
    x, y = _fit_data()
    # bad: a batch size the data axis does not divide; the last batch of n_tail rows in
    # batches of 8 (which it divides) holds tail rows, which it does not.
    if layout == "fsdp":
        mesh, rules, n_split = _mesh(), sharding.fsdp_rules(min_size=0), 4
        bad, n_tail, tail, fix = 6, 62, 6, 4
    else:
        mesh, n_split = _mesh((2, 2), ("data", "model")), 2
        rules = sharding.megatron_rules(column=["0"], row=["2"]) + sharding.fsdp_rules("data", 0)
        bad, n_tail, tail, fix = 5, 63, 7, 4
    placed = sharding.shard_params(ts, mesh, rules)
    axis = rf"over {n_split} devices \(mesh axis 'data'"
    fit = lambda train: funcnet.fit(placed, loss_fn, OPT, train, epochs=1, mesh=mesh)  # noqa: E731

    with pytest.raises(
        ValueError,
        match=rf"^DeviceData: a batch of {bad} examples cannot be "
        rf"split evenly {axis}\)\. Use a batch_size that is a "
        rf"multiple of {n_split} \(e\.g\. {fix}\)\.$",
    ):
        fit(data.DeviceData((x, y), bad))
    with pytest.raises(
        ValueError,
        match=rf"a batch of {tail} examples cannot be split evenly "
        rf"{axis}\)\. It is each epoch's last batch, the rows "
        rf"left of n={n_tail} after batches of batch_size=8: "
        rf"drop it \(drop_remainder=True\)",
    ):
        fit(data.DeviceData((x[:n_tail], y[:n_tail]), 8, drop_remainder=False))
    with pytest.raises(
        ValueError,
        match=rf"a batch of {bad} examples cannot be split evenly "
        rf"{axis}\): {bad} % {n_split} = {bad % n_split}\. "
        rf"Use a batch size that is a multiple of {n_split}",
    ):
        fit(lambda e: data.batches((x, y), bad, epoch=e))
    with pytest.raises(
        ValueError,
        match=rf"a batch of {tail} examples cannot be split evenly "
        rf"{axis}.*last, partial batch.*drop_remainder=True",
    ):
        fit(lambda e: data.batches((x[:n_tail], y[:n_tail]), 8, drop_remainder=False, epoch=e))
    assert not any(a.is_deleted() for a in jax.tree.leaves(placed))
