"""The README's Python snippets run as written (one after the other, as a reader would)."""
import os
import re

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run():
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    scope = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), scope)
    assert scope["out_shape"] == (-1, 10)
    assert scope["metrics"]["loss"].shape == (jax.local_device_count(),)
    assert scope["mesh_metrics"]["loss"].shape == ()  # one global value, not one per device
    assert scope["ts_mesh"].params[0]["W"].sharding.is_fully_replicated
