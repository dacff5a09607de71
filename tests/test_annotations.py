"""The public API is annotated (PEP 484) and marked typed (PEP 561's ``py.typed``).

For every module in ``ANNOTATED``, every public function (a name in ``__all__``) and
every public class's own ``__init__`` annotates each parameter (``self``, ``*args``
and ``**kwargs`` aside) and its return, and ``typing.get_type_hints`` resolves them,
so no forward reference is broken and the API reference's Type column is filled.

Not yet annotated, so not in ``ANNOTATED`` (add each once it is): ``funcnet.loop``
(the ``funcnet/loop/`` package, being rewritten), and the top-level ``funcnet``
namespace, which re-exports ``fit`` from it (and ``make_train_step``, ``polyak_update``
and ``make_predict_fn``, annotated in ``funcnet.train`` and ``funcnet.inference``).
"""

import importlib
import inspect
import pathlib
import typing

import pytest

import funcnet

ANNOTATED = [
    "funcnet.core",
    "funcnet.combinators",
    "funcnet.layers",
    "funcnet.losses",
    "funcnet.outputs",
    "funcnet.initializers",
    "funcnet.optim",
    "funcnet.params",
    "funcnet.metrics",
    "funcnet.data",
    "funcnet.callbacks",
    "funcnet.checkpoint",
    "funcnet.checkpoint_orbax",
    "funcnet.sharding",
    "funcnet.distributed",
    "funcnet.precision",
    "funcnet.xla",
    "funcnet.decoding",
    "funcnet.models",
    "funcnet.models.gpt",
    "funcnet.interop",
    "funcnet.introspect",
    "funcnet.testing",
    "funcnet.fileio",
    "funcnet.errors",
    "funcnet.datasets",
    "funcnet.datasets.idx",
    "funcnet.train",
    "funcnet.inference",
    "funcnet.datasets.mnist",
    "funcnet.onnx",
]


def _public_callables(module):
    """``(qualified name, function)`` for each public function and class ``__init__``."""
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            # inherited constructors (NamedTuple, Exception) and a Protocol's placeholder are not ours
            if "__init__" in vars(obj) and not getattr(obj, "_is_protocol", False):
                yield f"{name}.__init__", obj.__init__
        elif inspect.isfunction(obj) or inspect.isfunction(getattr(obj, "__wrapped__", None)):
            yield name, obj


def _missing(fn) -> list:
    """The names of ``fn``'s unannotated parameters, and ``"return"`` if it has none."""
    sig = inspect.signature(fn)
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    missing = [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in skip and p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("module_name", ANNOTATED)
def test_public_functions_are_annotated(module_name):
    module = importlib.import_module(module_name)
    bad = {name: _missing(fn) for name, fn in _public_callables(module) if _missing(fn)}
    assert not bad, (
        f"{module_name}: these public functions lack annotations (parameter names, "
        f"'return' for the return type): {bad}. Annotate them in the def line."
    )


@pytest.mark.parametrize("module_name", ANNOTATED)
def test_annotations_resolve(module_name):
    module = importlib.import_module(module_name)
    for name, fn in _public_callables(module):
        try:
            typing.get_type_hints(fn)
        except Exception as e:  # a NameError for a name only imported under TYPE_CHECKING, ...
            pytest.fail(
                f"{module_name}.{name}: typing.get_type_hints fails ({e!r}); every name an "
                f"annotation uses must be importable at run time in its module."
            )


def test_the_check_catches_a_missing_annotation():
    def half(x: int, y) -> int:
        return x

    def bare(x: int):
        return x

    def fine(x: int, *args, **kwargs) -> int:
        return x

    assert _missing(half) == ["y"]
    assert _missing(bare) == ["return"]
    assert _missing(fine) == []


def test_py_typed_marker_ships_in_the_package():
    assert (pathlib.Path(funcnet.__file__).parent / "py.typed").is_file()
