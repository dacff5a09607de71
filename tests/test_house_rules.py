"""House rules checked on the source: no function in funcnet/ over 80 lines (small named helpers instead).

A function's length is counted as ``ruff format`` leaves it: from its first statement after the
docstring to its last line, blank lines and comments included (nested functions count in the
function that holds them, and again on their own). Parsing only, no import: well under a second.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_LINES = 80


def _body_lines(node) -> int:
    """Lines from the first statement after the docstring to the end of ``node``; 0 for a
    function that is only a docstring."""
    body = node.body[1:] if ast.get_docstring(node, clean=False) is not None else node.body
    return node.end_lineno - body[0].lineno + 1 if body else 0


def _long_functions(source: str, path: str, limit: int = MAX_LINES) -> list:
    """``"path:line name (N lines)"`` for each function of ``source`` over ``limit`` lines."""
    return [
        f"{path}:{node.lineno} {node.name} ({_body_lines(node)} lines)"
        for node in ast.walk(ast.parse(source, filename=path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > limit
    ]


def test_no_function_in_funcnet_over_80_lines():
    files = sorted((ROOT / "funcnet").rglob("*.py"))
    assert len(files) > 20, f"found only {len(files)} files under {ROOT / 'funcnet'}"
    long = [hit for p in files for hit in _long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not long, (
        f"functions over {MAX_LINES} lines (first statement after the docstring to the end): "
        f"{long}. Split each into small named helpers (house style: small pure functions)."
    )


@pytest.mark.parametrize(
    "body, expected",
    [
        ('    """One line."""\n    x = 1\n    return x\n', 2),
        ('    """Several\n\n    lines.\n    """\n    x = 1\n    # a comment\n\n    return x\n', 4),
        ('    """Doc."""\n    # a comment before the first statement is not counted\n    return 1\n', 1),
        ("    return 1\n", 1),
        ('    """Only a docstring."""\n', 0),
    ],
)
def test_body_lines_counts_from_the_first_statement_after_the_docstring(body, expected):
    node = ast.parse("def f():\n" + body).body[0]
    assert _body_lines(node) == expected


def test_long_functions_flags_81_lines_and_nested_functions_but_not_80():
    at_limit = "def ok():\n" + "    x = 1\n" * 80
    assert _long_functions(at_limit, "m.py") == []
    over = 'def outer():\n    """Doc."""\n    def inner():\n' + "        x = 1\n" * 81 + "    return inner\n"
    assert _long_functions(over, "m.py") == ["m.py:1 outer (83 lines)", "m.py:3 inner (81 lines)"]
