"""Every exception type funcnet raises on purpose, in one place to import and catch.

Each is also reachable where it is raised (``funcnet.checkpoint.CheckpointError`` is
``funcnet.errors.CheckpointError``), so ``except`` clauses written against either name
keep working. This module imports nothing from funcnet: every other module may use it.

| exception | raised for |
|---|---|
| ``ArgumentError`` | a bad argument to any funcnet function (ValueError and TypeError) |
| ``MismatchError`` | params or state that do not fit the layer given them |
| ``MetricStateError`` | a metric given another metric's state |
| ``StateDictMismatchError`` | a PyTorch ``state_dict`` that does not fit (a MismatchError) |
| ``CheckpointError`` | the base of the four checkpoint errors below |
| ``CheckpointCorruptError`` | truncated, failed checksum, or not a funcnet checkpoint |
| ``CheckpointMismatchError`` | a checkpoint that does not fit the restore target |
| ``CheckpointVersionError`` | written by a newer funcnet in a format this one cannot read |
| ``CheckpointOwnershipError`` | a directory that holds another run's checkpoints |
| ``CorruptFileError`` | a data file that exists but is not what it should be |
| ``MNISTNotFoundError`` | MNIST in none of the searched places |
"""

from __future__ import annotations

from typing import Iterable

__all__ = [
    "ArgumentError",
    "MismatchError",
    "MetricStateError",
    "StateDictMismatchError",
    "CheckpointError",
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "CheckpointVersionError",
    "CheckpointOwnershipError",
    "CorruptFileError",
    "MNISTNotFoundError",
]


class ArgumentError(ValueError, TypeError):
    """A bad argument: both a ValueError and a TypeError, so code that catches
    either (as callers of funcnet's earlier, mixed checks did) keeps working.

    Examples:
      >>> try:
      ...     funcnet.layers.Dense(0)
      ... except ArgumentError as e:  # or ValueError, or TypeError
      ...     print(type(e).__name__, isinstance(e, ValueError), isinstance(e, TypeError))
      ArgumentError True True
    """


class MismatchError(ValueError, TypeError):
    """Params or state that do not fit the layer they were given to (another network's,
    or params and state swapped). Raised by the combinators, which know the layer's
    place: ``path`` is the ``/``-joined key path (the one :func:`funcnet.params.paths`
    shows), and each enclosing combinator adds its key on the way out. A ValueError
    and a TypeError, as the KeyError/TypeError it replaces was mostly the latter.

    Attributes:
      where: the combinator that raised it (the outermost one, once placed).
      what: ``"params"`` or ``"state"``: what does not fit.
      layer: the name of the layer it does not fit.
      expected: what that layer expects, as :func:`funcnet.core.describe_tree` shows a tree.
      given: what it got, shown the same way.
      hint: what to do about it.
      path: the layer's key path in the network, outermost key first.

    Examples:
      >>> from funcnet.layers import Dense
      >>> net = funcnet.serial(Dense(4), Dense(2))
      >>> _, params, state = net.init(jax.random.key(0), (-1, 3))
      >>> try:
      ...     net.apply(params[:1], state, jnp.ones((1, 3)))  # one layer's params for two
      ... except MismatchError as e:
      ...     print(e)
      serial: params do not match this serial of 2 layers (got tuple of length 1). Use the
      params returned by this layer's init.
    """

    def __init__(
        self, where: str, what: str, layer: str, expected: str, given: str, hint: str = "", message: str = ""
    ) -> None:
        self.where, self.what, self.layer = where, what, layer
        self.expected, self.given, self.hint = expected, given, hint
        self.path: list = []
        self._message = message  # used while no combinator has placed it (path empty)
        super().__init__(self.render())

    def render(self) -> str:
        """The message for the error's current place."""
        if not self.path and self._message:
            return self._message
        verb = "do" if self.what == "params" else "does"
        at = "/".join(str(k) for k in self.path)
        return (
            f"{self.where}: the {self.what} given to layer {at} ({self.layer}) {verb} not fit "
            f"it: it expects {self.expected}, got {self.given}. {self.hint}"
        ).rstrip()

    def placed_under(self, where: str, key) -> "MismatchError":
        """This error, one combinator further out (``key`` is the child's key there)."""
        self.path.insert(0, key)
        self.where = where
        self.args = (self.render(),)
        return self


class MetricStateError(ValueError):
    """A metric's ``update``/``compute`` given a state that is not its own (another
    metric's, or a collection's entries mixed up).

    Examples:
      >>> acc, mse = funcnet.metrics.Accuracy(), funcnet.metrics.MSE()
      >>> try:
      ...     acc.compute(mse.init())
      ... except MetricStateError:
      ...     print("not an Accuracy state")
      not an Accuracy state
    """


class StateDictMismatchError(MismatchError):
    """A torch ``state_dict`` that does not fit the funcnet params: the message names the
    funcnet path and the torch key of each mismatch. A :class:`MismatchError` (weights
    that do not fit the network), so ``except MismatchError`` catches it with the other
    misfits; a ValueError too. ``missing`` and ``unexpected`` list the torch keys, as
    torch's ``load_state_dict(strict=True)`` names them.

    Attributes:
      missing: the torch keys the params need that the ``state_dict`` lacks, a list.
      unexpected: the ``state_dict``'s keys that no parameter takes, a list.
    """

    def __init__(self, message: str, missing: Iterable[str] = (), unexpected: Iterable[str] = ()) -> None:
        self.missing, self.unexpected = list(missing), list(unexpected)
        # MismatchError's fields describe a layer's place in a network; this error has
        # none (the loader pairs whole trees), so its message stands as given.
        super().__init__("load_torch_state_dict", "state_dict", "", "", "", message=message)


class CheckpointError(ValueError):
    """Base class of the checkpoint errors below."""


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, fails its checksum, or is not a funcnet checkpoint."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the ``target`` tree (paths, shapes or dtypes)."""


class CheckpointVersionError(CheckpointError):
    """The checkpoint was written by a newer funcnet, in a format version this one cannot read."""


class CheckpointOwnershipError(CheckpointError):
    """The directory holds another run's checkpoints; saving there would mix or delete them."""


class CorruptFileError(ValueError):
    """A data file exists but is not what it should be (truncated, bad header, bad md5)."""

    @classmethod
    def at(cls, path, why: str) -> "CorruptFileError":
        """The error for ``path``, saying ``why`` and how to get a good copy."""
        return cls(
            f"{path}: {why}. The file is truncated, corrupt or not an idx file; delete it "
            f"and fetch the original again (or point data_dir=/FUNCNET_DATA_DIR at a good "
            f"copy)."
        )


class MNISTNotFoundError(FileNotFoundError):
    """MNIST is in none of the searched places and could not be downloaded."""
