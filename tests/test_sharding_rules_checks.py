"""Sharding rules checked where they are given (funcnet.sharding): explain's totals,
shadowed rules, specs that name an axis twice or something that is not an axis, and
tensor-parallel splits of attention heads, each named with the leaf, its shape, the spec
and the mesh's axis sizes rather than failing raw when the array is placed or the step
compiles. On 4 simulated CPU devices.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from funcnet import distributed, sharding
from funcnet.errors import ArgumentError

PARAMS = {"0": {"W": jnp.zeros((8, 4)), "b": jnp.zeros(4)}, "2": {"W": jnp.zeros((4, 8)), "b": jnp.zeros(8)}}


def _mesh(shape=(4,), names=("data",)):
    return jax.make_mesh(shape, names)


def _attention(E=12):
    """The params of a TransformerBlock's attention, as megatron_rules' defaults name them."""
    proj = lambda: {"W": jnp.zeros((E, E)), "b": jnp.zeros(E)}
    return {"attn": {"attn": {k: proj() for k in ("query", "key", "value", "out")}}}


# --------------------------------------------------------------------------- #
# explain
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_explain_counts_a_replicated_tree_once():
    tree = {"W": jnp.ones((3, 2)), "b": jnp.ones(2)}  # 24 + 8 bytes
    for placed in (
        distributed.replicate(tree, devices=4),  # one copy per device, stacked
        distributed.replicate_on(_mesh(), tree),
    ):  # whole on every device
        out = sharding.explain(placed, print_fn=None)
        assert (out.bytes_total, out.bytes_per_device) == (32, 32)
    # a split over a mesh of one's own is not taken for copies, even one row per device
    split = sharding.shard_params({"x": jnp.ones((4, 2))}, _mesh(), [("x", P("data"))])
    assert sharding.explain(split, print_fn=None)[1:] == (32, 8)


# --------------------------------------------------------------------------- #
# Rules that place nothing
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_a_shadowed_rule_is_reported_as_shadowed_naming_the_earlier_rule():
    rules = [(r"W$", P("data")), (r"0/W$", P(None, "data"))]
    with pytest.warns(
        UserWarning, match=re.escape("rule 1 pattern '0/W$' is shadowed by the earlier rule 0 'W$'")
    ) as seen:
        sharding.param_specs(PARAMS, _mesh(), rules)
    assert not any("matches no leaf" in str(w.message) for w in seen)
    # the same pattern twice: the second never places anything (silent before)
    with pytest.warns(
        UserWarning,
        match=r"rule 1 pattern 'b\$' is shadowed .*rule 0 'b\$'.*"
        r"e\.g\. '0/b'.*Put it before rule 0",
    ):
        sharding.param_specs(PARAMS, _mesh(), [("b$", P()), ("b$", P("data"))])


@pytest.mark.devices(4)
def test_a_rule_matching_no_leaf_is_still_a_typo_and_a_used_one_is_quiet():
    with pytest.warns(UserWarning, match=r"'mpl/W' matches no leaf path.*a typo"):
        sharding.param_specs(PARAMS, _mesh(), [("mpl/W", P("data")), ("W$", P())])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # rule 1 matches 2/W only after rule 0 takes 0/W: it places 2/W, nothing to say
        specs = sharding.param_specs(PARAMS, _mesh(), [("0/W$", P("data")), ("W$", P())])
    assert specs["0"]["W"] == P("data") and specs["2"]["W"] == P()


# --------------------------------------------------------------------------- #
# Specs that cannot be placed
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_a_spec_naming_one_axis_twice_is_refused_with_the_leaf_and_the_axes():
    mesh = _mesh((2, 2), ("data", "model"))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "the rule '0/W' gives '0/W' (shape (8, 4)) the spec P('data', 'data'), which names "
            "the mesh axis 'data' twice (for dimensions 0 and 1)"
        )
        + r".*'model': 2",
    ):
        sharding.shard_params(PARAMS, mesh, [("0/W", P("data", "data"))])
    with pytest.raises(ValueError, match=r"axis 'model' twice"):
        sharding.param_specs(PARAMS, mesh, [("0/W", P(("data", "model"), "model"))])


@pytest.mark.devices(4)
def test_a_spec_entry_that_is_not_an_axis_name_is_refused():
    # P(1) read as "split dimension 1": jax accepts it, and failed placing it
    with pytest.raises(
        ValueError,
        match=r"'0/W' the spec P\(1\), whose entry 1 is not a mesh "
        r"axis.*P\(None, 'model'\) splits dimension 1",
    ):
        sharding.shard_params(PARAMS, _mesh(), [("0/W", P(1))])


@pytest.mark.devices(4)
def test_rules_given_as_a_dict_say_how_to_pass_them():
    with pytest.raises(
        TypeError,
        match=r"got dict\. For a dict \{pattern: spec\}, pass "
        r"list\(rules\.items\(\)\)",
    ):
        sharding.shard_params(PARAMS, _mesh(), {"0/W": P("data")})


@pytest.mark.devices(4)
def test_a_spec_function_failure_names_the_rule_and_the_leaf():
    with pytest.raises(
        ValueError,
        match=r"rule '\.\*' for '0/W' \(shape \(8, 4\)\): fsdp: the "
        r"mesh has no axis 'model'",
    ):
        sharding.param_specs(PARAMS, _mesh(), sharding.fsdp_rules("model", min_size=0))


# --------------------------------------------------------------------------- #
# Tensor parallel
# --------------------------------------------------------------------------- #


@pytest.mark.devices(4)
def test_megatron_heads_the_axis_does_not_divide_are_refused_at_placement():
    mesh = _mesh((2, 2), ("data", "model"))
    params = _attention(E=12)  # 12 columns split evenly over 2, but 3 heads do not
    with pytest.raises(
        ValueError,
        match=re.escape(
            "for 'attn/attn/key/W' (shape (12, 12)): the spec P(None, 'model') splits "
            "dimension 1 (12: num_heads=3 heads of 4) over 'model' of size 2 (mesh axes: "
            "{'data': 2, 'model': 2})"
        ),
    ):
        sharding.shard_params(params, mesh, sharding.megatron_rules(num_heads=3))
    attention = dict(column=[r"attn/attn/(query|key|value)"], row=[r"attn/attn/out"])
    with pytest.raises(
        ValueError,
        match=r"'attn/attn/out/W' \(shape \(12, 12\)\): the spec "
        r"P\('model', None\) splits dimension 0",
    ):
        sharding.param_specs(params, mesh, sharding.megatron_rules(column=[], row=attention["row"], num_heads=3))
    specs = sharding.param_specs(params, mesh, sharding.megatron_rules(**attention, num_heads=6))
    assert specs["attn"]["attn"]["query"]["W"] == P(None, "model")
    assert specs["attn"]["attn"]["out"]["W"] == P("model", None)


@pytest.mark.devices(4)
def test_megatron_split_dimensions_and_axes_are_checked():
    mesh = _mesh((1, 4), ("data", "model"))
    with pytest.raises(
        ValueError,
        match=r"'attn/attn/key/W' has shape \(6, 6\).*dimension "
        r"1 \(6\).*'model' \(size 4\)",
    ):
        sharding.shard_params(_attention(E=6), mesh, sharding.megatron_rules())
    with pytest.raises(
        ArgumentError,
        match=r"fsdp_axis='model' is the tensor-parallel axis "
        r"too",
    ):
        sharding.megatron_rules(fsdp_axis="model")
    with pytest.raises(ArgumentError, match=r"num_heads must be a positive int"):
        sharding.megatron_rules(num_heads=0)
