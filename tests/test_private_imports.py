"""No funcnet module reaches into another public module's private names.

An underscore name of a public module (``funcnet.inference._dest``) is that module's own
business: it may change or go without notice, and a second module that imports it ties
the two together unseen. What two modules share lives in a private module
(``funcnet/_x.py``, ``funcnet/loop/_x.py``), whose names any module may import. Checked
with ``ast`` on every module of ``funcnet/``, for ``from M import _name`` and for
``M._name`` where ``M`` is a public funcnet module imported whole. Allowed: importing a
private *module* as a whole (``from funcnet import _checks as checks``), any name of a
private module, and dunder names (``__version__``).
"""

import ast
import pathlib

import pytest

import funcnet

ROOT = pathlib.Path(funcnet.__file__).parent

# (importing module, imported module, name): why it is allowed. Keep it empty where possible.
ALLOWED: dict = {}


def _module_name(path: pathlib.Path) -> str:
    parts = ("funcnet",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: pathlib.Path) -> bool:
    return path.name == "__init__.py"


def _is_module(name: str) -> bool:
    """``name`` (``funcnet.x.y``) is a module or package of funcnet's source tree."""
    rel = pathlib.Path(*name.split(".")[1:]) if name != "funcnet" else pathlib.Path()
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_private_module(name: str) -> bool:
    return any(_private(part) for part in name.split(".")[1:])


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _reaches(path: pathlib.Path, tree: ast.AST) -> list:
    """``(module, imported module, name, line)`` for each private name taken from a public module."""
    me = _module_name(path)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(me, _is_package(path), node)
            if not source.startswith("funcnet") or source == me:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if _is_module(full):  # a module imported whole: its own rules apply
                    aliases[alias.asname or alias.name] = full
                elif _private(alias.name) and not _is_private_module(source):
                    found.append((me, source, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("funcnet") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        # m._name, where m is a public funcnet module imported under that name
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            source = aliases[node.value.id]
            if source != me and not _is_private_module(source) and not _is_module(f"{source}.{node.attr}"):
                found.append((me, source, node.attr, node.lineno))
    return found


def _all_reaches() -> list:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        out += _reaches(path, ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return out


def test_no_module_imports_another_public_modules_private_names():
    bad = [
        f"{me} (line {line}) takes {name} from {source}"
        for me, source, name, line in _all_reaches()
        if (me, source, name) not in ALLOWED
    ]
    assert not bad, (
        "These funcnet modules reach into another public module's private names; "
        "move what they share into a private module (funcnet/_x.py) that both "
        "import, or make it public:\n  " + "\n  ".join(bad)
    )


def test_the_allow_list_holds_no_stale_entries():
    seen = {(me, source, name) for me, source, name, _ in _all_reaches()}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED lists reaches that no longer exist; remove them: {stale}"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from funcnet.inference import _dest, export\n", [("funcnet.inference", "_dest")]),
        ("from .inference import _dtype\n", [("funcnet.inference", "_dtype")]),
        ("import funcnet.inference as inf\ninf._input_specs(1)\n", [("funcnet.inference", "_input_specs")]),
        ("from funcnet import inference\ninference._dest(1)\n", [("funcnet.inference", "_dest")]),
        ("from funcnet import _checks as checks\nchecks._name(1)\n", []),
        ("from funcnet._export_args import input_specs, _x\n", []),
        ("from funcnet._version import __version__\n", []),
    ],
)
def test_the_check_tells_a_reach_from_an_allowed_import(source, expected):
    found = _reaches(ROOT / "onnx.py", ast.parse(source))
    assert [(src, name) for _, src, name, _ in found] == expected
