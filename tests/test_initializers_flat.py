"""funcnet's uniform initializers draw a kernel flat and reshape it (XLA:CPU compiles a
flat draw several times faster): the same bits as jax's own initializers, every case."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.nn.initializers import variance_scaling

from funcnet import initializers as fi
from funcnet.layers import Conv, Dense

SHAPES = [(100, 10), (7, 1), (1, 7), (65, 512), (3, 3, 1, 32), (5, 5, 3, 7), (2, 3, 4, 5, 6)]
# For the other dtypes and key kinds, the shapes whose counts are odd (a 16-bit draw splits
# 32-bit words in two; 64 bits take two words) and the deepest: each compiles two draws.
FEW = [(7, 1), (5, 5, 3, 7), (2, 3, 4, 5, 6)]
KEYS = {"typed": jax.random.key(3), "raw uint32": jax.random.PRNGKey(3)}
# (key, dtype, shapes): every shape for the default draw; the key kind is independent of
# the dtype (a raw key and a typed one give the same bits), so raw keys in float32 only
DRAWS = [
    ("typed", jnp.float32, SHAPES),
    ("typed", jnp.bfloat16, FEW),
    ("typed", jnp.float16, FEW),
    ("raw uint32", jnp.float32, FEW),
]


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same(ours, theirs):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_array_equal(_bits(ours), _bits(theirs))


# funcnet's initializer and the jax.nn.initializers one it must equal bit for bit
CASES = {
    "xavier_uniform": (fi.xavier_uniform(), variance_scaling(1.0, "fan_avg", "uniform")),
    "xavier_uniform gain 2": (fi.xavier_uniform(2.0), variance_scaling(4.0, "fan_avg", "uniform")),
    "kaiming_uniform relu fan_out": (
        fi.kaiming_uniform(0.0, "fan_out", "relu"),
        variance_scaling(2.0, "fan_out", "uniform"),
    ),
    "torch_default": (fi.torch_default(), variance_scaling(1 / 3, "fan_in", "uniform")),
    "torch_default transposed": (
        fi.torch_default(in_axis=-1, out_axis=-2),
        variance_scaling(1 / 3, "fan_in", "uniform", in_axis=-1, out_axis=-2),
    ),
    "uniform_symmetric": (fi.uniform_symmetric(0.125), lambda k, s, d: jax.random.uniform(k, s, d, -0.125, 0.125)),
}


def theirs_torch(key, shape):
    """jax's initializer that ``torch_default()`` must equal."""
    return variance_scaling(1 / 3, "fan_in", "uniform")(key, shape, jnp.float32)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize(
    "key, dtype, shapes", DRAWS, ids=[f"{k}-{jnp.dtype(d).name}-{len(s)} shapes" for k, d, s in DRAWS]
)
def test_the_same_bits_as_jax(name, key, dtype, shapes):
    ours, theirs = CASES[name]
    for shape in shapes:
        _same(ours(KEYS[key], shape, dtype), theirs(KEYS[key], shape, dtype))


@pytest.mark.parametrize("partitionable", [True, False])
def test_the_same_bits_with_threefry_partitionable_either_way(partitionable):
    configured = jax.config.jax_threefry_partitionable  # test_the_same_bits_as_jax's mode
    with jax.threefry_partitionable(partitionable):
        if partitionable != configured:  # every shape in float32 for the other mode too
            ours, theirs = CASES["torch_default"]
            for shape in SHAPES:
                _same(ours(KEYS["typed"], shape, jnp.float32), theirs(KEYS["typed"], shape, jnp.float32))
        with jax.enable_x64(True):  # float64 draws take 64 bits per value
            for name in ("torch_default", "uniform_symmetric"):
                ours, theirs = CASES[name]
                for shape in FEW:
                    _same(ours(KEYS["raw uint32"], shape, jnp.float64), theirs(KEYS["raw uint32"], shape, jnp.float64))


def test_the_same_bits_inside_jit_and_for_layers():
    ours, theirs = CASES["xavier_uniform"]
    key = KEYS["typed"]
    _same(jax.jit(lambda k: ours(k, (100, 10)))(key), theirs(key, (100, 10), jnp.float32))
    # Dense and Conv with their defaults (torch_default weights, torch_default_bias)
    k1, k2 = jax.random.split(jax.random.key(0))
    _, params, _ = Dense(10).init(jax.random.key(0), (-1, 100))
    _same(params["W"], theirs_torch(k1, (100, 10)))
    _same(params["b"], jax.random.uniform(k2, (10,), jnp.float32, -0.1, 0.1))
    _, conv, _ = Conv(7, (5, 5)).init(jax.random.key(1), (-1, 12, 12, 3))
    want = Conv(7, (5, 5), W_init=variance_scaling(1 / 3, "fan_in", "uniform"))
    _same(conv["W"], want.init(jax.random.key(1), (-1, 12, 12, 3))[1]["W"])


@pytest.fixture
def drawn(monkeypatch):
    """The shapes ``jax.random.uniform`` is asked for while the test runs, in order."""
    shapes = []
    uniform = jax.random.uniform

    def spy(key, shape, *args, **kwargs):
        shapes.append(tuple(shape))
        return uniform(key, shape, *args, **kwargs)

    monkeypatch.setattr(jax.random, "uniform", spy)
    return shapes


def _compiled(caplog, draw):
    """The names of the programs JAX compiles while ``draw()`` runs."""
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        jax.block_until_ready(draw())
    return [r.getMessage().split(" with ")[0] for r in caplog.records if r.getMessage().startswith("Compiling ")]


def test_an_eager_init_shares_one_flat_draw_between_sizes(caplog, drawn):
    """What makes it faster: an eager init draws in one axis (jax's own initializer, and
    older code, compile ``jit(_uniform)`` in the kernel's shape), and with partitionable
    threefry (jax's default) sizes share a draw: a new size compiles only the slice and
    reshape (``_first``), not a draw. Under a trace the program is the caller's: jax's
    draw, which sharded outputs split by."""
    assert jax.config.jax_threefry_partitionable  # jax's default, which the suite runs
    key = KEYS["typed"]
    # sizes drawn nowhere else in the suite, so compiled here and not found in memory
    fi.torch_default()(key, (23, 7, 3), jnp.float32)  # 483 values: the shared 4096 draw
    compiled = _compiled(caplog, lambda: fi.torch_default()(key, (29, 3, 5), jnp.float32))
    assert any("_first" in c for c in compiled), compiled
    assert not any("_uniform" in c for c in compiled), compiled  # the 4096 draw, again
    compiled = _compiled(caplog, lambda: fi.uniform_symmetric(0.3)(key, (437,), jnp.float32))
    assert not any("_uniform" in c for c in compiled), compiled  # a bias shares it too
    big = (61, 173, 3)  # 31659 values: the next power of two
    _same(fi.torch_default()(key, big, jnp.float32), theirs_torch(key, big))
    assert drawn == [(4096,), (4096,), (4096,), (32768,)], drawn
    traced = jax.jit(lambda k: fi.torch_default()(k, (100, 10))).lower(key).as_text()
    assert "100x10xui32" in traced  # jax's draw, in the kernel's shape


def test_the_older_threefry_draws_each_size_flat_and_exactly():
    """Without partitionable threefry a draw's bits depend on how many values it draws, so
    each size draws exactly its own count (flat), and a one-axis bias is jax's own draw."""
    key = KEYS["typed"]
    with jax.threefry_partitionable(False):
        short = jax.random.uniform(key, (483,), jnp.float32)
        assert not np.array_equal(_bits(short), _bits(jax.random.uniform(key, (4096,), jnp.float32)[:483]))
        _same(fi.torch_default()(key, (23, 7, 3), jnp.float32), theirs_torch(key, (23, 7, 3)))
        bias = fi.uniform_symmetric(0.3)(key, (437,), jnp.float32)
        _same(bias, jax.random.uniform(key, (437,), jnp.float32, -0.3, 0.3))


@pytest.mark.parametrize("n, count", [(1, 4096), (4096, 4096), (4097, 8192), (31659, 32768), (1 << 20, 1 << 20)])
def test_draw_counts_are_few_and_waste_little(n, count):
    # 4096 for the small ones, then a power of two: 4 MB of float32 at most in vain (a
    # larger kernel draws exactly its own, test_a_large_kernel_draws_exactly_its_own)
    assert fi._draw_count(n) == count


def test_a_large_kernel_draws_exactly_its_own(drawn):
    shape = (1025, 1024)  # just over 2^20 values
    _same(fi.torch_default()(KEYS["typed"], shape, jnp.float32), theirs_torch(KEYS["typed"], shape))
    assert drawn == [(1025 * 1024,)], drawn


def test_jax_draws_where_flat_would_not_be_the_same():
    # another generator shapes its bits by the shape: jax's draw, the same values as jax's
    rbg = jax.random.key(0, impl="rbg")
    ours, theirs = CASES["torch_default"]
    _same(ours(rbg, (100, 10), jnp.float32), theirs(rbg, (100, 10), jnp.float32))
    # no values, one axis, no dtype, a bad mode, a batch of keys: jax's answer or jax's error
    key, keys = KEYS["typed"], jax.random.split(KEYS["typed"], 2)
    _as_jax(ours, theirs, key, (0, 10), jnp.float32)  # jax 0.10 divides by zero, 0.12 gives zeros
    _as_jax(*CASES["uniform_symmetric"], key, (9,), jnp.float32)
    _as_jax(ours, theirs, key, (4, 3), None)
    sideways = (fi.kaiming_uniform(mode="fan_sideways"), variance_scaling(2.0, "fan_sideways", "uniform"))
    _as_jax(*sideways, key, (4, 3), None)
    _as_jax(ours, theirs, keys, (4, 3), jnp.float32)


def _as_jax(ours, theirs, *args):
    """``ours(*args)`` gives what ``theirs(*args)`` gives: the same bits, or the same error."""
    try:
        want = theirs(*args)
    except Exception as error:
        with pytest.raises(type(error)):
            ours(*args)
    else:
        _same(ours(*args), want)


def test_eval_shape_traces_it():
    out = jax.eval_shape(lambda k: fi.xavier_uniform()(k, (64, 10)), KEYS["typed"])
    assert out.shape == (64, 10) and out.dtype == jnp.float32
