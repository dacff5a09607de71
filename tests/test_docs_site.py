"""The site's generated parts are current: the benchmark charts against their inputs, the
pages that embed other files, the figures the pages show.

`python -m benchmarks.plots` draws `docs/img/bench-*.svg` from the committed
`benchmarks/results*.json` and records each input's sha256 in `docs/img/bench-plots.json`.
The SVG bytes are not compared (they differ between matplotlib versions): the hashes are.
"""

import glob
import hashlib
import json
import os
import re

import pytest

from benchmarks import plots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, plots.MANIFEST)
RERUN = "re-run `python -m benchmarks.plots` and commit docs/img/bench-*"


def _read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def stale_charts(manifest, root=ROOT):
    """The problems of a manifest, one line each: a chart or an input that is missing, an
    input whose bytes changed since the charts were drawn, a chart that `benchmarks.plots`
    draws now but the manifest lacks (or the reverse)."""
    problems = []
    if set(manifest["plots"]) != set(plots.PLOTS):
        problems.append(
            f"charts in the manifest {sorted(manifest['plots'])} != charts benchmarks.plots draws {sorted(plots.PLOTS)}"
        )
    for chart, inputs in manifest["plots"].items():
        if not os.path.exists(os.path.join(root, plots.OUT_DIR, chart)):
            problems.append(f"{chart}: named in the manifest, missing from {plots.OUT_DIR}")
        if chart in plots.PLOTS and set(inputs) != set(plots.PLOTS[chart]):
            problems.append(
                f"{chart}: drawn from {sorted(inputs)}, benchmarks.plots now reads {sorted(plots.PLOTS[chart])}"
            )
        for path, digest in inputs.items():
            full = os.path.join(root, path)
            if not os.path.exists(full):
                problems.append(f"{chart}: its input {path} is missing")
                continue
            with open(full, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    problems.append(f"{chart}: {path} changed since the chart was drawn")
    return problems


def test_benchmark_charts_are_current():
    assert stale_charts(_manifest()) == [], RERUN
    assert _manifest()["command"] == plots.COMMAND


def test_a_changed_result_or_a_missing_chart_is_caught(tmp_path):
    """The check above can fail: a result edited after the charts were drawn, a chart
    file deleted, a chart added to the script but never drawn."""
    manifest = _manifest()
    chart, inputs = next(iter(manifest["plots"].items()))
    path = next(iter(inputs))
    os.makedirs(tmp_path / os.path.dirname(path))
    os.makedirs(tmp_path / plots.OUT_DIR)
    with open(os.path.join(ROOT, path), "rb") as f:
        (tmp_path / path).write_bytes(f.read() + b"\n")
    problems = stale_charts({"command": manifest["command"], "plots": {chart: {path: inputs[path]}}}, root=tmp_path)
    assert f"{chart}: {path} changed since the chart was drawn" in problems
    assert f"{chart}: named in the manifest, missing from {plots.OUT_DIR}" in problems
    assert any("charts benchmarks.plots draws" in p for p in problems)


def test_the_benchmarks_page_shows_every_chart_with_its_source():
    page = _read("docs/benchmarks.md")
    for chart, inputs in plots.PLOTS.items():
        assert f"](img/{chart})" in page, f"docs/benchmarks.md does not show {chart}"
        for path in inputs:
            assert f"`{path}`" in page, f"docs/benchmarks.md does not name {path}"
    assert f"`{plots.COMMAND}`" in page


@pytest.mark.parametrize(
    "page, embedded", [("docs/benchmarks.md", "BENCHMARKS.md"), ("docs/conv-notes.md", "benchmarks/CONV_NOTES.md")]
)
def test_an_embedded_file_leaves_the_page_one_title(page, embedded):
    """Material's table of contents lists the first `#` heading's sections only: a second
    `#` heading, from an embedded file, hides every section after it. So the pages embed
    these files from their second line (`"FILE:2:"`), below their one `#` title."""
    text = _read(page)
    assert f'--8<-- "{embedded}:2:"' in text
    assert _read(embedded).splitlines()[0].startswith("# ")
    assert not [l for l in _read(embedded).splitlines()[1:] if re.match(r"# ", l)], (
        f"{embedded} has a `#` heading after its title: make it `##`"
    )
    outside_fences = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    assert len(re.findall(r"^# ", outside_fences, re.M)) == 1


def test_every_image_a_page_shows_exists():
    for page in ["docs/index.md", "docs/benchmarks.md", "docs/guides/examples.md"]:
        images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", _read(page))
        if page != "docs/index.md":
            assert images, f"{page} shows no image"
        for image in images:
            path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), image))
            assert os.path.exists(path), f"{page} shows {image}, which does not exist"


def test_the_examples_page_shows_every_figure_in_docs_img():
    shown = set(re.findall(r"!\[[^\]]*\]\(\.\./img/([^)\s]+)\)", _read("docs/guides/examples.md")))
    pngs = {f for f in os.listdir(os.path.join(ROOT, "docs", "img")) if f.endswith(".png")}
    assert pngs <= shown, sorted(pngs - shown)


def test_a_page_named_in_the_text_is_a_link():
    """ "docs/porting.md has the mapping" is a dead end on the site: a page's path in the
    text (outside code blocks and link targets) should be a link to it."""
    bad = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        text = re.sub(r"^```.*?^```", "", open(path).read(), flags=re.S | re.M)
        text = re.sub(r"\]\([^)]*\)", "]()", text)  # link targets are fine
        for m in re.finditer(r"docs/[\w/-]+\.md", text):
            bad.append(f"{os.path.relpath(path, ROOT)}: {m.group(0)}")
    assert bad == [], "make these links: " + ", ".join(bad)


def test_the_site_has_an_address():
    """The sitemap and the 404 page need `site_url`; it comes from FUNCNET_SITE_URL."""
    config = _read("mkdocs.yml")
    assert re.search(r"^site_url: !ENV \[FUNCNET_SITE_URL, \"http[^\"]+/\"\]$", config, re.M)


def test_the_home_page_installs_and_trains():
    """The first page a newcomer sees has the install line and a train example (which
    tests/test_docs.py runs), and Getting started points the CI detail elsewhere."""
    home = _read("docs/index.md")
    assert 'pip install -e ".[examples]"' in home
    code = re.findall(r"^```python\n(.*?)^```", home, re.S | re.M)
    assert len(code) == 1 and "funcnet.fit(" in code[0]
    assert len(code[0].strip().splitlines()) <= 20
    start = _read("docs/getting-started.md")
    for detail in ["passed and", "| seed |", "FUNCNET_TEST_DEVICES"]:
        assert detail not in start and detail in _read("docs/contributing.md"), detail


def test_the_site_stylesheet_keeps_code_and_api_tables_in_the_column():
    """docs/stylesheets/extra.css (mkdocs.yml's extra_css) keeps two things inside the content
    column, both seen on tools/screenshots.py's pages at 1280 px: 88 columns of block code
    (the limit tests/test_docs.py holds the pages to; Material's size fits about 82), and
    the API reference's Parameters tables, whose descriptions hold unbreakable code
    ("params=float32,compute=bfloat16,output=float32" in funcnet.inference.export) that
    otherwise widened the table past the column."""
    assert re.search(r"^extra_css:\n  - stylesheets/extra\.css$", _read("mkdocs.yml"), re.M)
    css = re.sub(r"/\*.*?\*/", "", _read("docs/stylesheets/extra.css"), flags=re.S)
    rules = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        for selector in selectors.split(","):
            rules[selector.strip()] = rules.get(selector.strip(), "") + body
    assert re.search(r"font-size:\s*\.78em", rules[".md-typeset pre > code"])
    assert "overflow-wrap: anywhere" in rules[".md-typeset .doc-md-description code"]
    assert "width: 100%" in rules[".md-typeset .doc-contents td:has(> .doc-md-description)"]


def _heading_problems(text):
    """The section titles of a page's Markdown ``text`` that are not headings, or that skip a level."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    bad = [f"{m[0]} (make it a ## heading)" for m in re.finditer(r"^\*\*[^*]+\*\*$", text, re.M)]
    level = 1
    for m in re.finditer(r"^(#+) .*$", text, re.M):
        if len(m[1]) > level + 1:
            bad.append(f"'{m[0]}' follows a level-{level} heading")
        level = len(m[1])
    return bad


def test_sections_are_headings_that_nest():
    """Material's table of contents lists `##` and `###` headings only: a section titled by
    a bold line alone (`**Not checked**`, as docs/errors.md had) is missing from it, and a
    `###` right under the `#` title (docs/guides/transformers.md had one) is listed as if
    the page had no sections before it."""
    assert _heading_problems("# T\n\n**Not checked**\n\n```\n# code\n```\n### Sub\n") == [
        "**Not checked** (make it a ## heading)",
        "'### Sub' follows a level-1 heading",
    ]
    bad = [
        f"{os.path.relpath(path, ROOT)}: {problem}"
        for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
        for problem in _heading_problems(open(path).read())
    ]
    assert bad == [], "\n".join(bad)
