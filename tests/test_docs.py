"""The documentation runs as written: every ```python block of README.md and docs/**/*.md.

Each file is one script: its blocks run in order in one fresh namespace, as a reader going
down the page would run them, so a block may use what the page's earlier blocks define but
never another page's. They run in a temporary working directory (whatever a page writes
lands there). Blocks in other languages (```bash, ```text, a bare ```) are never run.

A ```python block that must not run (one that needs several hosts, a GPU, or a file the
tests do not have) says so on the line right above its opening fence:

    <!-- no-run: why it cannot run here -->

The marker is the only way to skip a block; NO_RUN below lists every one, so a new marker
fails this test until it is added there on purpose.
"""

import glob
import importlib
import os
import re
import tempfile
import types

import jax
import pytest

import funcnet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FENCE = re.compile(r"^(?P<marker><!-- no-run:[^\n]*-->\n)?```python[^\n]*\n(?P<code>.*?)^```", re.S | re.M)

# Pages and how many blocks each keeps from running (every other ```python block runs).
NO_RUN = {"docs/guides/checkpoints.md": 1}

# Names a page's blocks must leave behind, checked after it ran: what the text promises.
CHECKS = {
    "README.md": lambda s: s["out_shape"] == (-1, 10) and s["metrics"]["loss"].shape == () and len(s["history"]) == 1,
    "docs/concepts.md": lambda s: s["out_shape"] == (-1, 10),
    "docs/guides/distributed.md": lambda s: (
        s["metrics"]["loss"].shape == (jax.local_device_count(),)
        and s["mesh_metrics"]["loss"].shape == ()  # one global value, not one per device
        and s["ts_mesh"].params[0]["W"].sharding.is_fully_replicated
    ),
}

# Pages whose examples are the point of the page: each must have blocks that run.
MUST_RUN = [
    "README.md",
    "docs/getting-started.md",
    "docs/concepts.md",
    "docs/guides/training.md",
    "docs/guides/several-models.md",
    "docs/guides/parameters.md",
    "docs/guides/data.md",
    "docs/guides/checkpoints.md",
    "docs/guides/mixed-precision.md",
    "docs/guides/distributed.md",
    "docs/guides/sharding.md",
    "docs/guides/transformers.md",
    "docs/guides/custom-layers.md",
    "docs/guides/export.md",
    "docs/guides/recurrent.md",
    "docs/porting.md",
    "docs/porting-jax.md",
]


def _pages():
    pages = ["README.md"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    )
    return [p for p in pages if "```python" in open(os.path.join(ROOT, p)).read()]


def _blocks(page):
    """``(run, skipped)``: the blocks to run, each its code padded with blank lines to its
    place in the file (so a traceback names the page's line), and the number marked no-run."""
    text = open(os.path.join(ROOT, page)).read()
    found = list(_FENCE.finditer(text))
    assert len(found) == text.count("```python"), f"{page}: a ```python fence not parsed"
    return (
        [text[: m.start("code")].count("\n") * "\n" + m["code"] for m in found if not m["marker"]],
        sum(1 for m in found if m["marker"]),
    )


def test_the_pages_with_examples_are_found():
    pages = _pages()
    assert set(MUST_RUN) <= set(pages), sorted(set(MUST_RUN) - set(pages))
    for page in MUST_RUN:
        assert _blocks(page)[0], f"{page} has no ```python block that runs"


# Pages whose blocks split arrays over 4 devices (the CPU run simulates them).
FOUR_DEVICES = {"README.md", "docs/guides/sharding.md"}


@pytest.mark.parametrize(
    "page", [pytest.param(p, marks=pytest.mark.devices(4)) if p in FOUR_DEVICES else p for p in _pages()]
)
def test_page_python_blocks_run(page, tmp_path, monkeypatch):
    run, skipped = _blocks(page)
    assert skipped == NO_RUN.get(page, 0), (
        f"{page}: {skipped} block(s) marked no-run, NO_RUN says {NO_RUN.get(page, 0)}"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a page's mkdtemp() lands here too
    scope = {"__name__": "__docs__"}
    for code in run:
        exec(compile(code, os.path.join(ROOT, page), "exec"), scope)
    if page in CHECKS:
        assert CHECKS[page](scope)


def test_every_public_module_has_an_api_page():
    """docs/api/<module>.md renders each public module (mkdocs.yml lists the pages)."""
    nav = open(os.path.join(ROOT, "mkdocs.yml")).read()
    modules = [n for n in funcnet.__all__ if isinstance(getattr(funcnet, n), types.ModuleType)]
    assert len(modules) >= 25
    for name in modules:
        importlib.import_module(f"funcnet.{name}")
        page = os.path.join(ROOT, "docs", "api", f"{name}.md")
        assert os.path.exists(page), f"no API page for funcnet.{name}"
        assert f"::: funcnet.{name}\n" in open(page).read(), page
        assert f"api/{name}.md" in nav, f"mkdocs.yml's nav lacks api/{name}.md"


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= 200


def test_readme_links_resolve():
    """mkdocs checks the site's links; the README is not part of the site, so its are here."""
    text = open(os.path.join(ROOT, "README.md")).read()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        if "://" not in link:
            assert os.path.exists(os.path.join(ROOT, link)), f"README links to missing {link}"


def _docstring_lines():
    """``(place, line)`` for every line of every docstring in funcnet's source, ``place``
    being ``path:function`` (or ``path:module``)."""
    import ast

    for path in sorted(glob.glob(os.path.join(ROOT, "funcnet", "**", "*.py"), recursive=True)):
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            place = f"{os.path.relpath(path, ROOT)}:{getattr(node, 'name', 'module')}"
            for line in (ast.get_docstring(node, clean=False) or "").splitlines():
                yield place, line


def test_docstrings_use_markdown_code_blocks_not_rst_literal_blocks():
    """The API reference renders docstrings as Markdown: a reStructuredText literal block
    (a line ending in ``::``, then an indented block) shows there as a stray ``::`` and
    a paragraph. Code and formulas go in fenced blocks."""
    bad = [
        f"{place}: {line.strip()}"
        for place, line in _docstring_lines()
        if line.rstrip().endswith("::") and not line.lstrip().startswith((">>>", "..."))
    ]
    assert bad == [], "reStructuredText literal blocks in docstrings:\n" + "\n".join(bad)


def test_docstrings_use_markdown_tables_not_rst_tables_or_directives():
    """A reStructuredText simple table (rows between ``=====  =====`` rules) or a directive
    (``.. math::``) shows in the API reference as raw text; Markdown tables render."""
    import re

    rule, directive = re.compile(r"^\s*=+(\s{2,}=+)+\s*$"), re.compile(r"^\s*\.\. \w+::")
    bad = [
        f"{place}: {line.strip()}" for place, line in _docstring_lines() if rule.match(line) or directive.match(line)
    ]
    assert bad == [], "reStructuredText tables or directives in docstrings:\n" + "\n".join(bad)


# Code blocks on the site's pages stay within this many columns: docs/stylesheets/extra.css
# sizes block code so that 88 fit the content column beside both sidebars at 1280 px wide
# (tools/screenshots.py shows it); a longer line is cut off behind a sideways scroll bar.
CODE_COLUMNS = 88
# (page, the line's start) -> why it cannot wrap: a shell command or a URL, never Python.
LONG_CODE_LINES = {}

_ANY_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def _long_code_lines(text, limit=CODE_COLUMNS):
    """``(line number, line)`` of each line inside a fenced block that is over ``limit``."""
    long, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = _ANY_FENCE.match(line)
        if m and fence is None:
            fence = m[1]
        elif m and m[1].startswith(fence) and not line[m.end() :].strip():
            fence = None
        elif fence and len(line) > limit:
            long.append((number, line))
    return long


def test_code_blocks_fit_the_content_column():
    assert _long_code_lines("x" * 99 + "\n  ```\n  " + "y" * 89 + "\n  ```\n" + "z" * 99) == [(3, "  " + "y" * 89)]
    bad, allowed = [], set()
    # The README is held to the same width: it is the repository's front page.
    pages = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True) + [os.path.join(ROOT, "README.md")]
    for page in pages:
        page = os.path.relpath(page, ROOT)
        for number, line in _long_code_lines(open(os.path.join(ROOT, page)).read()):
            key = next((k for k in LONG_CODE_LINES if k[0] == page and line.strip().startswith(k[1])), None)
            if key:
                allowed.add(key)
            else:
                bad.append(f"{page}:{number}: {len(line)} columns")
    assert bad == [], (
        f"code lines over {CODE_COLUMNS} columns (wrap them; only a line that "
        f"cannot wrap goes in LONG_CODE_LINES, with why):\n" + "\n".join(bad)
    )
    assert allowed == set(LONG_CODE_LINES), f"stale LONG_CODE_LINES: {set(LONG_CODE_LINES) - allowed}"


def test_no_docstring_names_a_docs_page_as_text():
    """The API reference renders docstrings as Markdown: "docs/porting.md has the code" is a
    dead end there. A page is a relative link from the API page that shows the docstring,
    e.g. ``[the porting guide](../../porting.md)`` on api/layers/attention (mkdocs resolves
    it, and `mkdocs build --strict` fails on a broken one)."""
    docs = {}
    for place, line in _docstring_lines():
        docs[place] = docs.get(place, "") + line + "\n"
    found = {}
    for place, doc in docs.items():
        for path in re.findall(r"docs/[\w/.-]+\.md", re.sub(r"\]\([^)]*\)", "]()", doc)):
            found.setdefault(place, set()).add(path)
    assert found == {}, "make these page paths Markdown links (relative to the docs/api/ page that renders them)"
