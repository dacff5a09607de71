"""funcnet._checks: one rule for ints, reals and flags, used by every constructor."""

import numpy as np
import pytest

import funcnet
from funcnet import _checks as checks
from funcnet import losses, metrics, optim
from funcnet.layers import (
    GRU,
    LSTM,
    RNN,
    AvgPool,
    BatchNorm,
    Conv,
    ConvTranspose,
    Dense,
    Dropout,
    Embedding,
    LeakyRelu,
    MaxPool,
)


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_numpy_integer_scalars_are_ints(value):
    assert checks.positive_int("f", "n", value) == 3
    assert type(checks.positive_int("f", "n", value)) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None, 0, -1])
def test_bools_floats_strings_and_non_positive_values_are_refused(value):
    with pytest.raises(checks.ArgumentError, match=r"f: n must be a positive int, got .*\(\w+\)\."):
        checks.positive_int("f", "n", value)


def test_errors_are_both_value_and_type_errors():
    with pytest.raises(ValueError):
        checks.real("f", "x", "1")
    with pytest.raises(TypeError):
        checks.positive_int("f", "n", 0)


def test_real_bounds_and_finiteness():
    assert checks.real("f", "x", np.float32(0.5), low=0.0, high=1.0, high_open=True) == 0.5
    for bad in (1.0, float("nan"), float("inf"), -0.1):
        with pytest.raises(checks.ArgumentError, match=r"x must be a finite real number in \[0, 1\)"):
            checks.real("f", "x", bad, low=0.0, high=1.0, high_open=True)
    with pytest.raises(checks.ArgumentError, match="must be a real number, got True"):
        checks.real("f", "x", True)


def test_flag_and_one_of():
    assert checks.flag("f", "b", np.bool_(False)) is False
    with pytest.raises(checks.ArgumentError, match="b must be True or False, got 1"):
        checks.flag("f", "b", 1)
    with pytest.raises(checks.ArgumentError, match="mode must be one of 'min', 'max', got 'mean'"):
        checks.one_of("f", "mode", "mean", ("min", "max"))


def test_learning_rate_accepts_numbers_schedules_and_arrays_only():
    assert checks.learning_rate("adam", 1e-3) == 1e-3
    sched = lambda step: 0.1
    assert checks.learning_rate("adam", sched) is sched
    with pytest.raises(
        checks.ArgumentError,
        match=r"adam: learning_rate .* got the string '1e-3'. "
        r"Pass a number, e.g. adam\(0.001\)",
    ):
        checks.learning_rate("adam", "1e-3")
    with pytest.raises(checks.ArgumentError, match="learning_rate is required"):
        checks.learning_rate("sgd", None)


# Every constructor that takes a count: a NumPy int works like a Python int, a bool is refused.
COUNTED = {
    "Dense": lambda n: Dense(n),
    "Conv": lambda n: Conv(n, (3, 3)),
    "Conv.feature_group_count": lambda n: Conv(4, (3, 3), feature_group_count=n),
    "ConvTranspose": lambda n: ConvTranspose(n, (3, 3)),
    "Conv.filter_shape": lambda n: Conv(4, (n, n)),
    "MaxPool": lambda n: MaxPool((n, n)),
    "AvgPool": lambda n: AvgPool((n, n)),
    "Embedding.vocab_size": lambda n: Embedding(n, 4),
    "Embedding.dim": lambda n: Embedding(10, n),
    "RNN": lambda n: RNN(n),
    "LSTM": lambda n: LSTM(n),
    "GRU": lambda n: GRU(n),
    "FanOut": lambda n: funcnet.FanOut(n),
    "FanInConcat": lambda n: funcnet.FanInConcat(n),
    "BatchNorm.axis": lambda n: BatchNorm(axis=n),
    "metrics.TopKAccuracy": lambda n: metrics.TopKAccuracy(n),
    "center_loss_init": lambda n: losses.center_loss_init(n, 2),
}


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_constructors_take_numpy_ints_and_refuse_bools(name):
    build = COUNTED[name]
    build(np.int64(2))
    build(2)
    with pytest.raises((TypeError, ValueError)):
        build(True)


@pytest.mark.parametrize(
    "build",
    [
        lambda r: Dropout(r),
        lambda r: LeakyRelu(r),
        lambda r: optim.sgd(r),
        lambda r: optim.adam(r),
        lambda r: BatchNorm(momentum=r),
    ],
)
def test_real_arguments_take_numpy_floats_and_refuse_bools_and_strings(build):
    build(np.float32(0.5))
    for bad in (True, "0.5"):
        with pytest.raises((TypeError, ValueError)):
            build(bad)


@pytest.mark.parametrize(
    "build,arg",
    [
        (lambda f: Dense(3, W_init=f), "W_init"),
        (lambda f: Dense(3, b_init=f), "b_init"),
        (lambda f: Conv(3, (2, 2), W_init=f), "W_init"),
        (lambda f: ConvTranspose(3, (2, 2), b_init=f), "b_init"),
        (lambda f: Embedding(10, 3, E_init=f), "E_init"),
    ],
)
def test_an_initializer_factory_passed_uncalled_is_refused_at_construction(build, arg):
    from funcnet import initializers

    for factory in (initializers.xavier_uniform, initializers.normal, initializers.torch_default):
        with pytest.raises(
            checks.ArgumentError,
            match=rf"{arg}={factory.__name__} is an "
            rf"initializer factory.*call it: {arg}=initializers."
            rf"{factory.__name__}\(\)",
        ):
            build(factory)
    build(initializers.zeros)  # zeros and ones are initializers themselves
    build(initializers.xavier_uniform())


def test_a_user_factory_passed_uncalled_is_named_at_init():
    import jax

    def my_init(scale=1.0, mode="fan_in", dtype=None):  # a factory: makes the initializer
        return lambda key, shape, dtype=np.float32: scale * jax.random.normal(key, shape, dtype)

    with pytest.raises(
        checks.ArgumentError,
        match=r"Dense\(3\): W_init\(key, shape, dtype\) "
        r"returned function, not an array.*call it: W_init=my_init\(...\)",
    ):
        Dense(3, W_init=my_init).init(jax.random.key(0), (-1, 4))
    Dense(3, W_init=my_init()).init(jax.random.key(0), (-1, 4))

    def one_arg_factory(scale=1.0):
        return my_init(scale)

    with pytest.raises(TypeError) as info:  # the call itself fails: a note
        Dense(3, W_init=one_arg_factory).init(jax.random.key(0), (-1, 4))
    assert "W_init=one_arg_factory(...)" in info.value.__notes__[0]
