"""The workload registry: what runs, with which peers, cases and reported columns.

This module is data only (no jax/torch import): the orchestrator reads it, and each
(workload, case, peer) runs in a child process that imports ``Peer.target`` and calls
``fn(peer_name, cfg, case) -> {"values": [seconds, ...], "extra": {...}}``; ``cfg["device"]``
is ``"cpu"`` or ``"gpu"`` (``benchmarks.run --platform``).

Tiers. ``Peer.platforms`` and a case's ``"platforms"`` key (default: both) say in which
tier a peer or a case runs: the CPU tier is the historical run (BENCHMARKS.md's tables),
the GPU tier leaves out what means nothing on one GPU (simulated CPU devices, peers that
compile to the same program there) and adds bfloat16 peers and nanoGPT's GPU-sized GPT.

Adding a workload is one function plus one entry in ``WORKLOADS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Peer:
    name: str
    target: str  # "module:function", called as function(name, cfg, case)
    xla_flags: str = ""  # appended to XLA_FLAGS for this peer's process only
    note: str = ""
    platforms: Tuple[str, ...] = ("cpu", "gpu")  # the tiers this peer belongs to


@dataclass(frozen=True)
class Workload:
    name: str  # command-line id, for --only
    title: str
    unit: str  # what the returned values measure, e.g. "s/epoch"; lower is better
    peers: Sequence[Peer]
    cases: Sequence[Dict]  # each has a "name"; the rest is passed to the peer
    reference: str = "funcnet"  # the ratio column is reference time / peer time
    throughput: Optional[str] = None  # e.g. "steps/s": also show 1 / median
    columns: Sequence[Tuple[str, str, str]] = ()  # (extra key, header, format)
    check: Optional[str] = None  # extra key that must agree across peers (same init, same data)
    check_rtol: float = 1e-4
    notes: str = ""
    gpu_title: Optional[str] = None  # the title in the GPU tier's report, when it differs


CPU_ONLY = ("cpu",)
GPU_ONLY = ("gpu",)
BF16_NOTE = "precision.apply_policy: float32 params, bfloat16 compute, float32 output (GPU tier)"
TORCH_BF16_NOTE = "the torch peer under torch.autocast(bfloat16) (GPU tier)"


def peers_on(workload: Workload, tier: str) -> List[Peer]:
    """The workload's peers in ``tier`` ("cpu" or "gpu"), in registry order."""
    return [p for p in workload.peers if tier in p.platforms]


def cases_on(workload: Workload, tier: str) -> List[int]:
    """Indices of the workload's cases in ``tier``."""
    return [i for i, c in enumerate(workload.cases) if tier in c.get("platforms", ("cpu", "gpu"))]


def title_on(workload: Workload, tier: str) -> str:
    return workload.gpu_title if tier == "gpu" and workload.gpu_title else workload.title


MLP_COLUMNS = (
    ("first_step_s", "compile + 1st step (s)", "{:.2f}"),
    ("first_epoch_s", "1st epoch incl. compile (s)", "{:.2f}"),
    ("loss_first", "loss, step 1", "{:.6f}"),
)


def _mlp_peers(target: str) -> List[Peer]:
    return [
        Peer("funcnet", target, note="funcnet.serial(Dense, Relu, ...), jax.jit"),
        Peer("jax", target, note="hand-written jnp + optax, jax.jit"),
        Peer("stax", target, note="jax.example_libraries.stax, jax.jit"),
        Peer("flax-linen", target, note="flax.linen.Dense, jax.jit"),
        Peer("flax-nnx", target, note="flax.nnx.Linear + nnx.Optimizer, nnx.jit"),
        Peer("haiku", target, note="hk.nets.MLP, jax.jit"),
        Peer("equinox", target, note="eqx.nn.Linear + vmap, eqx.filter_jit"),
        Peer("torch", target, note="torch.nn eager, torch.optim"),
        Peer("funcnet-bf16", target, note=BF16_NOTE, platforms=GPU_ONLY),
        Peer("torch-bf16", target, note=TORCH_BF16_NOTE, platforms=GPU_ONLY),
    ]


FIRST_EPOCH_COLUMN = ("first_epoch_s", "1st epoch incl. compile (s)", "{:.2f}")
# common.host_cpu_taken: the CPU time of the thread that dispatches, per timed epoch
HOST_CPU_COLUMN = ("host_cpu_ms", "host thread CPU an epoch (ms)", "{:.2f}")
MLP_CASE = dict(sizes=(784, 400, 100, 10), batch=128, opt="adam", lr=1e-3, reps=5, quick_reps=2, quick_steps=40)

DISPATCH_CASE = dict(sizes=(784, 64, 10), batch=32, opt="sgd", lr=0.1, reps=7, quick_reps=2, quick_steps=150)

CNN_CASE = dict(batch=128, lr=1e-3, padding="VALID", steps=10, reps=7, quick_steps=2, quick_reps=2)

WORKLOADS: List[Workload] = [
    Workload(
        "mlp",
        "1. MNIST MLP 784-400-100-10, ReLU, softmax CE, Adam(1e-3), batch 128",
        "s/epoch",
        peers=_mlp_peers("benchmarks.mlp:run"),
        cases=[dict(MLP_CASE, name="468 steps/epoch")],
        columns=MLP_COLUMNS,
        check="loss_first",
        notes="Steady-state seconds per epoch (60000 // 128 = 468 steps), after a first epoch "
        "that includes tracing and compilation. Same initial weights and batches for "
        "every peer; 'loss, step 1' must agree across peers.",
    ),
    Workload(
        "dispatch",
        "2. Dispatch-bound MLP 784-64-10, SGD(0.1), batch 32",
        "s/epoch",
        peers=_mlp_peers("benchmarks.mlp:run"),
        cases=[dict(DISPATCH_CASE, name="1875 steps/epoch")],
        columns=MLP_COLUMNS,
        check="loss_first",
        notes="Each step is tiny, so this measures per-step Python and dispatch overhead.",
    ),
    Workload(
        "cnn",
        "3. LeNet-style CNN: conv5x5x32-maxpool2-conv5x5x64-maxpool2-dense128-dense10, batch 128, Adam(1e-3)",
        "s/step",
        peers=[
            Peer(
                "funcnet",
                "benchmarks.cnn:run",
                note="funcnet Conv/MaxPool/Flatten/Dense (NHWC), jitted by funcnet.xla.jit "
                "(on CPU: convolutions on XLA's multi-threaded kernels, not YNNPACK's, "
                "and Conv's auto path is one XLA convolution); MaxPool takes its "
                "reshape+argmax path",
            ),
            # CPU only: on a GPU funcnet.xla.jit adds no option and Conv's auto path is
            # XLA's convolution, so the next three compile to funcnet's own program there.
            Peer(
                "funcnet-plainjit",
                "benchmarks.cnn:run",
                note="the same under a plain jax.jit: XLA's default kernels; Conv's auto path "
                "then runs the one-channel conv1's gradients through patches and conv2 "
                "on 4 chunks of 32 examples",
                platforms=CPU_ONLY,
            ),
            Peer(
                "funcnet-unchunked",
                "benchmarks.cnn:run",
                note="funcnet-plainjit with conv2 as Conv(implementation='xla'): one convolution over the batch",
                platforms=CPU_ONLY,
            ),
            Peer(
                "funcnet-xlaconv",
                "benchmarks.cnn:run",
                note="funcnet-plainjit with both convs as Conv(implementation='xla'): one "
                "lax.conv_general_dilated each",
                platforms=CPU_ONLY,
            ),
            Peer(
                "funcnet-im2col",
                "benchmarks.cnn:run",
                note="funcnet serial with a benchmark-local im2col Conv layer, plain jax.jit",
            ),
            Peer("jax-nhwc", "benchmarks.cnn:run", note="lax.conv_general_dilated NHWC/HWIO, reduce_window max pool"),
            Peer(
                "jax-nhwc-reshapepool",
                "benchmarks.cnn:run",
                note="lax.conv_general_dilated NHWC/HWIO, reshape+max pool",
            ),
            Peer(
                "jax-nhwc-firstmaxpool",
                "benchmarks.cnn:run",
                note="lax.conv_general_dilated NHWC/HWIO, reshape+argmax pool (gradient to the first max)",
            ),
            Peer("jax-nchw", "benchmarks.cnn:run", note="lax.conv_general_dilated NCHW/OIHW, reduce_window max pool"),
            Peer(
                "jax-im2col",
                "benchmarks.cnn:run",
                note="im2col conv (shifted slices + dot, autodiff), reduce_window max pool",
            ),
            Peer(
                "jax-im2col-vjp",
                "benchmarks.cnn:run",
                note="im2col conv with a custom_vjp (dW = patchesᵀ·dy, dx = col2im), reduce_window pool",
            ),
            Peer("torch", "benchmarks.cnn:run", note="torch.nn.Conv2d NCHW eager"),
            Peer("funcnet-bf16", "benchmarks.cnn:run", note=BF16_NOTE, platforms=GPU_ONLY),
            Peer("torch-bf16", "benchmarks.cnn:run", note=TORCH_BF16_NOTE, platforms=GPU_ONLY),
        ],
        cases=[dict(CNN_CASE, name="28x28x1, VALID convs")],
        throughput="steps/s",
        check="loss_first",
        check_rtol=1e-3,
        columns=(("first_step_s", "compile + 1st step (s)", "{:.2f}"), ("loss_first", "loss, step 1", "{:.6f}")),
        notes="ReLU after each conv and after dense128; 2x2/2 max pooling. See "
        "benchmarks/CONV_NOTES.md for the layout/flag/im2col investigation.",
    ),
    Workload(
        "softmax_output",
        "4. funcnet.outputs.softmax_output (custom_vjp) vs autodiff through log_softmax + NLL",
        "s/step",
        peers=[
            Peer("softmax_output", "benchmarks.softmax_output:run"),
            Peer("log_softmax-autodiff", "benchmarks.softmax_output:run"),
        ],
        cases=[
            dict(
                name="MLP 784-400-100-10, b128",
                sizes=(784, 400, 100, 10),
                batch=128,
                steps=50,
                reps=7,
                quick_steps=5,
                quick_reps=2,
            ),
            dict(
                name="MLP 784-512-10000, b1024",
                sizes=(784, 512, 10000),
                batch=1024,
                steps=5,
                reps=5,
                quick_steps=1,
                quick_reps=2,
                quick_batch=256,
            ),
        ],
        reference="softmax_output",
        check="loss_first",
        check_rtol=1e-4,
        columns=(
            ("residual_bytes", "bytes kept for backward", "{:,}"),
            ("temp_bytes", "XLA temp bytes", "{:,}"),
            ("loss_first", "loss, step 1", "{:.6f}"),
        ),
        notes="Whole Adam step jitted; softmax_output uses normalization='batch' so both heads "
        "give the gradient of the mean cross-entropy. 'bytes kept for backward' = the "
        "residuals jax.vjp stores (params -> head) for one batch, including the MLP's "
        "own; 'XLA temp bytes' = memory_analysis() of the compiled step, which on "
        "XLA:CPU leaves out per-execution buffers.",
    ),
    Workload(
        "center_loss",
        "5. Center loss: funcnet.losses.center_loss (vectorised, jitted) vs a per-sample Python loop (NumPy)",
        "s/call",
        peers=[Peer("funcnet", "benchmarks.center_loss:run"), Peer("python-loop", "benchmarks.center_loss:run")],
        cases=[
            dict(name=f"B=512, C={c}, d={d}", batch=512, classes=c, dim=d, reps=7, quick_reps=2)
            for d in (2, 128)
            for c in (10, 1000)
        ],
        check="loss",
        check_rtol=1e-4,
        columns=(("loss", "loss", "{:.6f}"), ("centers_sum", "sum of new centers", "{:.5f}")),
        notes="One call = loss and updated centers for one batch of features. The loop is the "
        "per-sample form of the same update (accumulate each sample's difference into its "
        "class, then move every center once), so both give the same loss and centers.",
    ),
    Workload(
        "fit",
        "6. funcnet.fit end to end vs bare step loops (workload 1's and workload 2's MLPs)",
        "s/epoch",
        peers=[
            Peer(
                "fit-device",
                "benchmarks.fit:run",
                note="fit(DeviceData): data on the device once, batches gathered in the step, "
                "50 steps per dispatch (the default: log_every), tqdm bar, metrics",
            ),
            Peer(
                "fit-device-k1", "benchmarks.fit:run", note="the same with steps_per_dispatch=1 (one dispatch per step)"
            ),
            Peer(
                "fit-device-quiet",
                "benchmarks.fit:run",
                note="fit-device with progress=False: no bar, so no loss read between dispatches (added 2026-12-04)",
            ),
            Peer(
                "fit",
                "benchmarks.fit:run",
                note="fit() on the host pipeline (data.batches): numpy shuffling, 50 "
                "batches gathered and copied to the device per dispatch of 50 steps "
                "(the default), tqdm bar, metrics",
            ),
            Peer(
                "fit-k1",
                "benchmarks.fit:run",
                note="the same with steps_per_dispatch=1: one batch gathered, copied and stepped per dispatch",
            ),
            Peer(
                "fit-thread",
                "benchmarks.fit:run",
                note="fit with prefetch=2: each dispatch's batches assembled in a background thread",
            ),
            Peer("train-step", "benchmarks.fit:run", note="loop over jit(make_train_step) on pre-built device batches"),
            Peer("jax", "benchmarks.fit:run", note="hand-written jax + optax step on pre-built device batches"),
            Peer(
                "jax-scan",
                "benchmarks.fit:run",
                note="the hand-written step in one jitted lax.scan over the epoch's "
                "pre-shuffled batches, stacked on the device: one dispatch per epoch",
            ),
            Peer(
                "jax-scan-unsplit",
                "benchmarks.fit:run",
                note="jax-scan compiled with funcnet.xla.unsplit_fusions(): XLA:CPU's loop "
                "fusions on one thread each, the program fit's race may choose (added 2026-12-02)",
            ),
            Peer(
                "fit-device-fixed",
                "benchmarks.fit:run",
                note="fit-device over the rows in jax-scan's order, DeviceData(shuffle=False): "
                "the same contiguous batches every epoch, as jax-scan",
            ),
            Peer(
                "jax-scan-shuffle",
                "benchmarks.fit:run",
                note="jax-scan that reshuffles as fit does: each epoch's order sent to the "
                "device, one lax.scan over its batches of indices, each step gathering "
                "its rows there; one dispatch per epoch (one gather per step since "
                "2026-12-03, one for the whole epoch before)",
            ),
            Peer(
                "jax-scan-shuffle-unsplit",
                "benchmarks.fit:run",
                note="jax-scan-shuffle compiled with funcnet.xla.unsplit_fusions(), the other "
                "program of fit's race (added 2026-12-03)",
            ),
            Peer(
                "step-scan-shuffle",
                "benchmarks.fit:run",
                note="jax-scan-shuffle with fit's own step (make_train_step of fit's loss_fn, "
                "on the TrainState): fit's steps on fit's batches, without fit's loop (added 2026-12-03)",
            ),
            Peer(
                "step-scan-shuffle-unsplit",
                "benchmarks.fit:run",
                note="step-scan-shuffle compiled with funcnet.xla.unsplit_fusions() (added 2026-12-03)",
            ),
            Peer(
                "pipeline",
                "benchmarks.fit:run",
                note="no step: data.batches shuffle-gather + device_put of every batch",
            ),
        ],
        cases=[
            dict(MLP_CASE, name="784-400-100-10, b128, Adam"),
            # 41 epochs (workload 2's case has 8): a run long enough for fit's race of split
            # against unsplit loop fusions (funcnet.loop._race.PAYS) on this MLP
            dict(DISPATCH_CASE, name="784-64-10, b32, SGD (dispatch-bound)", reps=40),
        ],
        reference="fit-device",
        columns=(FIRST_EPOCH_COLUMN, HOST_CPU_COLUMN),
        notes="Ratio = fit-device's time / the peer's: fit-device / jax is the whole cost of "
        "fit on device-resident data against the hand-written loop over pre-built device "
        "batches (target <= 0.95); fit-device / jax-scan is fit against one lax.scan "
        "per epoch (target <= 1.02); fit's time / jax's (jax's ratio divided by fit's) is "
        "the host pipeline's price (target <= 1.05); the train-step row is the "
        "cost of TrainState and make_train_step alone; the pipeline row is the host data "
        "work by itself (its ratio is not meaningful, its time is).",
    ),
    Workload(
        "fit-nets",
        "6b. funcnet.fit on the network families: Flax's MNIST CNN, LeNet, nanoGPT's GPT",
        "s/step",
        peers=[
            Peer("fit", "benchmarks.fit_nets:run", note="fit's defaults over the host pipeline (data.batches)"),
            Peer(
                "fit-device",
                "benchmarks.fit_nets:run",
                note="fit's defaults over DeviceData: on CPU one step per dispatch and "
                "funcnet.xla's compiler options for the CNNs (they have convolutions), "
                "10 steps (log_every) per dispatch and plain jax.jit for the GPT",
            ),
            Peer(
                "fit-device-quiet",
                "benchmarks.fit_nets:run",
                note="fit-device with progress=False: no bar, so no loss read every log_every steps (added 2026-12-04)",
            ),
            Peer(
                "fit-device-loop",
                "benchmarks.fit_nets:run",
                note="fit over DeviceData with steps_per_dispatch=10: a loop on the device",
            ),
            Peer(
                "fit-device-plain",
                "benchmarks.fit_nets:run",
                note="fit-device with compiler_options=None (plain jax.jit)",
                platforms=CPU_ONLY,
            ),
            Peer(
                "fit-device-options",
                "benchmarks.fit_nets:run",
                note="fit-device with compiler_options=funcnet.xla.compiler_options()",
                platforms=CPU_ONLY,
            ),
            Peer(
                "jit-loop",
                "benchmarks.fit_nets:run",
                note="a Python loop over jax.jit(make_train_step) on pre-built device "
                "batches: the same network and step without fit",
            ),
            Peer(
                "jit-loop-options",
                "benchmarks.fit_nets:run",
                note="the same loop over funcnet.xla.jit(make_train_step): with funcnet.xla's compiler options",
                platforms=CPU_ONLY,
            ),
            Peer(
                "flax",
                "benchmarks.fit_nets:run",
                note="Flax NNX's tutorial CNN and nnx.jit train step, same device batches (flax-cnn only)",
            ),
        ],
        cases=[
            # 8 timed epochs a round, not 3: interleaved, 3 rounds then give 24 turn-by-turn
            # pairs, whose 95% interval spans x_(7)..x_(18); with 9 pairs (x_(2)..x_(8)) it
            # spanned 0.92-1.18 on LeNet (runs AH, AJ), too wide to tell 1.0x from 1.05x.
            dict(
                name="flax-cnn: Flax NNX's MNIST CNN, b128, SGD+momentum",
                net="flax-cnn",
                batch=128,
                steps=20,
                reps=8,
                quick_steps=10,
                quick_reps=1,
            ),
            dict(
                name="lenet: workload 3's LeNet, b128, Adam",
                net="lenet",
                batch=128,
                steps=30,
                reps=8,
                quick_steps=10,
                quick_reps=1,
                skip_peers=("flax",),
            ),
            dict(
                name="gpt: nanoGPT's CPU character GPT (4 x 128, block 64, b12), AdamW",
                net="gpt",
                batch=12,
                steps=100,
                reps=8,
                quick_steps=20,
                quick_reps=1,
                skip_peers=("flax",),
            ),
        ],
        reference="fit-device",
        columns=(FIRST_EPOCH_COLUMN, HOST_CPU_COLUMN),
        notes="Ratio = fit-device's time / the peer's, per step (each fit call runs 1 + reps "
        "epochs; the first, with compilation, is its own column). fit-device / jit-loop is "
        "what fit costs over a bare loop of the same step; fit-device-loop shows what a "
        "loop on the device does to each network on this backend; fit-device-plain and "
        "fit-device-options what funcnet.xla's CPU option does (fit's default takes it "
        "for a step with a convolution on CPU).",
    ),
    Workload(
        "pmap",
        "7. pmap, and jit on a mesh, over 4 simulated CPU devices vs jit on 1 device "
        "(MLP 784-400-100-10, global batch 512, Adam)",
        "s/step",
        # CPU only: the 4 devices are simulated CPU devices.
        peers=[
            Peer(
                "pmap-4",
                "benchmarks.pmap:run",
                xla_flags="--xla_force_host_platform_device_count=4",
                platforms=CPU_ONLY,
            ),
            Peer(
                "jit-mesh-4",
                "benchmarks.pmap:run",
                xla_flags="--xla_force_host_platform_device_count=4",
                note="jit(step) on a 4-device data mesh (NamedSharding), no axis_name",
                platforms=CPU_ONLY,
            ),
            Peer("jit-1", "benchmarks.pmap:run", platforms=CPU_ONLY),
        ],
        cases=[
            dict(
                name="global batch 512",
                sizes=(784, 400, 100, 10),
                batch=512,
                steps=30,
                reps=5,
                quick_steps=3,
                quick_reps=2,
            )
        ],
        reference="pmap-4",
        throughput="steps/s",
        check="loss_first",
        check_rtol=1e-4,
        columns=(("loss_first", "loss, step 1", "{:.6f}"),),
        notes="Correctness-level only: the 4 'devices' are simulated and share this machine's "
        "cores and one thread pool, so no speed-up is expected.",
    ),
    Workload(
        "precision",
        "8. bfloat16 compute vs float32 on the real MNIST (workload 1's MLP and "
        "workload 3's CNN, funcnet layers, Adam(1e-3), batch 128)",
        "s/step",
        peers=[
            Peer("f32", "benchmarks.precision:run", note="float32 throughout"),
            Peer(
                "bf16",
                "benchmarks.precision:run",
                note="precision.apply_policy: float32 params, bfloat16 compute, float32 output and loss",
            ),
        ],
        cases=[
            dict(
                name="MLP 784-400-100-10",
                model="mlp",
                batch=128,
                lr=1e-3,
                steps=100,
                reps=5,
                quick_steps=5,
                quick_reps=2,
            ),
            dict(
                name="CNN (workload 3)", model="cnn", batch=128, lr=1e-3, steps=20, reps=5, quick_steps=2, quick_reps=2
            ),
        ],
        reference="bf16",
        throughput="steps/s",
        columns=(
            ("steps_trained", "steps trained", "{:d}"),
            ("test_acc", "test accuracy after them (%)", "{:.2f}"),
            ("loss_last", "last train loss", "{:.4f}"),
        ),
        notes="Same weights and batches for both; the accuracy column is after the same number "
        "of steps (compile, 2 warm-up steps and the timed blocks), on the 10000 test "
        "images. On this CPU (AVX-512 BF16), bfloat16 compute is what XLA:CPU makes of it: "
        "read the speed column before choosing it.",
    ),
    Workload(
        "gpt",
        "9. nanoGPT's character GPT, one AdamW step (its CPU configuration: 4 layers, "
        "4 heads, 128 wide, block 64, batch 12)",
        "s/step",
        peers=[
            Peer(
                "funcnet",
                "benchmarks.gpt:run_funcnet",
                note="funcnet.models.GPT (TiedEmbedding, TransformerBlock), jit(make_train_step)",
            ),
            Peer(
                "funcnet-2dev",
                "benchmarks.gpt:run_funcnet",
                xla_flags="--xla_force_host_platform_device_count=2",
                note="the same, the batch split over 2 CPU devices (one per core), params replicated",
                platforms=CPU_ONLY,
            ),
            Peer(
                "funcnet-loop",
                "benchmarks.gpt:run_funcnet",
                note="one device, 10 steps per dispatch (lax.scan): examples/shakespeare_char.py's loop",
            ),
            Peer(
                "funcnet-2dev-loop",
                "benchmarks.gpt:run_funcnet",
                xla_flags="--xla_force_host_platform_device_count=2",
                note="the batch split over 2 CPU devices, 10 steps per dispatch (lax.scan), as "
                "examples/shakespeare_char.py --devices=2 (its default until 2026-11-28)",
                platforms=CPU_ONLY,
            ),
            Peer(
                "funcnet-scan",
                "benchmarks.gpt:run_funcnet",
                note="the blocks as Scan(block, n_layer): one compiled block",
            ),
            Peer(
                "funcnet-bf16",
                "benchmarks.gpt:run_funcnet",
                note="precision.apply_policy: float32 params, bfloat16 compute",
            ),
            Peer(
                "jax",
                "benchmarks.gpt:run_jax",
                note="hand-written jax.numpy GPT: flattened matmuls, fused qkv, heads in the batch",
            ),
            Peer(
                "torch",
                "benchmarks.gpt:run_torch",
                note="nanoGPT's architecture in torch.nn, eager (nanoGPT's compile=False on CPU)",
            ),
            Peer("torch-compile", "benchmarks.gpt:run_torch", note="the same under torch.compile"),
            Peer(
                "torch-bf16",
                "benchmarks.gpt:run_torch",
                note="eager under torch.autocast(bfloat16) on the peer's device",
            ),
        ],
        cases=[
            dict(
                name="4 x 128, block 64, batch 12",
                n_layer=4,
                n_head=4,
                n_embd=128,
                block=64,
                batch=12,
                steps=50,
                reps=5,
                quick_steps=2,
                quick_reps=2,
                platforms=CPU_ONLY,
            ),
            dict(
                name="12 x 128 (compile time of a deep stack)",
                n_layer=12,
                n_head=4,
                n_embd=128,
                block=64,
                batch=12,
                steps=20,
                reps=3,
                quick_steps=1,
                quick_reps=1,
                platforms=CPU_ONLY,
            ),
            # nanoGPT's config/train_shakespeare_char.py (its GPU run); --quick shrinks it
            # to a smoke check (the GPU tier's rehearsal on CPU runs it so).
            dict(
                name="6 x 384, block 256, batch 64 (nanoGPT's GPU configuration)",
                n_layer=6,
                n_head=6,
                n_embd=384,
                block=256,
                batch=64,
                steps=20,
                reps=5,
                quick_n_layer=1,
                quick_n_head=2,
                quick_n_embd=32,
                quick_block=16,
                quick_batch=4,
                quick_steps=1,
                quick_reps=1,
                platforms=GPU_ONLY,
            ),
        ],
        throughput="steps/s",
        check="loss_first",
        check_rtol=2e-2,
        columns=(("first_step_s", "compile + 1st step (s)", "{:.2f}"), ("loss_first", "loss, step 1", "{:.5f}")),
        notes="Same initial weights and batches for every peer (bf16 peers agree to ~1e-2). "
        "'compile + 1st step' is where Scan pays: one block compiled instead of n_layer.",
        gpu_title="9. nanoGPT's character GPT, one AdamW step (its GPU configuration: 6 layers, "
        "6 heads, 384 wide, block 256, batch 64)",
    ),
]


def by_name() -> Dict[str, Workload]:
    return {w.name: w for w in WORKLOADS}
