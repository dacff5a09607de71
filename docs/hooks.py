"""mkdocs hook: the docstrings' Sphinx roles (:func:`funcnet.fit`) as links into the API reference.

funcnet's docstrings cross-reference with Sphinx roles, which Markdown leaves as text
(":func:" before the code). Each role becomes an optional mkdocs-autorefs reference: a
link when the name is documented on the site (a bare name is looked up in the page's own
module first), plain code otherwise (``jax.export``, names of other libraries).
``:math:`` formulas are shown as code.
"""

import re

_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|obj|exc):<code>~?([A-Za-z_][\w.]*)(\(\))?</code>")


def on_page_content(html, page, config, files):
    module = None
    if page.file.src_uri.startswith("api/layers/"):  # the family pages render funcnet.layers
        module = "funcnet.layers"
    elif page.file.src_uri.startswith("api/") and page.file.src_uri != "api/index.md":
        module = "funcnet." + page.file.src_uri[len("api/") : -len(".md")]

    def link(m):
        name, call = m[1], m[2] or ""
        target = name if name.startswith(("funcnet.", "jax.", "optax.")) or not module else f"{module}.{name}"
        return f'<autoref identifier="{target}" optional><code>{name}{call}</code></autoref>'

    # :math:`...` formulas stay code (no math renderer on this site): the role goes.
    return _ROLE.sub(link, html).replace(":math:<code>", "<code>")
