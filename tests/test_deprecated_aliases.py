"""Names with one import path: the old paths of 0.2's development line still work, with a
DeprecationWarning that names the new one, and are not public any more."""

import importlib

import pytest

import funcnet
from funcnet import checkpoint, sharding

MOVED = [("funcnet.checkpoint_orbax", "OrbaxCheckpointer", checkpoint)] + [
    ("funcnet.distributed", name, sharding)
    for name in ["shard_params", "param_specs", "fsdp_rules", "megatron_rules", "explain", "state_shardings"]
]


@pytest.mark.parametrize("module,name,home", MOVED, ids=[f"{m}.{n}" for m, n, _ in MOVED])
def test_a_moved_name_still_works_and_warns_with_its_one_path(module, name, home):
    old = importlib.import_module(module)
    with pytest.warns(
        DeprecationWarning,
        match=rf"{module}\.{name} is deprecated: import it "
        rf"from {home.__name__}",
    ):
        got = getattr(old, name)
    assert got is getattr(home, name)
    assert name not in getattr(old, "__all__")
    with pytest.warns(DeprecationWarning):
        exec(f"from {module} import {name}", {})


def test_other_missing_names_are_plain_attribute_errors():
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        funcnet.distributed.nope
    assert "checkpoint_orbax" not in funcnet.__all__
