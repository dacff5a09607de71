"""PyTorch, the reference of the parity tests, or a stand-in that skips them without it.

The parity tests run wherever torch is installed (``pip install -e ".[test,torch]"``;
CI's Python 3.11 lane). Where it is not (the newest-Python lane, where pip would fetch a
multi-GB CUDA build, or a GPU machine without it), ``torch`` here is a stand-in: a test
skips at its first call into it, with :data:`SKIP_REASON`, and every other test in the
same file still runs. ``tests/conftest.py`` counts these skips in the run's summary.

Skipping is raised as pytest's ``Skipped``, a ``BaseException``: a test's
``except Exception`` cannot swallow it and pass without its reference.
"""

import importlib.util

import pytest

SKIP_REASON = "PyTorch parity: torch is not installed (pip install -e '.[test,torch]')"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


class _Missing:
    """``torch.nn.functional.gelu`` and the like, for a torch that is not there: names
    resolve (a module-level ``torch.float32`` or an annotation still imports), and any
    use skips the test that makes it."""

    def __init__(self, path):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}")

    def __call__(self, *args, **kwargs):
        pytest.skip(f"{SKIP_REASON}; the test calls {self._path}")

    def __mro_entries__(self, bases):  # class Net(torch.nn.Module) inside a test
        pytest.skip(f"{SKIP_REASON}; the test subclasses {self._path}")

    def __repr__(self):
        return f"<{self._path}: torch is not installed>"

    __iter__ = __enter__ = __getitem__ = __array__ = __call__


def require_torch():
    """The torch module, or skip: the calling test, or the whole module when called at its
    top level. For tests whose torch calls happen elsewhere (benchmarks' torch peers)."""
    if not HAVE_TORCH:
        pytest.skip(SKIP_REASON, allow_module_level=True)
    import torch

    return torch


if HAVE_TORCH:
    import torch
    import torch.nn.functional as F

    Module = torch.nn.Module
else:
    torch = _Missing("torch")
    F = _Missing("torch.nn.functional")
    Module = object  # a module-level torch.nn.Module subclass still defines; using it skips

__all__ = ["torch", "F", "Module", "HAVE_TORCH", "SKIP_REASON", "require_torch"]
