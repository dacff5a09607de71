"""funcnet.data: batching reproducibility and device prefetching."""

import itertools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from funcnet import data


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


@pytest.mark.parametrize("rng", [0, jax.random.key(0), jax.random.PRNGKey(0)], ids=["int", "typed-key", "legacy-key"])
def test_shuffle_reproducible_and_covers_everything(rng):
    x, y = _arrays(10)

    def run(**kw):
        return [b[1] for b in data.batches((x, y), 3, shuffle=True, rng=rng, drop_remainder=False, **kw)]

    first = run(epoch=0)
    seen = np.concatenate(first)
    assert sorted(seen.tolist()) == y.tolist()  # every item exactly once
    assert seen.tolist() != y.tolist()  # actually shuffled
    for b in data.batches((x, y), 3, shuffle=True, rng=rng, drop_remainder=False, epoch=0):
        np.testing.assert_array_equal(b[0][:, 0], b[1] // 5)  # rows stay aligned
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
    np.testing.assert_array_equal(data.epoch_order(50, 3, epoch=4), np.random.default_rng([3, 4]).permutation(50))
    key = jax.random.key(3)
    np.testing.assert_array_equal(
        data.epoch_order(50, key, epoch=4), np.asarray(jax.random.permutation(jax.random.fold_in(key, 4), 50))
    )
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
# background
# --------------------------------------------------------------------------- #


def _background_threads():
    return [t for t in threading.enumerate() if t.name == "funcnet-background" and t.is_alive()]


def test_background_gives_the_same_batches_in_order_bit_for_bit():
    x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    y = np.arange(50)
    for shuffle, size in [(False, 1), (True, 2), (True, 7)]:
        kw = dict(shuffle=shuffle, rng=3, drop_remainder=False)
        sync = list(data.batches((x, y), 4, **kw))
        with data.background(data.batches((x, y), 4, **kw), size=size) as it:
            threaded = list(it)
        assert len(threaded) == len(sync) == 13
        for a, b in zip(threaded, sync):
            for u, v in zip(a, b):
                assert u.dtype == v.dtype and u.tobytes() == v.tobytes()
    # transform runs in the thread, on every item, in order
    with data.background(range(6), size=2, transform=lambda i: i * 10) as it:
        assert list(it) == [0, 10, 20, 30, 40, 50]
    assert _background_threads() == []


def test_background_reraises_the_sources_exception_with_the_item_index():
    class Broken(Exception):
        pass

    def source():
        yield from range(3)
        raise Broken("bad file")

    got = []
    with pytest.raises(Broken, match="bad file") as info:
        with data.background(source(), size=1) as it:
            for item in it:
                got.append(item)
    assert got == [0, 1, 2]  # the good items first, in order
    assert any("item 3" in note for note in info.value.__notes__)
    with pytest.raises(ZeroDivisionError) as info:
        list(data.background(range(5), transform=lambda i: 1 // (i - 2)))
    assert any("item 2" in note for note in info.value.__notes__)
    assert _background_threads() == []


def test_background_stays_bounded_and_stops_when_the_consumer_stops():
    pulled, closed = [], []

    def source():
        try:
            for i in itertools.count():
                pulled.append(i)
                yield i
        finally:
            closed.append(True)  # the generator is closed, in the thread

    with data.background(source(), size=3) as it:
        assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
        time.sleep(0.05)
        # consumed + `size` queued + at most one waiting to be queued
        assert 4 + 3 <= len(pulled) <= 4 + 3 + 1
    assert closed == [True] and _background_threads() == []

    # Stopped by an exception in the consuming loop (as fit stops on KeyboardInterrupt).
    class Stop(BaseException):
        pass

    with pytest.raises(Stop):
        with data.background(source(), size=2) as it:
            for i in it:
                if i == 5:
                    raise Stop
    assert _background_threads() == []
    with pytest.raises(ValueError, match="background: size"):
        data.background(range(3), size=0)


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
    assert pulled == []  # lazy until the first next()
    for expected in range(5):
        assert int(next(it)["i"][0]) == expected
        assert len(pulled) == expected + 1 + 3  # consumed + `size` in flight


@pytest.mark.devices(4)
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
        expected = x[i * 4 * ndev : (i + 1) * 4 * ndev].reshape(ndev, -1).sum(1)
        np.testing.assert_allclose(np.asarray(step(batch)), expected)
    with pytest.raises(ValueError, match="size"):
        data.prefetch_to_device([], size=0)


def test_device_data_yields_the_batches_of_batches():
    x = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    y = np.arange(70, dtype=np.int32)
    for kw in (dict(shuffle=True, rng=5), dict(), dict(shuffle=True, rng=5, drop_remainder=False)):
        dd = data.DeviceData({"x": x, "y": y}, 16, **kw)
        for epoch in (0, 3):
            got = list(dd(epoch))
            want = list(data.batches({"x": x, "y": y}, 16, epoch=epoch, **kw))
            assert len(got) == len(want) == dd.num_batches
            for g, w in zip(got, want):
                assert set(g) == {"x", "y"} and isinstance(g["x"], jax.Array)
                np.testing.assert_array_equal(g["x"], w["x"])
                np.testing.assert_array_equal(g["y"], w["y"])
    full, tail = data.DeviceData(x, 16, shuffle=True, rng=5, drop_remainder=False).order(1)
    assert full.shape == (4, 16) and tail.shape == (6,) and full.dtype == np.int32
    assert sorted(np.concatenate([full.ravel(), tail])) == list(range(70))


def test_take_ordered_reads_the_rows_take_gathers():
    """fit's read of a batch of the data set's own order: a slice where the order is
    consecutive, the same rows as ``take`` either way (the tail too)."""
    x = np.arange(70 * 3, dtype=np.float32).reshape(70, 3)
    for kw in (dict(drop_remainder=False), dict(shuffle=True, rng=5, drop_remainder=False)):
        dd = data.DeviceData({"x": x, "y": np.arange(70, dtype=np.int32)}, 16, **kw)
        full, tail = dd.order(2)
        ordered, take = jax.jit(dd.take_ordered), jax.jit(dd.take)
        for idx in list(full) + [tail]:
            got, want = ordered(dd.arrays, idx), take(dd.arrays, idx)
            np.testing.assert_array_equal(got["x"], want["x"])
            np.testing.assert_array_equal(got["y"], want["y"])
            np.testing.assert_array_equal(got["y"], idx)
        text = jax.jit(dd.take_ordered).lower(dd.arrays, full[1]).as_text()
        assert ("gather" in text) == dd.shuffle  # consecutive rows: a dynamic slice


@pytest.mark.devices(4)
def test_device_data_errors():
    x = np.zeros((10, 2), np.float32)
    with pytest.raises(ValueError, match=r"all arrays need the same leading size, got \{0: 10, 1: 9\}"):
        data.DeviceData((x, np.zeros(9)), 4)
    with pytest.raises(ValueError, match="batch_size=16 is larger than the 10 examples"):
        data.DeviceData(x, 16)
    with pytest.raises(ValueError, match="shuffle=True needs rng="):
        data.DeviceData(x, 4, shuffle=True)
    with pytest.raises(TypeError, match="rng must be"):
        data.DeviceData(x, 4, shuffle=True, rng="seed")
    with pytest.raises(TypeError, match="boolean, integer or floating dtypes, got \\['complex64'\\]"):
        data.DeviceData(x.astype(np.complex64), 4)
    with pytest.raises(TypeError, match="device must be None .*, got str"):
        data.DeviceData(x, 4, device="cpu")
    mesh = jax.make_mesh((4,), ("data",))  # conftest: 4 CPU devices
    with pytest.raises(ValueError, match="a batch of 6 examples cannot be split evenly over 4"):
        data.DeviceData(x, 6, device=mesh)
    with pytest.raises(ValueError, match="a batch of 2 examples cannot be split evenly over 4"):
        data.DeviceData(x, 4, drop_remainder=False, device=mesh)  # the last batch: 10 % 4


@pytest.mark.devices(4)
def test_device_data_split_over_a_mesh_gathers_exact_batches():
    """Rows split over 4 devices (10 rows: padded to 12); every dtype comes back bit for bit,
    -0.0 and NaN payloads included, each batch split over the mesh."""
    mesh = jax.make_mesh((4,), ("data",))
    x = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    x[1, 0], x[2, 1] = -0.0, np.float32(np.nan)
    arrays = {"x": x, "h": x.astype(jnp.bfloat16), "i": np.arange(10, dtype=np.int8), "b": np.arange(10) % 3 == 0}
    dd = data.DeviceData(arrays, 4, shuffle=True, rng=1, device=mesh)
    assert dd.arrays["x"].shape == (12, 3) and "split over 4 devices" in repr(dd)
    got = list(dd(2))
    want = list(data.batches(arrays, 4, shuffle=True, rng=1, epoch=2))
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        for k in arrays:
            assert g[k].sharding.spec[0] == "data" and g[k].dtype == w[k].dtype
            np.testing.assert_array_equal(np.asarray(g[k]).view(np.uint8), w[k].view(np.uint8))
