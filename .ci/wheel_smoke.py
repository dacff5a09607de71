"""The installed package's smoke test, run by .ci/run on a wheel built with `python -m build`.

Two commands:

```
python .ci/wheel_smoke.py build REPO DIST_DIR   # python -m build on a copy of the tree, then checks both files
python .ci/wheel_smoke.py smoke MNIST_DIR       # in a fresh venv with the wheel and its extras
```

`build` copies the files git sees (tracked, or new and not ignored) and builds there, so a stale
build/ or funcnet.egg-info/SOURCES.txt in the clone cannot change what goes into the sdist; it then
checks that the wheel holds exactly funcnet's modules and package data, and the sdist the sources,
README, LICENSE, CHANGELOG and pyproject.toml and none of tests/, data/, docs/, examples/, benchmarks/.

`smoke` runs from a directory outside the clone (Python puts only this script's `.ci/` on sys.path),
so every import comes from the installed wheel: it imports every funcnet module, runs a jitted train
step, each extra's feature once (export + load_exported, safetensors, orbax, TensorBoardLogger, the
examples' matplotlib and tqdm), and MNIST through `funcnet.datasets.mnist.load`'s download path:
MNIST_DIR's `.gz` files served by a local http.server, an empty user cache, the md5 checks; then a
second load from the cache with the server gone; then the offline error, which must come fast and
say what to do. Exits non-zero on any failure.
"""

import contextlib
import functools
import http.server
import importlib
import os
import pkgutil
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
import zipfile
from pathlib import Path

# --------------------------------------------------------------------------- #
# check-dist: the wheel and the sdist
# --------------------------------------------------------------------------- #


def _package_data(repo: Path) -> tuple:
    """The file names pyproject.toml's ``[tool.setuptools.package-data]`` lists for funcnet."""
    with open(repo / "pyproject.toml", "rb") as f:
        return tuple(tomllib.load(f)["tool"]["setuptools"]["package-data"]["funcnet"])


def _package_files(repo: Path) -> set:
    """funcnet's files in the tree, as git sees them (tracked, or new and not ignored)."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "funcnet"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {f for f in out if f.endswith(".py") or Path(f).name in _package_data(repo)}


def build(repo: Path, dist: Path) -> None:
    """``python -m build`` (sdist, then the wheel from it) on a clean copy of ``repo``; then check_dist."""
    files = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, files):
            if (repo / name).is_file():  # a tracked file deleted in the work tree is not copied
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / name, Path(tmp) / name)
        subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(dist), tmp], check=True, stdout=subprocess.DEVNULL
        )
    check_dist(dist, repo)


def check_dist(dist: Path, repo: Path) -> None:
    (wheel,), (sdist,) = sorted(dist.glob("funcnet-*.whl")), sorted(dist.glob("funcnet-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    in_pkg = {n for n in names if n.startswith("funcnet/")}
    meta = {n for n in names if ".dist-info/" in n}
    stray = set(names) - in_pkg - meta
    want = _package_files(repo)
    missing, extra = want - in_pkg, in_pkg - want
    assert not stray, f"wheel: files outside funcnet/ and its .dist-info: {sorted(stray)}"
    assert not missing, f"wheel: missing {sorted(missing)}; add non-.py files to [tool.setuptools.package-data]"
    assert not extra, f"wheel: files the tree does not have (a stale build?): {sorted(extra)}"
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    for need in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", *sorted(want)):
        assert need in members, f"sdist: {need} is missing (MANIFEST.in)"
    leaked = sorted(m for m in members if m.split("/")[0] in ("tests", "data", "benchmarks", "examples", "docs"))
    assert not leaked, f"sdist: repository-only files {leaked[:5]}... (MANIFEST.in prunes them)"
    subpackages = sorted({n.split("/")[1] for n in in_pkg if n.count("/") == 2})
    data = sorted(n for n in in_pkg if not n.endswith(".py"))
    print(
        f"check-dist: {wheel.name} {wheel.stat().st_size / 1e3:.0f} kB, {len(in_pkg)} files in funcnet/ "
        f"(subpackages {', '.join(subpackages)}; data files {', '.join(data) or 'none'}); "
        f"{sdist.name} {sdist.stat().st_size / 1e3:.0f} kB, {len(members)} entries"
    )


# --------------------------------------------------------------------------- #
# smoke: the installed wheel
# --------------------------------------------------------------------------- #


def _import_everything():
    import funcnet

    where = Path(funcnet.__file__).resolve()
    assert "site-packages" in where.parts, f"funcnet comes from {where}, not the installed wheel"
    modules = [m.name for m in pkgutil.walk_packages(funcnet.__path__, "funcnet.")]
    for name in modules:
        importlib.import_module(name)
    print(f"smoke: funcnet {funcnet.__version__} from {where.parent}, {len(modules)} modules imported")


def _train_step():
    import jax
    import numpy as np
    import optax

    import funcnet
    from funcnet import layers, losses

    net = funcnet.serial(layers.Dense(32), layers.BatchNorm(), layers.Relu, layers.Dense(10))
    opt = optax.adam(1e-2)
    ts = funcnet.TrainState.create(net, opt, jax.random.key(0), (-1, 16))

    def loss_fn(params, state, batch, rng):
        logits, state = net.apply(params, state, batch["x"], rng=rng, train=True)
        return losses.cross_entropy(logits, batch["y"]), funcnet.Aux(state=state)

    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(8, 16)).astype(np.float32), "y": rng.integers(0, 10, 8).astype(np.int32)}
    step = jax.jit(funcnet.make_train_step(loss_fn, opt))
    first = float(step(ts, batch)[1]["loss"])
    for _ in range(20):
        ts, metrics = step(ts, batch)
    assert float(metrics["loss"]) < first, (first, float(metrics["loss"]))
    print(f"smoke: jitted train step, loss {first:.3f} -> {float(metrics['loss']):.3f}")
    return net, ts


def _extras(net, ts, tmp: Path):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import funcnet
    from funcnet import callbacks, checkpoint, interop

    x = jax.random.normal(jax.random.key(1), (5, 16))
    predict = funcnet.make_predict_fn(net, ts.params, ts.state)
    funcnet.inference.export(net, ts.params, ts.state, (-1, 16), tmp / "model.fnx")  # [export]
    assert jnp.array_equal(funcnet.inference.load_exported(tmp / "model.fnx")(x), predict(x))
    interop.save_safetensors(tmp / "model.safetensors", ts.params, ts.state)  # [safetensors]
    params, state = interop.load_safetensors(tmp / "model.safetensors", ts.params, ts.state)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ts.params)))
    ckptr = checkpoint.OrbaxCheckpointer(tmp / "orbax")  # [orbax]
    ckptr.save(1, {"params": ts.params, "state": ts.state})
    ckptr.wait()
    back = ckptr.restore({"params": ts.params, "state": ts.state})
    ckptr.close()
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves((ts.params, ts.state))))
    logger = callbacks.TensorBoardLogger(tmp / "tb")  # [tensorboard]

    def loss_fn(params, state, batch, rng):
        return jnp.mean(net.apply(params, state, batch, rng=rng, train=True)[0] ** 2), funcnet.Aux(state=state)

    funcnet.fit(ts, loss_fn, optax.adam(1e-2), [np.ones((4, 16), np.float32)] * 2, callbacks=[logger], progress=False)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp / "tb").iterdir())
    import matplotlib  # [examples]

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import tqdm  # noqa: F401

    plt.plot([0, 1]), plt.savefig(tmp / "plot.png"), plt.close("all")
    print(
        "smoke: export + load_exported, save/load_safetensors, OrbaxCheckpointer, TensorBoardLogger, "
        "matplotlib + tqdm: ok"
    )


@contextlib.contextmanager
def _serve(directory: Path):
    """An http.server on 127.0.0.1 serving ``directory`` from a thread; yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mnist(mnist_dir: Path, tmp: Path):
    from funcnet.datasets import mnist

    os.environ.pop("FUNCNET_DATA_DIR", None)
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    cache = tmp / "cache" / "funcnet" / "mnist"
    with _serve(mnist_dir) as url:
        os.environ["FUNCNET_MNIST_MIRRORS"] = url
        start = time.perf_counter()
        (x, y), (xt, yt) = mnist.load("train"), mnist.load("test", flatten=True)
        took = time.perf_counter() - start
    assert x.shape == (60000, 28, 28, 1) and y.shape == (60000,), (x.shape, y.shape)
    assert xt.shape == (10000, 784) and yt[:5].tolist() == [7, 2, 1, 0, 4], (xt.shape, yt[:5])
    assert sorted(p.name for p in cache.iterdir()) == sorted(n + ".gz" for n in mnist.MNIST_MD5), cache
    os.environ["FUNCNET_MNIST_MIRRORS"] = f"http://127.0.0.1:{_closed_port()}/"
    assert mnist.load("test")[1][:5].tolist() == [7, 2, 1, 0, 4]  # the cache, no server
    print(f"smoke: MNIST downloaded from {url} into {cache} ({took:.1f} s, md5 checked), then read from the cache")
    os.environ["XDG_CACHE_HOME"] = str(tmp / "empty-cache")
    start = time.perf_counter()
    try:
        mnist.load("test")
    except mnist.MNISTNotFoundError as e:
        msg, took = str(e), time.perf_counter() - start
    else:
        raise AssertionError("mnist.load found MNIST with an empty cache and no mirror")
    for part in (
        "t10k-images-idx3-ubyte",
        str(tmp / "empty-cache"),
        "FUNCNET_MNIST_MIRRORS",
        "data_dir",
        "FUNCNET_DATA_DIR",
    ):
        assert part in msg, f"the offline error does not name {part!r}:\n{msg}"
    assert took < 5, f"the offline error took {took:.1f} s"
    print(f"smoke: offline, MNISTNotFoundError in {took:.2f} s:\n  " + msg.replace("\n", "\n  "))


def smoke(mnist_dir: Path):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    start = time.perf_counter()
    _import_everything()
    net, ts = _train_step()
    with tempfile.TemporaryDirectory() as tmp:
        _extras(net, ts, Path(tmp))
        _mnist(mnist_dir, Path(tmp))
    print(f"wheel smoke: ok ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 4:
        build(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve())
    elif sys.argv[1:2] == ["smoke"] and len(sys.argv) == 3:
        smoke(Path(sys.argv[2]).resolve())
    else:
        sys.exit(__doc__)
