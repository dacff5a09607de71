"""funcnet.data: idx parsing and its failure modes, the MNIST search order and
download (only through file:// URLs: tests never touch the network), batching
reproducibility, and device prefetching."""
import gzip
import hashlib
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import data

N = 5  # examples in the synthetic MNIST files


# --------------------------------------------------------------------------- #
# helpers: an independent idx writer
# --------------------------------------------------------------------------- #

_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
          np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def idx_bytes(arr):
    arr = np.asarray(arr)
    big = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 else arr
    header = bytes([0, 0, _CODES[big.dtype], arr.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return header + big.tobytes()


def write_idx(path, arr, gz=True):
    raw = idx_bytes(arr)
    Path(path).write_bytes(gzip.compress(raw) if gz else raw)
    return hashlib.md5(raw).hexdigest()


def make_mnist_dir(directory, marker, gz=True, split="train", only=None):
    """Writes a tiny MNIST split whose labels are all `marker` (to tell copies apart)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(marker)
    images = rng.integers(0, 256, size=(N, 28, 28), dtype=np.uint8)
    labels = np.full((N,), marker, np.uint8)
    img_name, lbl_name = data.MNIST_FILES[split]
    md5 = {}
    for name, arr in ((img_name, images), (lbl_name, labels)):
        if only is None or only == name:
            md5[name] = write_idx(directory / (name + (".gz" if gz else "")), arr, gz)
    return images, labels, md5


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No repo copy, an empty cache, no env var, unreachable mirrors, no md5 table."""
    monkeypatch.setattr(data, "REPO_DATA_DIR", tmp_path / "repo")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FUNCNET_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "MNIST_MIRRORS", ((tmp_path / "no-mirror").as_uri() + "/",))
    monkeypatch.setattr(data, "MNIST_MD5", {})
    return tmp_path


# --------------------------------------------------------------------------- #
# read_idx
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("arr", [
    np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    np.array([-7, 0, 123456789], dtype=">i4"),
    np.linspace(-1, 1, 6).reshape(3, 2).astype(">f8"),
], ids=["u8", "i32", "f64"])
def test_read_idx_roundtrip(tmp_path, arr, gz):
    path = tmp_path / "x.idx"
    md5 = write_idx(path, arr, gz)
    out = data.read_idx(path, md5=md5)
    assert out.shape == arr.shape and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def _good_raw():
    return idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5))


@pytest.mark.parametrize("content,why", [
    (lambda: gzip.compress(_good_raw())[:-12], "bad gzip"),
    (lambda: _good_raw()[:-7], "size mismatch"),
    (lambda: _good_raw() + b"\0", "size mismatch"),
    (lambda: _good_raw()[:10], "ends after"),
    (lambda: b"\x12\x34\x56\x78" + _good_raw()[4:], "wrong magic"),
    (lambda: b"\0\0", "shorter than an idx header"),
    (lambda: (lambda z: z[:30] + bytes(b ^ 0xFF for b in z[30:60]) + z[60:])(
        gzip.compress(_good_raw())), "bad gzip"),
], ids=["truncated-gz", "truncated-raw", "trailing", "short-header", "magic", "tiny", "flipped-gz"])
def test_read_idx_corrupt_files_name_the_file(tmp_path, content, why):
    path = tmp_path / "broken-idx3-ubyte.gz"
    path.write_bytes(content())
    with pytest.raises(data.CorruptFileError, match=why) as info:
        data.read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_md5_mismatch(tmp_path):
    path = tmp_path / "ok.gz"
    md5 = write_idx(path, np.zeros((2, 2), np.uint8))
    wrong = "0" * 32
    with pytest.raises(data.CorruptFileError, match=f"expected {wrong}") as info:
        data.read_idx(path, md5=wrong)
    assert str(path) in str(info.value) and md5 in str(info.value)


# --------------------------------------------------------------------------- #
# mnist(): loading, search order, errors, download
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("gz", [True, False])
def test_mnist_from_data_dir(isolated, gz):
    images, labels, _ = make_mnist_dir(isolated / "d", marker=3, gz=gz, split="test")
    x, y = data.mnist("test", data_dir=isolated / "d")
    assert x.shape == (N, 28, 28, 1) and x.dtype == np.float32
    assert y.shape == (N,) and y.dtype == np.int32
    np.testing.assert_array_equal(x[..., 0], images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(y, labels)
    xf, _ = data.mnist("test", data_dir=isolated / "d", flatten=True)
    assert xf.shape == (N, 784)
    np.testing.assert_array_equal(xf, x.reshape(N, 784))
    x[:] = -1  # the caller owns its arrays: the in-process cache is unaffected
    x2, _ = data.mnist("test", data_dir=isolated / "d")
    assert x2.min() >= 0


def _marker(**kw):
    return int(data.mnist("train", **kw)[1][0])


def test_mnist_search_order(isolated, monkeypatch):
    make_mnist_dir(isolated / "arg", 1)
    make_mnist_dir(isolated / "env" / "mnist", 2)     # env var may point at the parent
    make_mnist_dir(isolated / "repo", 3)
    make_mnist_dir(isolated / "xdg" / "funcnet" / "mnist", 4)
    monkeypatch.setenv("FUNCNET_DATA_DIR", str(isolated / "env"))
    assert _marker(data_dir=isolated / "arg") == 1
    assert _marker() == 2
    monkeypatch.delenv("FUNCNET_DATA_DIR")
    assert _marker() == 3
    monkeypatch.setattr(data, "REPO_DATA_DIR", isolated / "nothing-here")
    assert _marker() == 4
    # a directory holding only one file of the split is passed over
    make_mnist_dir(isolated / "half", 5, only="train-images-idx3-ubyte")
    assert _marker(data_dir=isolated / "half") == 4


def test_mnist_md5_checked_for_known_files(isolated, monkeypatch):
    _, _, md5 = make_mnist_dir(isolated / "d", 1)
    monkeypatch.setattr(data, "MNIST_MD5", md5)
    assert _marker(data_dir=isolated / "d") == 1
    monkeypatch.setattr(data, "MNIST_MD5", {**md5, "train-labels-idx1-ubyte": "f" * 32})
    with pytest.raises(data.CorruptFileError, match="train-labels-idx1-ubyte.gz"):
        data.mnist("train", data_dir=isolated / "d")


def test_mnist_corrupt_file_is_an_error_not_a_fallback(isolated):
    make_mnist_dir(isolated / "d", 1)
    make_mnist_dir(isolated / "repo", 2)
    bad = isolated / "d" / "train-images-idx3-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-20])
    with pytest.raises(data.CorruptFileError) as info:
        data.mnist("train", data_dir=isolated / "d")
    assert str(bad) in str(info.value)


def test_mnist_not_found_lists_every_place(isolated, monkeypatch):
    monkeypatch.setenv("FUNCNET_DATA_DIR", str(isolated / "envdir"))
    with pytest.raises(data.MNISTNotFoundError) as info:
        data.mnist("train", data_dir=isolated / "argdir")
    assert isinstance(info.value, FileNotFoundError)
    msg = str(info.value)
    for place in (isolated / "argdir", isolated / "envdir", isolated / "repo",
                  isolated / "xdg" / "funcnet" / "mnist", data.MNIST_MIRRORS[0]):
        assert str(place) in msg, place
    assert "data_dir" in msg and "FUNCNET_DATA_DIR" in msg
    assert not any(p.is_file() for p in (isolated / "xdg").rglob("*"))  # no partial downloads
    with pytest.raises(data.MNISTNotFoundError, match="download=False"):
        data.mnist("test", download=False)


def test_mnist_download_into_cache(isolated, monkeypatch):
    images, labels, md5 = make_mnist_dir(isolated / "mirror", 7, split="test")
    monkeypatch.setattr(data, "MNIST_MIRRORS", ("file:///definitely/not/here/",
                                                (isolated / "mirror").as_uri() + "/"))
    monkeypatch.setattr(data, "MNIST_MD5", md5)
    x, y = data.mnist("test")
    np.testing.assert_array_equal(y, labels)
    cache = isolated / "xdg" / "funcnet" / "mnist"
    assert sorted(p.name for p in cache.iterdir()) == sorted(n + ".gz" for n in md5)
    # now served from the cache, no mirror needed
    monkeypatch.setattr(data, "MNIST_MIRRORS", ())
    np.testing.assert_array_equal(data.mnist("test")[0], x)


def test_mnist_download_with_bad_checksum_leaves_nothing(isolated, monkeypatch):
    _, _, md5 = make_mnist_dir(isolated / "mirror", 7, split="test")
    monkeypatch.setattr(data, "MNIST_MIRRORS", ((isolated / "mirror").as_uri() + "/",))
    monkeypatch.setattr(data, "MNIST_MD5", {k: "0" * 32 for k in md5})
    with pytest.raises(data.MNISTNotFoundError, match="md5"):
        data.mnist("test")
    cache = isolated / "xdg" / "funcnet" / "mnist"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_mnist_bad_split():
    with pytest.raises(ValueError, match="split"):
        data.mnist("validation")


# Class counts of the original MNIST release.
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_shipped_mnist(monkeypatch):
    monkeypatch.delenv("FUNCNET_DATA_DIR", raising=False)
    for split, counts in (("train", TRAIN_COUNTS), ("test", TEST_COUNTS)):
        x, y = data.mnist(split, flatten=(split == "test"))
        n = sum(counts)
        assert x.shape == ((n, 28, 28, 1) if split == "train" else (n, 784))
        assert x.dtype == np.float32 and y.dtype == np.int32 and y.shape == (n,)
        assert x.min() == 0.0 and x.max() == 1.0
        assert np.bincount(y, minlength=10).tolist() == counts


# --------------------------------------------------------------------------- #
# batches
# --------------------------------------------------------------------------- #

def _arrays(n=10):
    return np.arange(n * 2).reshape(n, 2), np.arange(n) * 10


def test_batches_in_order_and_remainder():
    x, y = _arrays(10)
    out = list(data.batches((x, y), 4))
    assert len(out) == 2 == data.num_batches(10, 4)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in out]), x[:8])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in out]), y[:8])
    out = list(data.batches((x, y), 4, drop_remainder=False))
    assert [len(b[1]) for b in out] == [4, 4, 2] and data.num_batches(10, 4, False) == 3
    np.testing.assert_array_equal(np.concatenate([b[1] for b in out]), y)


def test_batches_dict_and_single_array():
    x, y = _arrays(6)
    out = list(data.batches({"image": x, "label": y}, 3))
    assert [list(b) for b in out] == [["image", "label"]] * 2
    np.testing.assert_array_equal(out[1]["label"], y[3:])
    single = list(data.batches(y, 3))
    np.testing.assert_array_equal(single[0], y[:3])


@pytest.mark.parametrize("rng", [0, jax.random.key(0), jax.random.PRNGKey(0)],
                         ids=["int", "typed-key", "legacy-key"])
def test_shuffle_reproducible_and_covers_everything(rng):
    x, y = _arrays(10)

    def run(**kw):
        return [b[1] for b in data.batches((x, y), 3, shuffle=True, rng=rng,
                                           drop_remainder=False, **kw)]

    first = run(epoch=0)
    seen = np.concatenate(first)
    assert sorted(seen.tolist()) == y.tolist()          # every item exactly once
    assert seen.tolist() != y.tolist()                  # actually shuffled
    for b in data.batches((x, y), 3, shuffle=True, rng=rng, drop_remainder=False, epoch=0):
        np.testing.assert_array_equal(b[0][:, 0], b[1] // 5)   # rows stay aligned
    assert all(np.array_equal(a, b) for a, b in zip(first, run(epoch=0)))
    assert np.concatenate(run(epoch=1)).tolist() != seen.tolist()
    # resuming mid-epoch sees exactly the remaining batches
    rest = run(epoch=0, skip=2)
    assert len(rest) == len(first) - 2
    assert all(np.array_equal(a, b) for a, b in zip(first[2:], rest))
    no_epoch = np.concatenate(run())
    assert sorted(no_epoch.tolist()) == y.tolist()


def test_epoch_order_seeds():
    # int seeds follow numpy's documented SeedSequence derivation
    np.testing.assert_array_equal(data.epoch_order(50, 3, epoch=4),
                                  np.random.default_rng([3, 4]).permutation(50))
    key = jax.random.key(3)
    np.testing.assert_array_equal(data.epoch_order(50, key, epoch=4),
                                  np.asarray(jax.random.permutation(jax.random.fold_in(key, 4), 50)))
    a = data.epoch_order(50, np.random.default_rng(1))
    np.testing.assert_array_equal(a, np.random.default_rng(1).permutation(50))
    with pytest.raises(TypeError, match="Generator"):
        data.epoch_order(50, np.random.default_rng(1), epoch=2)
    with pytest.raises(TypeError):
        data.epoch_order(50, "seed")


def test_shuffle_drop_remainder_drops_a_random_tail():
    y = np.arange(10)
    out = np.concatenate(list(data.batches(y, 4, shuffle=True, rng=1)))
    assert len(out) == 8 and len(set(out.tolist())) == 8


def test_batches_errors_are_eager():
    x, y = _arrays(10)
    with pytest.raises(ValueError, match=r"same leading size.*10.*9"):
        data.batches((x, y[:9]), 2)
    with pytest.raises(ValueError, match="rng"):
        data.batches((x, y), 2, shuffle=True)
    with pytest.raises(ValueError, match="larger than"):
        data.batches((x, y), 11)
    with pytest.raises(ValueError, match="batch_size"):
        data.batches((x, y), 0)
    assert len(list(data.batches((x, y), 11, drop_remainder=False))) == 1


# --------------------------------------------------------------------------- #
# prefetch_to_device
# --------------------------------------------------------------------------- #

def test_prefetch_same_values_in_order():
    x, y = _arrays(10)
    host = list(data.batches((x, y), 3, drop_remainder=False))
    dev = list(data.prefetch_to_device(data.batches((x, y), 3, drop_remainder=False), size=2))
    assert len(dev) == len(host)
    for h, d in zip(host, dev):
        assert isinstance(d, tuple) and all(isinstance(a, jax.Array) for a in d)
        for a, b in zip(h, d):
            np.testing.assert_array_equal(np.asarray(b), a)


def test_prefetch_stays_bounded_ahead():
    pulled = []

    def source():
        for i in itertools.count():
            pulled.append(i)
            yield {"i": np.array([i])}

    it = data.prefetch_to_device(source(), size=3, device=jax.devices()[0])
    assert pulled == []                                 # lazy until the first next()
    for expected in range(5):
        assert int(next(it)["i"][0]) == expected
        assert len(pulled) == expected + 1 + 3          # consumed + `size` in flight


def test_prefetch_for_pmap():
    ndev = jax.device_count()
    assert ndev == 4
    x = np.arange(8 * ndev * 3, dtype=np.float32).reshape(8 * ndev, 3)
    shard = lambda b: b.reshape(ndev, -1, *b.shape[1:])  # noqa: E731
    it = data.prefetch_to_device(data.batches(x, 4 * ndev), device=jax.devices(), transform=shard)
    step = jax.pmap(lambda b: jnp.sum(b))
    for i, batch in enumerate(it):
        assert batch.shape == (ndev, 4, 3)
        assert {s.device for s in batch.addressable_shards} == set(jax.devices())
        expected = x[i * 4 * ndev:(i + 1) * 4 * ndev].reshape(ndev, -1).sum(1)
        np.testing.assert_allclose(np.asarray(step(batch)), expected)
    with pytest.raises(ValueError, match="size"):
        data.prefetch_to_device([], size=0)
