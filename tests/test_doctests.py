"""The docstrings' examples run as written: every ``>>>`` line of every funcnet module.

Each module is one test, so a failure names the module. A module's examples run in a
fresh copy of the module's own namespace (its public and private names, as ``python -m
doctest`` would give them) plus ``jax``, ``jnp``, ``np``, ``optax`` and ``funcnet``, so an
example need not import what every example needs. ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE``
are on: ``...`` stands for output an example does not pin down (an address, a long repr).

The finder must find what the docstrings promise, or this file passes while checking
nothing: ``test_examples_exist`` asks for a floor of examples overall, and for one example
in every public function and class of every public module (less the ``EXEMPT`` names).
"""

import doctest
import importlib
import inspect
import os
import pkgutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import funcnet

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Every public module (no part of its name private) must give every name of its ``__all__``
# that is a function or class defined in it an example, less the names listed here (and why).
EXEMPT = {
    # Three examples show catching funcnet's errors; the checkpoint and data-file errors
    # need a broken file on disk to raise, which the tests of their modules build.
    "funcnet.errors": {
        "StateDictMismatchError",
        "CheckpointError",
        "CheckpointCorruptError",
        "CheckpointMismatchError",
        "CheckpointVersionError",
        "CheckpointOwnershipError",
        "CorruptFileError",
        "MNISTNotFoundError",
    },
    # needs the optional jax2onnx and onnxruntime (the onnx extra, not in the test extra: ~500 MB);
    # tests/test_onnx.py runs it against onnxruntime where they are installed
    "funcnet.onnx": {"to_onnx"},
}


def _public(name):
    return not any(part.startswith("_") for part in name.split("."))


# Fewer examples than this overall means the finder stopped finding them.
MIN_EXAMPLES = 500


def _module_names():
    names = ["funcnet"]
    for info in pkgutil.walk_packages(funcnet.__path__, "funcnet."):
        names.append(info.name)
    return sorted(names)


def _find(name):
    module = importlib.import_module(name)
    globs = dict(vars(module))
    globs.update(jax=jax, jnp=jnp, np=np, optax=optax, funcnet=funcnet)
    # DocTestFinder gives every docstring its own copy of ``globs``; it only looks at
    # objects defined in ``module``, so a re-exported name runs once, where it lives.
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name, globs=globs)
    return module, [t for t in tests if t.examples]


_MODULES = _module_names()


# Modules whose examples build 4-device meshes (the CPU run simulates them).
FOUR_DEVICES = {"funcnet.distributed", "funcnet.sharding"}


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.devices(4)) if m in FOUR_DEVICES else m for m in _MODULES]
)
def test_docstring_examples(name, tmp_path, monkeypatch):
    _, tests = _find(name)
    # The examples write their files under tempfile.mkdtemp(), as a reader would; here
    # that is the test's own directory, which pytest removes, not the system's.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made, mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(mkdtemp(*a, **k)) or made[-1])
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = []
    for test in sorted(tests, key=lambda t: t.name):
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
    if any("tempfile.mkdtemp()" in example.source for test in tests for example in test.examples):
        assert made and all(os.path.dirname(d) == str(tmp_path) for d in made), (name, made, tmp_path)


def test_examples_exist():
    total = 0
    missing = []
    for name in _MODULES:
        module, tests = _find(name)
        total += sum(len(t.examples) for t in tests)
        if not _public(name):
            continue
        with_examples = {t.name for t in tests}
        for attr in module.__all__:
            obj = getattr(module, attr)
            if attr in EXEMPT.get(name, ()):
                continue
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", None) != name:
                continue
            if f"{name}.{attr}" not in with_examples:
                missing.append(f"{name}.{attr}")
    assert not missing, f"public names without a docstring example: {missing}"
    assert total >= MIN_EXAMPLES, f"only {total} docstring examples found"
