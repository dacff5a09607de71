"""The tinynn ports in examples/ (autoencoder, GAN, nn_paint, DQN), run briefly in-process.

Each example's ``main(argv)`` is called with tiny settings; running them in this
process, rather than as scripts, saves a JAX start-up per example.
"""

import importlib
import math
import os

import jax
import numpy as np
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


@pytest.fixture
def example(monkeypatch):
    """Imports an example script as a module (examples/ is not a package)."""
    monkeypatch.syspath_prepend(EXAMPLES)
    return importlib.import_module


def test_autoencoder_denoises_and_hands_back_the_noisy_inputs(example, tmp_path):
    plot = tmp_path / "ae.png"
    err, base, outputs = example("mnist_autoencoder").main(["--epochs", "1", "--limit", "2048", "--plot", str(plot)])
    assert err < 0.8 * base  # the output is closer to the clean digit than the noisy input is
    # The step's own noise, N(0.3, 0.2), came back through Aux(outputs=...): MNIST's mean
    # pixel is 0.13, so the noisy inputs average about 0.43.
    assert outputs["noisy"].shape == (12, 784) and 0.35 < float(outputs["noisy"].mean()) < 0.55
    assert plot.stat().st_size > 10_000


def test_gan_alternates_disc_and_gen_steps(example, tmp_path):
    plot = tmp_path / "gan.png"
    history, samples = example("mnist_dcgan").main(["--epochs", "1", "--limit", "512", "--plot", str(plot)])
    logs = history[-1]
    assert all(math.isfinite(v) for v in logs.values()), logs
    assert 0 < logs["D(G(z))"] < logs["D(x)"] < 1, logs  # D already tells real from fake a bit
    assert samples.shape == (64, 784) and 0 <= samples.min() and samples.max() <= 1
    assert plot.stat().st_size > 10_000


def test_gan_cnn_makes_28x28_digits(example):
    dcgan = example("mnist_dcgan")
    G, D, image_shape = dcgan.nets("cnn")
    shapes = {}

    def init(key):  # traced only (eval_shape): the shapes without compiling anything
        shapes["G"], g_params, _ = G.init(key, (-1, dcgan.NOISE))
        shapes["D"], d_params, _ = D.init(key, (-1, *image_shape))
        return g_params, d_params

    jax.eval_shape(init, jax.random.key(0))
    assert shapes == {"G": (-1, 28, 28, 1), "D": (-1, 1)} and image_shape == (28, 28, 1)


def test_nn_paint_learns_the_builtin_picture(example, tmp_path):
    plot = tmp_path / "paint.png"
    errors = example("nn_paint").main(["--epochs", "3", "--size", "32", "--plot", str(plot)])
    assert len(errors) == 3 and errors[-1] < errors[0] < 0.2, errors
    assert plot.stat().st_size > 5_000


def test_nn_paint_reads_an_image_file(example, tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    paint = example("nn_paint")
    picture = np.random.default_rng(0).random((40, 20, 3))
    plt.imsave(tmp_path / "in.png", picture)
    img = paint.load_picture(str(tmp_path / "in.png"), size=10)
    assert img.shape == (10, 5, 3) and img.dtype == np.float32
    np.testing.assert_allclose(img, picture[::4, ::4], atol=1 / 255)
    # tinynn's inputs: (row, column) centred and scaled by the size, row-major.
    xy = paint.coordinates(2, 4)
    np.testing.assert_allclose(xy[:5], [[-0.5, -0.5], [-0.5, -0.25], [-0.5, 0.0], [-0.5, 0.25], [0.0, -0.5]])


def test_cartpole_follows_gyms_equations(example):
    CartPole = example("dqn_cartpole").CartPole
    env = CartPole(seed=0)
    env.reset()
    # From rest, pushed right: gym's equations worked by hand.
    # temp = 10 / 1.1; theta_acc = -temp / (0.5 * (4/3 - 0.1 / 1.1)); x_acc = temp - 0.05 * theta_acc / 1.1
    env.state = np.zeros(4)
    obs, reward, terminated, truncated = env.step(1)
    np.testing.assert_allclose(obs, [0.0, 0.195122, 0.0, -0.292683], rtol=1e-5)
    assert reward == 1.0 and not terminated and not truncated
    # Leaning right, pushed right (sin/cos terms active).
    env.state = [0.0, 0.0, 0.05, 0.0]
    obs = env.step(1)[0]
    temp = 10.0 / 1.1
    theta_acc = (9.8 * math.sin(0.05) - math.cos(0.05) * temp) / (0.5 * (4 / 3 - 0.1 * math.cos(0.05) ** 2 / 1.1))
    x_acc = temp - 0.05 * theta_acc * math.cos(0.05) / 1.1
    np.testing.assert_allclose(obs, [0.0, 0.02 * x_acc, 0.05, 0.02 * theta_acc], rtol=1e-6)
    env.state = [2.39, 1.0, 0.0, 0.0]
    assert env.step(1)[2]  # leaves the track: terminated
    env.state = [0.0, 0.0, 0.2, 1.0]
    assert env.step(1)[2]  # past 12 degrees: terminated
    env.reset()
    steps = 1
    while not env.step(steps % 2)[3]:  # alternating pushes never fall: v0's cap truncates
        steps += 1
    assert steps == 200


def test_replay_buffer_is_a_ring_and_samples_what_it_holds(example):
    buf = example("dqn_cartpole").Replay(4, seed=0)
    for i in range(6):
        buf.add([i] * 4, i % 2, 1.0, [i + 1] * 4, float(i == 5))
    assert sorted(buf.obs[:, 0]) == [2, 3, 4, 5]  # the two oldest were overwritten
    obs, action, reward, next_obs, done = buf.sample(64)
    assert obs.shape == (64, 4) and set(obs[:, 0]) <= {2, 3, 4, 5}
    np.testing.assert_array_equal(next_obs[:, 0], obs[:, 0] + 1)  # rows stay aligned
    np.testing.assert_array_equal(action, obs[:, 0] % 2)
    np.testing.assert_array_equal(done, obs[:, 0] == 5)


def test_dqn_runs_and_evaluates(example, tmp_path):
    plot = tmp_path / "dqn.png"
    returns, solved_at = example("dqn_cartpole").main(
        ["--episodes", "12", "--warmup", "100", "--eval-every", "6", "--plot", str(plot)]
    )
    assert len(returns) == 12 and all(1 <= r <= 200 for r in returns)
    assert solved_at is None  # 12 episodes are far too few
    assert plot.stat().st_size > 5_000
