"""Argument validators shared by every funcnet module (private).

One rule set everywhere: Python ints and NumPy integer scalars are ints; bools
are not (``True`` is an int to Python, but ``Dense(True)`` is a mistake); reals
are Python or NumPy real scalars, finite. Every check takes ``(where, name,
value)`` -- the function or layer, the argument, what arrived -- and its error
says all three and what would be accepted, so a person can fix the call.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Optional, Sequence

import jax
import jax.nn.initializers as jinit
import numpy as np

from funcnet import initializers as finit
from funcnet.errors import ArgumentError

__all__ = [
    "ArgumentError",
    "is_int",
    "is_real",
    "got",
    "integer",
    "positive_int",
    "non_negative_int",
    "real",
    "concrete",
    "concrete_within",
    "flag",
    "one_of",
    "hyperparameter",
    "learning_rate",
    "initializer",
    "prng_key",
    "fits_x32",
]


def is_int(x: Any) -> bool:
    """Python ints and NumPy integer scalars; never bools."""
    return isinstance(x, (numbers.Integral, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_real(x: Any) -> bool:
    """Python and NumPy real scalars; never bools."""
    return isinstance(x, (numbers.Real, np.floating, np.integer)) and not isinstance(x, (bool, np.bool_))


def got(value: Any) -> str:
    """How an error message shows a value it refuses: its repr and its type."""
    return f"{value!r} ({type(value).__name__})"


def integer(where: str, name: str, value: Any, *, low: Optional[int] = None) -> int:
    """``value`` as an int, at least ``low`` when given."""
    if not is_int(value) or (low is not None and value < low):
        bound = {None: "an int", 0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
        raise ArgumentError(f"{where}: {name} must be {bound}, got {got(value)}.")
    return int(value)


def positive_int(where: str, name: str, value: Any) -> int:
    return integer(where, name, value, low=1)


def non_negative_int(where: str, name: str, value: Any) -> int:
    return integer(where, name, value, low=0)


def real(
    where: str,
    name: str,
    value: Any,
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float in the interval given by ``low``/``high``."""
    if not is_real(value):
        raise ArgumentError(f"{where}: {name} must be a real number, got {got(value)}.")
    v = float(value)
    too_low = low is not None and (v <= low if low_open else v < low)
    too_high = high is not None and (v >= high if high_open else v > high)
    if not math.isfinite(v) or too_low or too_high:
        lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise ArgumentError(f"{where}: {name} must be a finite real number in {lo}, {hi}, got {value!r}.")
    return v


def concrete(x) -> Optional[np.ndarray]:
    """``x`` as a NumPy array when its value is known now, None while it is traced.

    Value checks (label ranges) run only on concrete values: outside ``jit`` they
    raise; under ``jit`` the function's documented out-of-range behaviour applies.
    """

    if isinstance(x, jax.core.Tracer):
        return None
    return np.asarray(x)


def concrete_within(where: str, name: str, x, low, high, *, what: str = "", fix: str = "") -> None:
    """Checks ``low <= x <= high`` entrywise when ``x`` is concrete (see :func:`concrete`);
    the error names the first entry outside, its index and the range of ``x``."""
    known = concrete(x)
    if known is None or known.size == 0:
        return
    bad = np.flatnonzero((known < low) | (known > high))
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(
            f"{where}: {name} must lie in [{low}, {high}]{what}, got {known.flat[i]} at index "
            f"{i} (values from {known.min()} to {known.max()}). {fix}".rstrip()
        )


def flag(where: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{where}: {name} must be True or False, got {got(value)}.")
    return bool(value)


def one_of(where: str, name: str, value: Any, choices: Sequence) -> Any:
    if value not in choices:
        raise ArgumentError(f"{where}: {name} must be one of {', '.join(map(repr, choices))}, got {value!r}.")
    return value


def hyperparameter(where: str, name: str, value: Any, **bounds) -> Any:
    """A real number checked like :func:`real`, or an array passed through unchecked.

    Arrays come from ``optax.inject_hyperparams``: traced values that can't be
    range-checked and must not change the structure of the optimizer's chain.
    """
    if hasattr(value, "shape") and not isinstance(value, (np.integer, np.floating, np.bool_)):
        return value
    real(where, name, value, **bounds)
    return value


def learning_rate(where: str, value: Any) -> Any:
    """A non-negative number or an optax schedule (any callable ``step -> lr``).

    Arrays pass unchecked: ``optax.inject_hyperparams`` hands the optimizer traced
    values, which can't be range-checked and must not change the chain's structure.
    """
    if value is None:
        raise ArgumentError(f"{where}: learning_rate is required (a number or an optax schedule).")
    if callable(value):
        _first_rate(where, value)
        return value
    if hasattr(value, "shape"):
        return value
    if isinstance(value, str):
        raise ArgumentError(
            f"{where}: learning_rate must be a number or an optax schedule, got the "
            f"string {value!r}. Pass a number, e.g. {where}({_as_number_hint(value)})."
        )
    return real(where, "learning_rate", value, low=0.0)


def _first_rate(where: str, schedule) -> None:
    """A schedule's first value must be a finite number >= 0: a NaN rate shows up only as
    a non-finite loss some steps later, far from its cause."""
    try:
        first = np.asarray(schedule(0), dtype=float)
    except Exception:  # a schedule that wants a traced or array step: checked as it runs
        return
    if first.size == 1 and not (np.isfinite(first) and first >= 0):
        raise ArgumentError(
            f"{where}: the learning_rate schedule gives {float(first)!r} at step "
            f"0; a rate must be a finite number >= 0. Check the schedule's "
            f"arguments (e.g. optax.cosine_decay_schedule(init_value, "
            f"decay_steps) with decay_steps > 0)."
        )


def _as_number_hint(text: str) -> str:
    try:
        return repr(float(text))
    except ValueError:
        return "1e-3"


def _initializer_factories() -> dict:
    """The functions of funcnet.initializers / jax.nn.initializers that *make* initializers."""
    made = {}
    for module in (finit, jinit):
        for name in getattr(module, "__all__", dir(module)):
            f = getattr(module, name, None)
            if callable(f) and name not in ("zeros", "ones", "calculate_gain", "Initializer"):
                made[id(f)] = name
    return made


def initializer(where: str, name: str, value: Any):
    """An initializer ``init(key, shape, dtype) -> array`` given to a layer, or None.

    A factory passed uncalled (``W_init=initializers.xavier_uniform``) would be called
    with ``(key, shape, dtype)`` as its own arguments and fail deep inside with "Cannot
    interpret 'key<fry>' as a data type". Known factories are refused here; any other
    initializer is wrapped so that a result that is not an array of the requested
    shape (a user factory passed uncalled returns a function) names the argument.
    """
    if value is None:
        return None
    if not callable(value):
        raise ArgumentError(
            f"{where}: {name} must be an initializer, init(key, shape, dtype) -> array, got {got(value)}."
        )
    factory = _initializer_factories().get(id(value))
    if factory is not None:
        raise ArgumentError(
            f"{where}: {name}={factory} is an initializer factory, not an "
            f"initializer: call it: {name}=initializers.{factory}() (with its "
            f"arguments, e.g. a gain or a stddev)."
        )

    @functools.wraps(value)
    def checked(key, shape, *args, **kwargs):
        try:
            out = value(key, shape, *args, **kwargs)
        except TypeError as e:  # e.g. a factory's "takes 1 positional argument but 3 were given"
            e.add_note(
                f"{where}: {name} is called as {name}(key, shape, dtype). If it is a "
                f"function that makes an initializer, call it: {name}={_name(value)}(...)."
            )
            raise
        if tuple(getattr(out, "shape", ())) != tuple(shape) or callable(out):
            got = (
                f"{type(out).__name__}, not an array"
                if not hasattr(out, "shape")
                else f"an array of shape {tuple(out.shape)}"
            )
            raise ArgumentError(
                f"{where}: {name}(key, shape, dtype) returned {got} for shape "
                f"{tuple(shape)}. If {name} is a function that makes an "
                f"initializer, call it: {name}={_name(value)}(...)."
            )
        return out

    return checked


def _name(f) -> str:
    return getattr(f, "__name__", type(f).__name__)


def prng_key(where: str, value: Any):
    """An int seed where a jax PRNG key belongs is refused with the call that makes one.

    Anything else passes: layers without parameters accept ``init(None, shape)``,
    and jax.random reports other wrong keys itself.
    """
    if is_int(value):
        raise ArgumentError(f"{where}: rng must be a jax PRNG key, got the int {value}: pass jax.random.key({value}).")
    return value


def fits_x32(fn: str, tree) -> None:
    """64-bit integers that JAX would store as 32-bit (x64 off, its default) must fit.

    JAX converts int64/uint64 values to int32/uint32 without a word when
    ``jax_enable_x64`` is off: ``2**40`` becomes 0. Only host values (NumPy,
    Python ints) are looked at; device arrays are already 32-bit.
    """

    if jax.config.jax_enable_x64:
        return
    # fit calls this on every host batch: plain leaves (paths cost ~4 us more per call,
    # so only an error computes them), and a min/max only of 64-bit integer host arrays.
    for i, x in enumerate(jax.tree.leaves(tree)):
        if isinstance(x, (np.ndarray, np.generic)):  # device arrays are already 32-bit
            if x.dtype.kind not in "iu" or x.dtype.itemsize != 8 or x.size == 0:
                continue
        elif not isinstance(x, int) or -(2**31) <= x < 2**31:
            continue
        x = np.asarray(x)
        if x.dtype.kind not in "iu":  # a Python int beyond 64 bits: jax refuses it itself
            continue
        small = np.int32 if x.dtype == np.int64 else np.uint32
        info = np.iinfo(small)
        lo, hi = x.min(), x.max()
        if lo >= info.min and hi <= info.max:
            continue
        bad = lo if lo < info.min else hi
        path = jax.tree_util.tree_flatten_with_path(tree)[0][i][0]
        raise ValueError(
            f"{fn}: {jax.tree_util.keystr(tuple(path)) or 'the value'} holds {int(bad)}, which "
            f"{np.dtype(small).name} cannot hold: with jax_enable_x64 off (JAX's default) {x.dtype} values are stored "
            f"as {np.dtype(small).name}, and this one would silently become "
            f"{int(np.asarray(bad).astype(small))}. Enable 64-bit types "
            f"(jax.config.update('jax_enable_x64', True) at startup), or keep the value on the "
            f"host, outside the tree."
        )
