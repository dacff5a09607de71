"""The examples run end to end on the shipped MNIST (short runs)."""
import os
import subprocess
import sys

import pytest


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


def test_autoencoder_denoises(tmp_path):
    plot = tmp_path / "ae.png"
    text = run("mnist_autoencoder.py", "--epochs", "1", "--limit", "6000", "--plot", str(plot))
    err, base = (float(v) for v in
                 text.split("test reconstruction error ")[1].split(")")[0]
                 .replace("(the noisy input itself:", "").split())
    assert err < 0.6 * base, text  # the output is much closer to the clean image than the input
    assert plot.stat().st_size > 10_000


def test_gan_trains_both_networks(tmp_path):
    plot = tmp_path / "gan.png"
    text = run("mnist_dcgan.py", "--epochs", "1", "--limit", "4096", "--plot", str(plot))
    line = [l for l in text.splitlines() if l.startswith("epoch")][-1].split()
    d_loss, g_loss = float(line[4]), float(line[7])
    assert 0 < d_loss < 10 and 0 < g_loss < 20, text
    assert plot.stat().st_size > 10_000


def test_gan_cnn_builds_28x28_images():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import jax
        from mnist_dcgan import NOISE, nets
        G, D, shape = nets("cnn")
        out, params, _ = G.init(jax.random.key(0), (-1, NOISE))
        assert out == (-1, 28, 28, 1) and shape == (28, 28, 1)
        assert D.init(jax.random.key(0), (-1, 28, 28, 1))[0] == (-1, 1)
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))


def test_nn_paint_learns_the_builtin_picture(tmp_path):
    plot = tmp_path / "paint.png"
    text = run("nn_paint.py", "--epochs", "3", "--size", "32", "--plot", str(plot))
    mse = [float(l.split()[3]) for l in text.splitlines() if l.startswith("epoch")]
    assert len(mse) == 3 and mse[-1] < mse[0] < 0.2, text
    assert plot.stat().st_size > 5_000


def test_cartpole_physics_and_dqn_steps(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import math
        from dqn_cartpole import CartPole, Replay
        env = CartPole(seed=0)
        env.reset()
        env.state = [0.0, 0.0, 0.05, 0.0]
        obs, reward, terminated, truncated = env.step(1)
        # gym's equations by hand for this state: push right, pole leaning right
        temp = (10.0 + 0.05 * 0.0 * math.sin(0.05)) / 1.1
        theta_acc = (9.8 * math.sin(0.05) - math.cos(0.05) * temp) / (
            0.5 * (4 / 3 - 0.1 * math.cos(0.05) ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * math.cos(0.05) / 1.1
        assert obs.tolist() == pytest.approx([0.0, 0.02 * x_acc, 0.05, 0.02 * theta_acc],
                                             rel=1e-6)
        assert reward == 1.0 and not terminated and not truncated
        env.state = [2.39, 1.0, 0.0, 0.0]
        assert env.step(1)[2]          # leaves the track
        env.reset()
        steps = 0
        while not env.step(steps % 2)[3]:
            steps += 1
        assert steps + 1 == 200        # v0's cap truncates
        buf = Replay(4)
        for i in range(6):
            buf.add([i] * 4, i % 2, 1.0, [i + 1] * 4, 0.0)
        assert sorted(buf.obs[:, 0]) == [2, 3, 4, 5]   # a ring: the oldest were overwritten
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    text = run("dqn_cartpole.py", "--episodes", "12", "--warmup", "100", "--eval-every", "6",
               "--plot", str(tmp_path / "dqn.png"))
    assert text.count("greedy") >= 2 and (tmp_path / "dqn.png").stat().st_size > 5_000
