"""funcnet.datasets.mnist: the search order, checksums, download (only through file://
URLs: tests never touch the network), and the shipped copy."""

import socket
import threading
import time

import numpy as np
import pytest

from funcnet import datasets
from funcnet.datasets import mnist
from helpers.idx_files import N, make_mnist_dir


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No repo copy, an empty cache, no env var, unreachable mirrors, no md5 table."""
    monkeypatch.setattr(mnist, "REPO_DATA_DIR", tmp_path / "repo")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FUNCNET_DATA_DIR", raising=False)
    monkeypatch.delenv("FUNCNET_MNIST_MIRRORS", raising=False)
    monkeypatch.setattr(mnist, "MNIST_MIRRORS", ((tmp_path / "no-mirror").as_uri() + "/",))
    monkeypatch.setattr(mnist, "MNIST_MD5", {})
    return tmp_path


# --------------------------------------------------------------------------- #
# mnist(): loading, search order, errors, download
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_from_data_dir(isolated, gz):
    images, labels, _ = make_mnist_dir(isolated / "d", marker=3, gz=gz, split="test")
    x, y = mnist.load("test", data_dir=isolated / "d")
    assert x.shape == (N, 28, 28, 1) and x.dtype == np.float32
    assert y.shape == (N,) and y.dtype == np.int32
    np.testing.assert_array_equal(x[..., 0], images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(y, labels)
    xf, _ = mnist.load("test", data_dir=isolated / "d", flatten=True)
    assert xf.shape == (N, 784)
    np.testing.assert_array_equal(xf, x.reshape(N, 784))
    x[:] = -1  # the caller owns its arrays: the in-process cache is unaffected
    x2, _ = mnist.load("test", data_dir=isolated / "d")
    assert x2.min() >= 0


def _marker(**kw):
    return int(mnist.load("train", **kw)[1][0])


def test_mnist_search_order(isolated, monkeypatch):
    make_mnist_dir(isolated / "arg", 1)
    make_mnist_dir(isolated / "env" / "mnist", 2)  # env var may point at the parent
    make_mnist_dir(isolated / "repo", 3)
    make_mnist_dir(isolated / "xdg" / "funcnet" / "mnist", 4)
    monkeypatch.setenv("FUNCNET_DATA_DIR", str(isolated / "env"))
    assert _marker(data_dir=isolated / "arg") == 1
    assert _marker() == 2
    monkeypatch.delenv("FUNCNET_DATA_DIR")
    assert _marker() == 3
    monkeypatch.setattr(mnist, "REPO_DATA_DIR", isolated / "nothing-here")
    assert _marker() == 4
    # a directory holding only one file of the split is passed over
    make_mnist_dir(isolated / "half", 5, only="train-images-idx3-ubyte")
    assert _marker(data_dir=isolated / "half") == 4


def test_mnist_md5_checked_for_known_files(isolated, monkeypatch):
    _, _, md5 = make_mnist_dir(isolated / "d", 1)
    monkeypatch.setattr(mnist, "MNIST_MD5", md5)
    assert _marker(data_dir=isolated / "d") == 1
    monkeypatch.setattr(mnist, "MNIST_MD5", {**md5, "train-labels-idx1-ubyte": "f" * 32})
    with pytest.raises(datasets.CorruptFileError, match="train-labels-idx1-ubyte.gz"):
        mnist.load("train", data_dir=isolated / "d")


def test_mnist_corrupt_file_is_an_error_not_a_fallback(isolated):
    make_mnist_dir(isolated / "d", 1)
    make_mnist_dir(isolated / "repo", 2)
    bad = isolated / "d" / "train-images-idx3-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-20])
    with pytest.raises(datasets.CorruptFileError) as info:
        mnist.load("train", data_dir=isolated / "d")
    assert str(bad) in str(info.value)


def test_mnist_not_found_lists_every_place(isolated, monkeypatch):
    monkeypatch.setenv("FUNCNET_DATA_DIR", str(isolated / "envdir"))
    with pytest.raises(datasets.MNISTNotFoundError) as info:
        mnist.load("train", data_dir=isolated / "argdir")
    assert isinstance(info.value, FileNotFoundError)
    msg = str(info.value)
    for place in (
        isolated / "argdir",
        isolated / "envdir",
        isolated / "repo",
        isolated / "xdg" / "funcnet" / "mnist",
        mnist.MNIST_MIRRORS[0],
    ):
        assert str(place) in msg, place
    assert "data_dir" in msg and "FUNCNET_DATA_DIR" in msg
    assert not any(p.is_file() for p in (isolated / "xdg").rglob("*"))  # no partial downloads
    with pytest.raises(datasets.MNISTNotFoundError, match="download=False"):
        mnist.load("test", download=False)


def test_mnist_download_into_cache(isolated, monkeypatch):
    images, labels, md5 = make_mnist_dir(isolated / "mirror", 7, split="test")
    monkeypatch.setattr(mnist, "MNIST_MIRRORS", ("file:///definitely/not/here/", (isolated / "mirror").as_uri() + "/"))
    monkeypatch.setattr(mnist, "MNIST_MD5", md5)
    x, y = mnist.load("test")
    np.testing.assert_array_equal(y, labels)
    cache = isolated / "xdg" / "funcnet" / "mnist"
    assert sorted(p.name for p in cache.iterdir()) == sorted(n + ".gz" for n in md5)
    # now served from the cache, no mirror needed
    monkeypatch.setattr(mnist, "MNIST_MIRRORS", ())
    np.testing.assert_array_equal(mnist.load("test")[0], x)


def test_mnist_download_with_bad_checksum_leaves_nothing(isolated, monkeypatch):
    _, _, md5 = make_mnist_dir(isolated / "mirror", 7, split="test")
    monkeypatch.setattr(mnist, "MNIST_MIRRORS", ((isolated / "mirror").as_uri() + "/",))
    monkeypatch.setattr(mnist, "MNIST_MD5", {k: "0" * 32 for k in md5})
    with pytest.raises(datasets.MNISTNotFoundError, match="md5"):
        mnist.load("test")
    cache = isolated / "xdg" / "funcnet" / "mnist"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_mnist_mirrors_from_environment(isolated, monkeypatch):
    _, labels, md5 = make_mnist_dir(isolated / "mirror", 7, split="test")
    monkeypatch.setattr(mnist, "MNIST_MD5", md5)
    # the module's mirror (isolated's) is unreachable: only the variable's second URL has the files
    monkeypatch.setenv("FUNCNET_MNIST_MIRRORS", f"file:///definitely/not/here/, {(isolated / 'mirror').as_uri()}")
    np.testing.assert_array_equal(mnist.load("test")[1], labels)
    assert (isolated / "xdg" / "funcnet" / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file()


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mnist_offline_error_is_fast_and_says_how_to_fix(isolated, monkeypatch):
    mirror = f"http://127.0.0.1:{_closed_port()}/mnist/"
    monkeypatch.setenv("FUNCNET_MNIST_MIRRORS", mirror)
    start = time.perf_counter()
    with pytest.raises(datasets.MNISTNotFoundError) as info:
        mnist.load("test")
    assert time.perf_counter() - start < 5
    msg = str(info.value)
    cache = isolated / "xdg" / "funcnet" / "mnist"
    # the URL that failed, where to put a manual download, and the two other ways out
    assert f"download {mirror}t10k-images-idx3-ubyte.gz and {mirror}t10k-labels-idx1-ubyte.gz into {cache}" in msg
    assert "FUNCNET_MNIST_MIRRORS" in msg and "load(data_dir=...)" in msg and "FUNCNET_DATA_DIR" in msg


def test_mnist_download_timeout_bounds_the_offline_wait():
    # a network that drops packets costs the timeout once per mirror before the error: keep it short
    assert mnist._DOWNLOAD_TIMEOUT_S * len(mnist.MNIST_MIRRORS) <= 30


def test_mnist_mirror_that_is_not_http_is_a_download_failure(isolated, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer_garbage():  # e.g. a port that belongs to another service
        conn, _ = server.accept()  # one file, one mirror: load() stops at the first failed file
        with conn:
            conn.recv(1024)
            conn.sendall(b"SSH-2.0-OpenSSH\r\n")

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    monkeypatch.setenv("FUNCNET_MNIST_MIRRORS", f"http://127.0.0.1:{server.getsockname()[1]}/")
    try:
        with pytest.raises(datasets.MNISTNotFoundError, match="127.0.0.1"):
            mnist.load("test")
    finally:
        server.close()


def test_mnist_installed_without_a_checkout_does_not_list_a_repository_copy(isolated, monkeypatch):
    # installed from a wheel, REPO_DATA_DIR points at <prefix>/lib/python3.X/data/mnist, which never exists
    monkeypatch.setattr(mnist, "REPO_DATA_DIR", isolated / "site" / "data" / "mnist")
    with pytest.raises(datasets.MNISTNotFoundError) as info:
        mnist.load("test")
    assert "repository copy" not in str(info.value) and "site" not in str(info.value)


def test_mnist_bad_split():
    with pytest.raises(ValueError, match="split"):
        mnist.load("validation")


# Class counts of the original MNIST release.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_shipped_mnist(monkeypatch):
    monkeypatch.delenv("FUNCNET_DATA_DIR", raising=False)
    for split, counts in (("train", TRAIN_COUNTS), ("test", TEST_COUNTS)):
        x, y = mnist.load(split, flatten=(split == "test"))
        n = sum(counts)
        assert x.shape == ((n, 28, 28, 1) if split == "train" else (n, 784))
        assert x.dtype == np.float32 and y.dtype == np.int32 and y.shape == (n,)
        assert x.min() == 0.0 and x.max() == 1.0
        assert np.bincount(y, minlength=10).tolist() == counts
