"""The examples run end to end on the shipped MNIST (short runs)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, timeout=240):
    env = dict(os.environ)
    env["XLA_FLAGS"] = env.get("FUNCNET_TEST_XLA_FLAGS", "")  # the example adds its device count
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def run_here(capsys, script, *args):
    """``script``'s ``main(args)`` in this process, its output captured.

    For the examples that fit the test process as it is (its 4 simulated devices): no
    interpreter, JAX or MNIST start-up per run, and compilations shared with the other
    tests. ``run`` checks the scripts start as scripts."""
    import importlib

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        module = importlib.import_module(script[:-3])
    finally:
        sys.path.pop(0)
    capsys.readouterr()
    module.main(list(args))
    return capsys.readouterr().out


def test_mnist_mlp_one_epoch_and_resume(tmp_path, capsys):
    ck = tmp_path / "ck"
    plot = tmp_path / "curves.png"
    text = run("mnist_mlp.py", "--epochs", "1", "--checkpoint-dir", str(ck), "--plot", str(plot), "--no-progress")
    acc = float(text.split("final test accuracy ")[1].split("%")[0])
    assert acc > 94.0, text
    assert plot.stat().st_size > 10_000
    text = run_here(
        capsys, "mnist_mlp.py", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", "--plot", "", "--no-progress"
    )
    rows = [l.split() for l in text.splitlines() if l.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["2"], text  # epoch 1 came from the checkpoint


@pytest.mark.devices(2)
def test_center_loss_example_on_two_devices(tmp_path, capsys):
    # two of the test process's four devices: data parallelism and the centers' sync are
    # the same code for any N, and four simulated devices on two cores cost 60 % more time
    plot = tmp_path / "features.png"
    text = run_here(
        capsys, "mnist_center_loss.py", "--epochs", "1", "--devices", "2", "--plot", str(plot), "--no-progress"
    )
    acc = float(text.split("final test accuracy ")[1].split("%")[0])
    assert acc > 60.0, text  # one epoch through a 2-D bottleneck; 10% is chance
    assert plot.stat().st_size > 10_000


@pytest.mark.devices(4)
def test_pmap_example(tmp_path, capsys):
    text = run_here(capsys, "pmap_mnist.py", "--devices", "2", "--epochs", "1")
    assert "2 device(s)" in text and "per device" in text
    acc = float(text.split("test acc ")[1].split("%")[0])
    assert acc > 90.0, text


@pytest.mark.devices(4)
def test_sharded_mnist_example_gives_the_same_run_in_every_layout(capsys):
    """FSDP and the 2-D (tensor parallel) layout train to the loss data parallelism does,
    each device holding a quarter of the state. Run in this process (its 4 simulated
    devices), where the three runs share their compilations."""
    outs = {
        layout: run_here(
            capsys,
            "sharded_mnist.py",
            "--layout",
            layout,
            "--devices",
            "4",
            "--epochs",
            "1",
            "--train-size",
            "4096",
            "--width",
            "256",
        )
        for layout in ("replicated", "fsdp", "2d")
    }
    losses = {k: float(v.split("epoch 1: loss ")[1].split(",")[0]) for k, v in outs.items()}
    assert max(losses.values()) - min(losses.values()) < 1e-3, losses
    accs = [float(v.split("test accuracy ")[1].split("%")[0]) for v in outs.values()]
    assert min(accs) > 75.0, outs["fsdp"]
    held = {k: float(v.split("MiB in all, ")[1].split(" MiB")[0]) for k, v in outs.items()}
    assert held["fsdp"] <= 1.1 * held["replicated"] / 4 and held["2d"] <= 1.1 * held["replicated"] / 4
    assert all("still laid out as placed: True" in v for v in outs.values())
