"""The package's structure: an acyclic import graph, no imports hidden in functions to
break a cycle, ``__all__`` in every module, and every exception type in ``funcnet.errors``.

The graph is read from the source with ``ast`` (nothing is imported to build it), so a
cycle is found even where Python's import order happens to tolerate it.
"""

import ast
import importlib
import inspect
import pathlib

import pytest

import funcnet
from funcnet import errors

ROOT = pathlib.Path(funcnet.__file__).parent


def _modules():
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


MODULES = _modules()


def _owner(name):
    """The funcnet module ``name`` (a module or ``module.attribute``) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(name, path):
    """``(target module, line, at module level)`` for each funcnet import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module is not None
            or (isinstance(node, ast.ImportFrom) and node.level)
        ):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            owner = _owner(target) if target.split(".")[0] == "funcnet" else ""
            if owner and owner != name:
                found.append((owner, node.lineno, id(node) in top))
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_graph_is_read():
    # A parser that found nothing would make the tests below pass vacuously.
    assert len(MODULES) > 30
    assert ("funcnet.core",) in {(t,) for t, _, _ in GRAPH["funcnet.combinators"]}
    assert any(t == "funcnet.train" for t, _, _ in GRAPH["funcnet.loop._fit"])


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _with_packages(name, target):
    """``target`` and the packages Python initialises to import it from ``name``: its
    parent packages below ``funcnet`` that do not also contain ``name``."""
    parts = target.split(".")
    parents = {".".join(parts[:i]) for i in range(2, len(parts))}
    inside = {".".join(name.split(".")[:i]) for i in range(2, len(name.split(".")) + 1)}
    return {target} | {p for p in parents if p in MODULES and p not in inside}


def test_no_import_cycles():
    # Every import counts, also one inside a function: hiding an import in a function
    # only moves a cycle from import time to call time. Importing a package's submodule
    # from outside runs the package's __init__ first, so that is an edge too.
    graph = {
        name: set().union(*[_with_packages(name, t) for t, _, _ in edges] or [set()]) - {"funcnet"}
        for name, edges in GRAPH.items()
    }
    assert _cycles(graph) == []


def test_package_edges_are_seen():
    assert _with_packages("funcnet.loop", "funcnet.checkpoint._npz") == {
        "funcnet.checkpoint._npz",
        "funcnet.checkpoint",
    }
    assert _with_packages("funcnet.checkpoint", "funcnet.checkpoint._npz") == {"funcnet.checkpoint._npz"}


def test_no_function_local_funcnet_imports():
    local = [
        f"{MODULES[name].relative_to(ROOT.parent)}:{line} imports {target}"
        for name, edges in GRAPH.items()
        for target, line, at_top in edges
        if not at_top
    ]
    assert local == [], (
        "funcnet modules import each other at module level; a function-local import hides a cycle:\n" + "\n".join(local)
    )


def test_no_funcnet_module_is_imported_by_name_at_run_time():
    # importlib.import_module("funcnet.x") is an import the graph above cannot see: the same
    # cycle-hiding a function-local import is. Optional dependencies (importlib.util.
    # find_spec("tensorboardX")) are not funcnet modules and stay allowed.
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith(("import_module", "__import__"))
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("funcnet")
            ):
                found.append(f"{name}:{node.lineno} imports {node.args[0].value}")
    assert found == [], "import funcnet modules at module level:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_declares_all(name):
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define: {missing}"
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ repeats a name"


def test_every_exception_type_lives_in_funcnet_errors():
    defined_elsewhere = []
    for name, path in MODULES.items():
        if name == "funcnet.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rpartition(".")[2] for b in node.bases}
                if any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
                    defined_elsewhere.append(f"{name}.{node.name}")
    assert defined_elsewhere == [], f"define these in funcnet/errors.py: {defined_elsewhere}"
    public = [getattr(errors, n) for n in errors.__all__]
    assert all(inspect.isclass(c) and issubclass(c, Exception) for c in public)


def test_errors_are_the_same_classes_where_they_are_raised():
    # Old ``except`` clauses name the raising module; they must catch the same class.
    seen = 0
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            if attr in errors.__all__:
                assert getattr(module, attr) is getattr(errors, attr), f"{name}.{attr}"
                seen += 1
    assert seen >= 5
    assert funcnet.checkpoint.CheckpointMismatchError is errors.CheckpointMismatchError
    assert issubclass(errors.ArgumentError, ValueError) and issubclass(errors.ArgumentError, TypeError)


def test_pyproject_floor_is_the_floor_ci_checks():
    # .ci/run installs .ci/floor-constraints.txt in a second venv and runs the floor smoke;
    # the lower bounds pyproject.toml declares must be those versions, not older ones.
    root = ROOT.parent
    pins = {}
    for line in (root / ".ci" / "floor-constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name] = version
    declared = {}
    text = (root / "pyproject.toml").read_text()
    block = text[text.index("dependencies = [") :]
    block = block[: block.index("]")]
    for entry in block.split('"')[1::2]:
        name, _, version = entry.partition(">=")
        declared[name] = version
    assert declared == pins
