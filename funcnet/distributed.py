"""Devices, hosts and data parallelism: ``jax.jit`` over a mesh or ``jax.pmap``, ``jax.distributed`` across processes.

**On a mesh** (JAX's recommended path): :func:`data_mesh` makes a 1-D mesh over the
devices, :func:`replicate_on` puts the :class:`funcnet.train.TrainState` whole on
every device of it, :func:`shard_batch` (or :func:`shard_local_batch` with one
process's part of the batch) splits each batch's leading axis over it, and the plain
step -- ``jax.jit(make_train_step(loss_fn, opt))``, no ``axis_name`` -- runs on those
arrays: XLA partitions it and inserts the gradient all-reduce itself
(``funcnet.fit(..., mesh=mesh)`` does all of this).

**With pmap:** one device holds one replica of the :class:`funcnet.train.TrainState`; each gets
a slice of the batch; gradients are averaged with ``lax.pmean`` inside the step
(:func:`funcnet.train.make_train_step` with ``axis_name``), so every replica
applies the same optax update and the replicas never drift apart.

Coming from MXNet: the KVStore's push (gradients) / pull (weights) / updater is
exactly what that one ``pmean`` followed by the optax update does, in a single
all-reduce inside the compiled step, with no parameter server.

Beyond one machine, :func:`initialize` starts JAX's own multi-process runtime
(``jax.distributed``); ``pmap`` then spans every process's devices, each process
feeds its local devices with its own part of the global batch
(:func:`process_slice`), and collectives run across all of them.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from funcnet import _checks as checks
from funcnet._deprecation import moved_names
from funcnet.core import PyTree

# The explicit-axis helpers layers use live below layers and this module (funcnet._mesh);
# this module is their public path.
from funcnet._mesh import data_axis, explicit_sharding, explicit_spec, gather, on_global_mesh

__all__ = [
    "initialize",
    "data_mesh",
    "replicate_on",
    "shard_batch",
    "shard_local_batch",
    "replicate",
    "unreplicate",
    "shard",
    "process_slice",
    "is_main_process",
    "local_device_count",
    "InFlight",
    "explicit_spec",
    "explicit_sharding",
    "gather",
    "on_global_mesh",
    "data_axis",
]

# The sharding plan's names were re-exported here in 0.2's development line; their one
# path is funcnet.sharding.
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        ["shard_params", "param_specs", "fsdp_rules", "megatron_rules", "explain", "state_shardings"],
        "funcnet.sharding",
    ),
)


def initialize(
    coordinator_address: Optional[str] = None,
    num_processes: Optional[int] = None,
    process_id: Optional[int] = None,
    local_device_ids: Optional[Sequence[int]] = None,
    **kwargs,
) -> None:
    """Starts JAX's multi-process runtime (a thin wrapper over ``jax.distributed.initialize``).

    Arguments left as None come from the environment, as ``jax.distributed`` reads it
    on clusters it knows (SLURM, Open MPI, TPU pods) or from funcnet's own variables
    ``FUNCNET_COORDINATOR`` (``host:port``), ``FUNCNET_NUM_PROCESSES`` and
    ``FUNCNET_PROCESS_ID``. On CPU it selects the gloo collectives, without which
    cross-process collectives on CPU are unavailable. Call it before any other jax
    call that touches devices.

    Args:
      coordinator_address: ``host:port`` of process 0's coordinator service.
      num_processes: how many processes take part.
      process_id: this process's index, ``0`` to ``num_processes - 1``.
      local_device_ids: the devices this process uses (None: all it sees).
      **kwargs: passed on to ``jax.distributed.initialize``.

    Returns:
      None. Once it returns, ``jax.process_count()``, ``jax.process_index()`` and
        ``jax.devices()`` describe the whole job.

    Raises:
      ValueError: ``process_id`` is out of range, or a ``FUNCNET_*`` variable is malformed.

    Examples:
      Every process of the job runs the same script (not run here: it waits for the
      other processes and the coordinator, and this test process has neither):

      >>> initialize("10.0.0.1:1234", num_processes=2, process_id=0)  # doctest: +SKIP
      >>> jax.process_count()  # doctest: +SKIP
      2
    """
    env = os.environ
    if coordinator_address is None and "FUNCNET_COORDINATOR" in env:
        coordinator_address = _env_address("FUNCNET_COORDINATOR", env["FUNCNET_COORDINATOR"])
    if num_processes is None and "FUNCNET_NUM_PROCESSES" in env:
        num_processes = _env_int(
            "FUNCNET_NUM_PROCESSES", env["FUNCNET_NUM_PROCESSES"], 1, "the number of processes", "2"
        )
    if process_id is None and "FUNCNET_PROCESS_ID" in env:
        process_id = _env_int(
            "FUNCNET_PROCESS_ID",
            env["FUNCNET_PROCESS_ID"],
            0,
            "this process's index, 0 to FUNCNET_NUM_PROCESSES - 1",
            "0",
        )
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(
            f"initialize: process_id={process_id} is not in [0, num_processes="
            f"{num_processes}); number the processes 0 to {num_processes - 1} "
            f"(FUNCNET_PROCESS_ID)."
        )
    platforms = (env.get("JAX_PLATFORMS") or jax.config.jax_platforms or "").lower()
    if platforms in ("", "cpu") or platforms.startswith("cpu"):
        # Harmless on GPU/TPU backends; required for CPU all-reduce across processes.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        **kwargs,
    )


def _env_int(name: str, text: str, low: int, meaning: str, example: str) -> int:
    """An integer environment variable, or an error naming it and what it holds."""
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(
            f"initialize: the environment variable {name}={text!r} must be an int "
            f">= {low} ({meaning}), e.g. {name}={example}. Fix or unset it."
        )
    return value


def _env_address(name: str, text: str) -> str:
    """``host:port`` from an environment variable, or an error naming it."""
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"initialize: the environment variable {name}={text!r} must be the "
            f"coordinator's host:port (process 0's address and a free port), e.g. "
            f"{name}=10.0.0.1:1234. Fix or unset it."
        )
    return text.strip()


def data_mesh(
    devices: Optional[int | Sequence[jax.Device]] = None, axis_name: str = "data", *, explicit: bool = True
) -> jax.sharding.Mesh:
    """A 1-D mesh over ``devices`` (default: every device of every process), axis ``axis_name``.

    ``devices`` is a device count (the first ones of ``jax.devices()``) or a list of
    devices. ``explicit=True`` gives the mesh ``jax.make_mesh`` gives by default, whose
    axis is Explicit: shardings are part of every array's type and mistakes fail at
    trace time; ``False`` makes it Auto (the compiler picks the layouts in between).

    Args:
      devices: a device count, a list of devices, or None (all devices).
      axis_name: the mesh axis's name.
      explicit: an Explicit axis (True) or an Auto one (False).

    Returns:
      A 1-D ``jax.sharding.Mesh``.

    Raises:
      ValueError: more devices asked for than there are.

    Examples:
      >>> mesh = data_mesh(4)
      >>> dict(mesh.shape), mesh.axis_types
      ({'data': 4}, (Explicit,))
    """
    if devices is None:
        devices = jax.devices()
    elif checks.is_int(devices):
        n = checks.positive_int("data_mesh", "devices", devices)
        if n > jax.device_count():
            raise ValueError(f"data_mesh: asked for {n} devices but there are {jax.device_count()} ({jax.devices()}).")
        devices = jax.devices()[:n]
    devices = list(devices)
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh((len(devices),), (axis_name,), axis_types=(kind,), devices=devices)


def replicate_on(mesh: jax.sharding.Mesh, tree: PyTree) -> PyTree:
    """Every leaf of ``tree`` whole on every device of ``mesh`` (e.g. the train state).

    Always new buffers (a jitted step may donate them without touching ``tree``'s).
    With several processes each must pass the same values; each places its own copies.

    Args:
      mesh: the mesh to place on.
      tree: a pytree of arrays (typed PRNG keys included).

    Returns:
      ``tree`` with every leaf a new array replicated over ``mesh``.

    Raises:
      ValueError: a 64-bit leaf that would be truncated with x64 disabled.

    Examples:
      >>> mesh = data_mesh(4)
      >>> params = replicate_on(mesh, {"W": jnp.ones((3, 2))})
      >>> params["W"].sharding.is_fully_replicated, len(params["W"].sharding.device_set)
      (True, 4)
    """
    _check_fits_x32("replicate_on", tree)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def put(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=jax.random.key_impl(x))
        # A host copy: the caller's buffer (or, on CPU, a NumPy view of it) could otherwise
        # be reused on its device, and a donating step would then consume the caller's array.
        x = np.array(x, copy=True)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, tree)


def shard_batch(mesh: jax.sharding.Mesh, batch: PyTree) -> PyTree:
    """Splits the leading (batch) axis of every leaf of the global ``batch`` over ``mesh``'s axis.

    Every process passes the whole global batch and places only its own devices'
    parts; with each process holding only its part, use :func:`shard_local_batch`.
    Leaves that are already split this way are passed through.

    Args:
      mesh: the mesh to place on; its data axis (:func:`data_axis`) splits the batch.
      batch: a pytree of arrays sharing one leading (batch) size.

    Returns:
      ``batch`` with every leaf a global array split over the mesh's data axis.

    Raises:
      ArgumentError: ``mesh`` is not a mesh (e.g. the arguments swapped).
      ValueError: the leading sizes differ or do not divide by the axis size.

    Examples:
      >>> mesh = data_mesh(4)
      >>> batch = shard_batch(mesh, {"x": np.ones((8, 3)), "y": np.arange(8)})
      >>> batch["x"].shape, batch["x"].sharding.shard_shape(batch["x"].shape)
      ((8, 3), (2, 3))
    """
    _need_mesh("shard_batch", mesh)
    sharding = _batch_sharding("shard_batch", mesh, batch, mesh.shape[data_axis(mesh)])
    _check_fits_x32("shard_batch", batch)

    def put(x):
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, batch)


def shard_local_batch(mesh: jax.sharding.Mesh, batch: PyTree) -> PyTree:
    """Global arrays from this process's part of a batch (``jax.make_array_from_process_local_data``).

    Each process passes its own consecutive rows (e.g. ``global_batch[process_slice(n)]``)
    and gets arrays of the global shape, split over ``mesh``'s axis, which the
    jitted step takes as it would a whole batch. With one process it is
    :func:`shard_batch`.

    Args:
      mesh: the mesh to place on; its data axis (:func:`data_axis`) splits the batch.
      batch: this process's rows, a pytree of arrays sharing one leading size.

    Returns:
      ``batch`` as global arrays (leading size: the processes' rows together).

    Raises:
      ArgumentError: ``mesh`` is not a mesh.
      ValueError: the leading sizes differ or do not divide by this process's devices.

    Examples:
      >>> mesh = data_mesh(4)
      >>> rows = process_slice(8)  # one process: all 8 rows
      >>> batch = shard_local_batch(mesh, {"x": np.ones((8, 3))[rows]})
      >>> batch["x"].shape, batch["x"].sharding.spec == jax.sharding.PartitionSpec("data")
      ((8, 3), True)
    """
    _need_mesh("shard_local_batch", mesh)
    axis = data_axis(mesh)
    # the devices along the data axis whose rows this process feeds
    rows = np.moveaxis(mesh.devices, list(mesh.axis_names).index(axis), 0)
    local_devices = sum(any(d.process_index == jax.process_index() for d in np.ravel(r)) for r in rows)
    sharding = _batch_sharding("shard_local_batch", mesh, batch, local_devices)
    _check_fits_x32("shard_local_batch", batch)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


def _need_mesh(fn, mesh):
    if not isinstance(mesh, jax.sharding.Mesh):
        raise checks.ArgumentError(
            f"{fn}(mesh, batch): mesh must be a jax.sharding.Mesh, got {checks.got(mesh)[:120]}. "
            f"The mesh comes first: {fn}(mesh, batch)."
        )


def _batch_sharding(fn, mesh, batch, divisor):
    """The batch-split sharding, after checking the leading sizes agree and divide evenly."""
    axis = data_axis(mesh)
    leaves = jax.tree.leaves(batch)
    sizes = {tuple(np.shape(x)[:1]) for x in leaves}
    if not leaves or () in sizes or len(sizes) != 1:
        raise ValueError(
            f"{fn}: every leaf of the batch needs the same leading (batch) size, "
            f"got leading shapes {sorted(np.shape(x)[:1] for x in leaves)}."
        )
    (size,) = sizes.pop()
    if size % divisor:
        raise ValueError(
            f"{fn}: a batch of {size} examples cannot be split evenly over "
            f"{divisor} devices (mesh axis {axis!r}): {size} % {divisor} = "
            f"{size % divisor}. Use a batch size that is a multiple of {divisor} "
            f"(e.g. {max(divisor, size // divisor * divisor)}); if this is an "
            f"epoch's last, partial batch, drop it (funcnet.data.batches(..., "
            f"drop_remainder=True))."
        )
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis))


def local_device_count(devices: Optional[int] = None) -> int:
    """``devices`` checked against what this process has, or all local devices.

    Args:
      devices: the count wanted, or None for all of this process's devices.

    Returns:
      The device count.

    Raises:
      ValueError: more devices asked for than this process has.

    Examples:
      >>> local_device_count(), local_device_count(2)
      (4, 2)
    """
    available = jax.local_device_count()
    if devices is None:
        return available
    devices = checks.positive_int("local_device_count", "devices", devices)
    if devices > available:
        raise ValueError(
            f"asked for {devices} devices but this process has {available} "
            f"({jax.local_devices()}). On CPU, simulate more with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} set "
            f"before jax is imported."
        )
    return devices


def replicate(tree: PyTree, devices: Optional[int | Sequence[jax.Device]] = None) -> PyTree:
    """Puts one copy of every leaf on each local device (leading axis = device).

    ``devices`` is a device count or a list of devices (default: all local ones).
    The result is what ``jax.pmap`` expects for arguments that every replica shares.

    Args:
      tree: a pytree of arrays.
      devices: a device count or a list of devices (default: all local ones).

    Returns:
      ``tree`` with a new leading axis, one copy per device.

    Raises:
      ValueError: more devices asked for than there are, or a 64-bit leaf that would
        be truncated.

    Examples:
      >>> params = replicate({"W": jnp.ones((3, 2))}, devices=4)
      >>> params["W"].shape, len(params["W"].sharding.device_set)
      ((4, 3, 2), 4)
    """
    devices = _devices(devices)
    _check_fits_x32("replicate", tree)
    sharding = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices), ("devices",)), jax.sharding.PartitionSpec("devices")
    )

    def put(x):
        # One copy straight to each device: never n copies on one device first.
        x = jnp.asarray(x)[None]
        shards = [jax.device_put(x, d) for d in devices]
        return jax.make_array_from_single_device_arrays((len(devices),) + x.shape[1:], sharding, shards)

    return jax.tree.map(put, tree)


def unreplicate(tree: PyTree) -> PyTree:
    """The first replica of every leaf (inverse of :func:`replicate`).

    ``tree`` is what :func:`replicate` or a ``jax.pmap``-ed function returned (or a
    host copy of it, ``jax.device_get``). Anything else is an error rather than a
    silent first row: a device array whose leading axis is not split one row per
    device, a leaf without a leading axis, or leaves with different leading sizes.

    Args:
      tree: what :func:`replicate` or a ``jax.pmap``-ed function returned.

    Returns:
      ``tree`` with every leaf's first replica.

    Raises:
      ValueError: ``tree`` does not hold one replica per device (see above).

    Examples:
      >>> unreplicate(replicate({"W": jnp.ones((3, 2))}, devices=4))["W"].shape
      (3, 2)
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, x in leaves:
        _check_replicas(path, x)
    sizes = {_where(path, "the value"): np.shape(x)[0] for path, x in leaves}
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise ValueError(
            f"unreplicate: the leaves have different leading sizes ({shown}), so "
            f"they are not replicas of one tree (replicas share their leading, "
            f"device axis). Unreplicate only what replicate() or a pmapped "
            f"function returned."
        )
    return jax.tree.map(lambda x: x[0], tree)


def _check_replicas(path, x) -> None:
    where = _where(path, "the value")
    if np.ndim(x) == 0:
        raise ValueError(
            f"unreplicate: {where} has no leading replica axis (it is a scalar), "
            f"so it was never replicated. Unreplicate only what replicate() or a "
            f"pmapped function returned."
        )
    if not isinstance(x, jax.Array):
        return  # a host copy: only its leading size can be checked (above)
    sharding = x.sharding
    n = len(sharding.device_set)
    if x.shape[0] == n and tuple(sharding.shard_shape(x.shape)) == (1,) + tuple(x.shape[1:]):
        return
    if n > 1 and sharding.is_fully_replicated:
        raise ValueError(
            f"unreplicate: {where} (shape {tuple(x.shape)}) is whole on every device "
            f"of a mesh (as replicate_on and jit over a mesh leave it), not one "
            f"replica per device: there is no replica axis to drop. Use it as it "
            f"is (or jax.device_get it)."
        )
    raise ValueError(
        f"unreplicate: {where} is not split one row per device (shape "
        f"{tuple(x.shape)} on {n} device{'s' if n > 1 else ''}), so it was never "
        f"replicated and its first row is not a replica. unreplicate takes the first "
        f"replica of a tree made by replicate() or a pmapped function; a tree that "
        f"was not replicated needs no unreplicate."
    )


def _where(path, whole: str) -> str:
    return jax.tree_util.keystr(tuple(path)) or whole


def _check_fits_x32(fn: str, tree) -> None:
    # One check for every path that puts host data on a device (DeviceData too).
    checks.fits_x32(fn, tree)


def shard(batch: PyTree, n_devices: Optional[int] = None) -> PyTree:
    """Splits every leaf's leading (batch) axis into ``(n_devices, batch // n_devices, ...)``.

    A batch that does not divide evenly raises a ValueError that gives the sizes:
    drop the remainder (``funcnet.data.batches(..., drop_remainder=True)``) or pick a
    batch size that is a multiple of the device count.

    Args:
      batch: a pytree of arrays sharing one leading (batch) size.
      n_devices: how many devices to split over (default: all local ones).

    Returns:
      ``batch`` with every leaf reshaped to ``(n_devices, batch // n_devices, ...)``.

    Raises:
      ValueError: the leading sizes differ, or do not divide by ``n_devices``.

    Examples:
      >>> shard({"x": np.ones((8, 3)), "y": np.arange(8)})["x"].shape
      (4, 2, 3)
      >>> shard({"x": np.ones((6, 3))}, 4)
      Traceback (most recent call last):
      ValueError: shard: a batch of 6 examples cannot be split evenly over 4 devices. ...
    """
    n = local_device_count(n_devices)
    leaves = jax.tree_util.tree_flatten_with_path(batch)[0]
    sizes = {_where(path, "the batch"): np.shape(x)[0] for path, x in leaves if np.ndim(x)}
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise ValueError(
            f"shard: every leaf of the batch needs the same leading (batch) size, "
            f"got {shown}. Split like this, device i would get rows of different "
            f"examples from different leaves; pass aligned arrays (e.g. from "
            f"funcnet.data.batches)."
        )
    _check_fits_x32("shard", batch)

    def split(x):
        x = np.asarray(x) if not isinstance(x, jax.Array) else x
        if x.ndim == 0 or x.shape[0] % n:
            size = x.shape[0] if x.ndim else "a scalar"
            raise ValueError(
                f"shard: a batch of {size} examples cannot be split evenly over {n} "
                f"devices. Use a batch size that is a multiple of {n} (e.g. "
                f"{max(n, (x.shape[0] // n) * n) if x.ndim else n}), or drop the "
                f"last partial batch (drop_remainder=True)."
            )
        return x.reshape((n, x.shape[0] // n) + x.shape[1:])

    return jax.tree.map(split, batch)


class InFlight:
    """Bounds how many dispatched steps a hand-written multi-device loop leaves unfinished.

    JAX dispatches asynchronously: ``ts, metrics = pstep(ts, batch)`` returns as soon
    as the step is queued, so a Python loop runs ahead and queues every step of an
    epoch. On CPU, the devices of a multi-device execution (``jax.pmap``, or ``jit``
    over a mesh of several devices) run on host threads, and every collective (the
    gradient all-reduce, synced BatchNorm) is a rendezvous where the threads of all
    devices must meet. With many executions queued on few cores, a rendezvous can
    wait for device threads that are busy with other queued executions: XLA:CPU
    logs that a thread is stuck, and when the participants do not all arrive within
    its termination timeout (``--xla_cpu_collective_call_terminate_timeout_seconds``)
    it ends the process ("Termination timeout ... exceeded. Exiting to ensure a
    consistent program state"), which Python cannot catch; until then the loop
    hangs. funcnet's tests saw this with 4 simulated CPU devices on 2 cores. GPUs
    and TPUs run each device's executions in order on its own stream, so the
    bound is applied on CPU only by default.

    ``add(outputs)`` after each step keeps at most ``max_in_flight`` steps
    dispatched and unfinished: when the step just queued makes ``max_in_flight``,
    it blocks (``jax.block_until_ready``) on the oldest step's outputs. With the
    default 2 the host queues step ``i + 1`` while step ``i`` runs, so the device
    is never idle waiting for the host, and never more than two executions meet
    at a rendezvous. Blocking on a step's outputs waits for that step and, since
    each step consumes the previous one's state, for every step before it.
    ``funcnet.fit`` does this for its multi-device steps on CPU:

    ```
    in_flight = distributed.InFlight()          # 2 on CPU; no-op on GPU/TPU
    for batch in batches:
        ts, metrics = pstep(ts, distributed.shard(batch))
        in_flight.add(metrics)
    in_flight.wait()
    ```

    Args:
      max_in_flight: the bound, >= 1; None never blocks.
      cpu_only: bound only when this process's devices are CPUs (default), else
        never block; False bounds on every platform.

    Examples:
      >>> in_flight = InFlight()  # at most 2 unfinished steps (on CPU)
      >>> step = jax.jit(lambda x: x + 1)
      >>> x = jnp.zeros(3)
      >>> for _ in range(5):
      ...     x = in_flight.add(step(x))
      >>> in_flight.wait()
      >>> x.tolist()
      [5.0, 5.0, 5.0]
    """

    def __init__(self, max_in_flight: Optional[int] = 2, *, cpu_only: bool = True) -> None:
        if max_in_flight is not None:
            max_in_flight = checks.positive_int("InFlight", "max_in_flight", max_in_flight)
        if cpu_only and jax.local_devices()[0].platform != "cpu":
            max_in_flight = None
        self.max_in_flight = max_in_flight
        self._pending: collections.deque = collections.deque()

    def add(self, outputs: Any) -> Any:
        """Records the outputs of the step just dispatched; returns them unchanged.

        Blocks on the oldest recorded outputs while ``max_in_flight`` or more
        steps are unfinished, so the next step dispatched makes at most that many.
        """
        if self.max_in_flight is None:
            return outputs
        self._pending.append(outputs)
        while len(self._pending) >= self.max_in_flight:
            jax.block_until_ready(self._pending.popleft())
        return outputs

    def wait(self) -> None:
        """Blocks until every recorded step has finished."""
        while self._pending:
            jax.block_until_ready(self._pending.popleft())


def process_slice(num_examples: int, process_index: Optional[int] = None, process_count: Optional[int] = None) -> slice:
    """This process's contiguous part of a global batch of ``num_examples``.

    Every process builds the same global batch order (same seed) and keeps its
    slice, so the union over processes is the global batch and no two overlap.

    Args:
      num_examples: the global batch size.
      process_index: this process's index (default ``jax.process_index()``).
      process_count: how many processes (default ``jax.process_count()``).

    Returns:
      A ``slice`` of the global batch's rows.

    Raises:
      ValueError: ``num_examples`` does not divide by the process count.

    Examples:
      >>> process_slice(8, process_index=1, process_count=4)
      slice(2, 4, None)
    """
    i = jax.process_index() if process_index is None else process_index
    p = jax.process_count() if process_count is None else process_count
    if num_examples % p:
        raise ValueError(
            f"process_slice: a global batch of {num_examples} cannot be split evenly "
            f"over {p} processes; use a multiple of {p}."
        )
    per = num_examples // p
    return slice(i * per, (i + 1) * per)


def is_main_process() -> bool:
    """True on process 0: the one that writes checkpoints and logs.

    Returns:
      ``jax.process_index() == 0``.

    Examples:
      >>> is_main_process()  # a single process is the main one
      True
    """
    return jax.process_index() == 0


def _devices(devices):
    if devices is None:
        return jax.local_devices()
    if checks.is_int(devices):
        return jax.local_devices()[: local_device_count(devices)]
    return list(devices)
