"""Full-page screenshots of every page of the built documentation site.

Builds the site (`mkdocs build`, into a temporary folder unless `--site` names one),
serves it with `http.server` on a free local port, and has headless Chromium (Debian's
`chromium` package, or `--chromium PATH`) take one PNG per page into `--out` (outside the
repository, /tmp/shots by default), named after the page's path. Look at each: clipped
code, broken images and raw Markdown show there and nowhere else.

```bash
pip install -e ".[docs]" && apt-get install chromium
python tools/screenshots.py --out /tmp/shots            # every page, 1280 x 4000
python tools/screenshots.py --only index benchmarks     # pages whose path contains a word
```

A page longer than `--height` pixels is cut there: the top of a long page is what a reader
sees first, and Chromium's `--screenshot` takes the window, not the whole document.
"""

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(site_dir):
    """`mkdocs build` into ``site_dir`` (not strict: a warning should not stop a look)."""
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--no-strict", "-q", "-d", site_dir], cwd=ROOT, check=True)


def pages(site_dir):
    """The site's pages, as paths relative to ``site_dir`` ("index.html", "api/core/index.html")."""
    found = []
    for dirpath, _, files in os.walk(site_dir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), site_dir)
            if f == "index.html" and not rel.startswith(("assets", "search")):
                found.append(rel)
    return sorted(found)


def serve(site_dir):
    """An HTTP server for ``site_dir`` on a free port, in a daemon thread; returns it."""
    handler = functools.partial(QuietHandler, directory=site_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would bury the script's own
        pass


def shoot(chromium, url, png, width, height, timeout):
    """One screenshot of ``url`` into ``png``; False (and a line on stderr) if it failed."""
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
        "--virtual-time-budget=3000",
        url,
    ]
    try:
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"screenshots: {url} failed: {e}", file=sys.stderr)
        return False
    return os.path.exists(png)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/shots", help="folder for the PNGs (outside the repo)")
    p.add_argument("--site", help="an already built site folder (default: build one)")
    p.add_argument("--only", nargs="*", default=[], help="pages whose path contains a word")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=4000)
    p.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per page")
    args = p.parse_args(argv)
    if not shutil.which(args.chromium):
        sys.exit(
            f"screenshots: no Chromium at {args.chromium!r}: install Debian's `chromium` "
            "package (apt-get install chromium) or pass --chromium PATH"
        )
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or os.path.join(tmp, "site")
        if not args.site:
            build(site)
        server = serve(site)
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        names = {pg: os.path.dirname(pg).replace(os.sep, "_") or "index" for pg in pages(site)}
        todo = [pg for pg, n in names.items() if not args.only or any(w in n for w in args.only)]
        failed = 0
        for page in todo:
            name = names[page]
            png = os.path.join(args.out, f"{name}.png")
            url = base + page[: -len("index.html")]
            failed += not shoot(args.chromium, url, png, args.width, args.height, args.timeout)
            print(png)
        server.shutdown()
    print(f"screenshots: {len(todo) - failed} of {len(todo)} pages in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
