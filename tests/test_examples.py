"""The examples run end to end on the shipped MNIST (short runs)."""
import os
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args, timeout=240):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the example sets its own device count
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args],
                         capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_mnist_mlp_one_epoch_and_resume(tmp_path):
    ck = tmp_path / "ck"
    plot = tmp_path / "curves.png"
    text = run("mnist_mlp.py", "--epochs", "1", "--checkpoint-dir", str(ck), "--plot", str(plot),
               "--no-progress")
    acc = float(text.split("final test accuracy ")[1].split("%")[0])
    assert acc > 94.0, text
    assert plot.stat().st_size > 10_000
    text = run("mnist_mlp.py", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", "--plot", "",
               "--no-progress")
    rows = [l.split() for l in text.splitlines() if l.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["2"], text  # epoch 1 came from the checkpoint


def test_center_loss_example_on_four_devices(tmp_path):
    plot = tmp_path / "features.png"
    text = run("mnist_center_loss.py", "--epochs", "1", "--devices", "4", "--plot", str(plot),
               "--no-progress")
    acc = float(text.split("final test accuracy ")[1].split("%")[0])
    assert acc > 60.0, text  # one epoch through a 2-D bottleneck; 10% is chance
    assert plot.stat().st_size > 10_000


def test_pmap_example(tmp_path):
    text = run("pmap_mnist.py", "--devices", "4", "--epochs", "1")
    assert "4 device(s)" in text and "per device" in text
    acc = float(text.split("test acc ")[1].split("%")[0])
    assert acc > 90.0, text
