"""DQN on CartPole-v0 with funcnet: an online and a target network in one TrainState.

The environment is CartPole-v0's physics written in NumPy below (gym's equations and
constants, episodes capped at 200 steps), so nothing needs installing;
``--gymnasium`` uses ``gymnasium``'s CartPole-v1 capped at 200 steps instead, if it is
installed. The step returns the Q-values it computed through ``Aux(outputs=...)``.

The agent has the parts of tinynn's ``examples/rl`` DQN: a Q-network, a replay buffer,
epsilon-greedy exploration and a target network. The settings are this port's own, and
with them the greedy policy reached the cap within the default 300 episodes for each
of the seeds 0, 1 and 2 (docs/guides/examples.md): an MLP 4-64-64-2, Huber loss on the TD
error, Adam(5e-4), epsilon from 1 to 0.05 over 5000 steps, gym's rewards, and a target
network moved towards the online one after every step (``funcnet.polyak_update``;
``--hard-update N`` copies it every N steps instead, with ``funcnet.copy_params``).
tinynn's are a 4-100-2 MLP, MSE, RMSProp(1e-4), a target copied every 1000 steps,
epsilon from 0.75 to 0.2 over 1000 episodes, and rewards reshaped to 0.1 and -1.

    python examples/dqn_cartpole.py                  # at most 300 episodes

Every ``--eval-every`` episodes the greedy policy plays 10 episodes; training stops
when their mean reaches 200 (the v0 cap). The last line gives that episode, the first
training episode (exploring) that reached 200, and the mean return of the last 10
training episodes. Writes ``--plot`` (PNG: returns per episode).
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import funcnet
from funcnet import losses
from funcnet.layers import Dense, Relu
from funcnet.train import Aux, TrainState, make_train_step

try:
    from _plots import pyplot, save
except ImportError:  # run as a module from elsewhere
    from examples._plots import pyplot, save


class CartPole:
    """CartPole-v0: gym's dynamics (Euler steps of 0.02 s), reward 1 per step, 200-step cap."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_limit, x_limit, max_steps = 12 * 2 * math.pi / 360, 2.4, 200

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.state, self.steps = None, 0

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        self.steps = 0
        return self.state.astype(np.float32)

    def step(self, action):
        """``(observation, reward, terminated, truncated)``."""
        x, x_dot, theta, theta_dot = self.state
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * self.length
        force = self.force_mag if action == 1 else -self.force_mag
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass)
        )
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        self.state = np.array(
            [
                x + self.tau * x_dot,
                x_dot + self.tau * x_acc,
                theta + self.tau * theta_dot,
                theta_dot + self.tau * theta_acc,
            ]
        )
        self.steps += 1
        terminated = bool(abs(self.state[0]) > self.x_limit or abs(self.state[2]) > self.theta_limit)
        return self.state.astype(np.float32), 1.0, terminated, self.steps >= self.max_steps


class Gymnasium:
    """gymnasium's CartPole, capped at v0's 200 steps, behind the same interface."""

    def __init__(self, seed=0):
        try:
            import gymnasium
        except ImportError:
            raise SystemExit(
                "--gymnasium needs gymnasium (pip install gymnasium); without the "
                "flag the example runs its own NumPy CartPole."
            ) from None
        self.env, self.seed, self.steps = gymnasium.make("CartPole-v1"), seed, 0

    def reset(self):
        self.steps = 0
        obs, _ = self.env.reset(seed=self.seed)
        self.seed += 1
        return obs.astype(np.float32)

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(int(action))
        self.steps += 1
        return obs.astype(np.float32), reward, terminated, truncated or self.steps >= 200


class Replay:
    """A ring buffer of transitions; ``sample`` draws a batch uniformly."""

    def __init__(self, size, seed=0):
        self.obs = np.zeros((size, 4), np.float32)
        self.next_obs = np.zeros((size, 4), np.float32)
        self.action = np.zeros(size, np.int32)
        self.reward = np.zeros(size, np.float32)
        self.done = np.zeros(size, np.float32)
        self.size, self.count, self.rng = size, 0, np.random.default_rng(seed)

    def add(self, obs, action, reward, next_obs, done):
        i = self.count % self.size
        self.obs[i], self.action[i], self.reward[i] = obs, action, reward
        self.next_obs[i], self.done[i] = next_obs, done
        self.count += 1

    def sample(self, n):
        idx = self.rng.integers(0, min(self.count, self.size), size=n)
        return (self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.done[idx])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.01, help="Polyak step of the target network")
    p.add_argument("--hard-update", type=int, default=0, help="copy every N steps instead")
    p.add_argument("--buffer", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=500, help="random steps before learning")
    p.add_argument("--eps-decay-steps", type=int, default=5000)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gymnasium", action="store_true")
    p.add_argument("--plot", default="dqn_cartpole.png", help="PNG ('' = none)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    make_env = Gymnasium if args.gymnasium else CartPole
    env, eval_env = make_env(args.seed), make_env(args.seed + 1000)
    Q = funcnet.serial(Dense(64), Relu, Dense(64), Relu, Dense(2))
    optimizer = optax.adam(args.lr)
    agent = TrainState.create(
        {"online": (Q, (-1, 4)), "target": (Q, (-1, 4))}, {"online": optimizer}, jax.random.key(args.seed)
    )
    agent = funcnet.copy_params(agent, "online", "target")

    def td_loss(params, state, batch, rng):
        obs, action, reward, next_obs, done = batch
        q = Q.apply(params["online"], (), obs)[0]
        next_q = Q.apply(params["target"], (), next_obs)[0]  # the target net is not trained
        target = reward + args.gamma * (1.0 - done) * jnp.max(next_q, axis=-1)
        q_taken = jnp.take_along_axis(q, action[:, None], axis=-1)[:, 0]
        loss = losses.huber(q_taken, jax.lax.stop_gradient(target), delta=1.0)
        return loss, Aux(state=state, metrics={"q": jnp.mean(q_taken)}, outputs={"q": q})

    train = jax.jit(make_train_step(td_loss, {"online": optimizer}, update="online"))
    soft = jax.jit(lambda a: funcnet.polyak_update(a, "online", "target", args.tau))
    greedy = jax.jit(lambda params, obs: jnp.argmax(Q.apply(params, (), obs[None])[0][0]))
    replay, rng = Replay(args.buffer, args.seed), np.random.default_rng(args.seed)

    def play(env, policy):
        obs, total, done = env.reset(), 0.0, False
        while not done:
            obs, reward, terminated, truncated = env.step(policy(obs))
            total += reward
            done = terminated or truncated
        return total

    returns, solved_at, first_200, steps, t0 = [], None, None, 0, time.perf_counter()
    for episode in range(1, args.episodes + 1):
        obs, total, done = env.reset(), 0.0, False
        while not done:
            eps = max(0.05, 1.0 - steps / args.eps_decay_steps)
            action = (
                int(rng.integers(2))
                if steps < args.warmup or rng.random() < eps
                else int(greedy(agent.params["online"], obs))
            )
            next_obs, reward, terminated, truncated = env.step(action)
            # A capped episode did not fail: only a real termination cuts the bootstrap.
            replay.add(obs, action, reward, next_obs, float(terminated))
            obs, total, done, steps = next_obs, total + reward, terminated or truncated, steps + 1
            if steps >= args.warmup:
                agent, metrics, outputs = train(agent, replay.sample(args.batch_size))
                if args.hard_update:
                    if steps % args.hard_update == 0:
                        agent = funcnet.copy_params(agent, "online", "target")
                else:
                    agent = soft(agent)
        returns.append(total)
        if total >= 200 and first_200 is None:
            first_200 = episode
        if episode % args.eval_every == 0:
            score = np.mean([play(eval_env, lambda o: int(greedy(agent.params["online"], o))) for _ in range(10)])
            print(
                f"episode {episode:>4}  return {total:5.0f}  mean of last 10 "
                f"{np.mean(returns[-10:]):6.1f}  greedy {score:6.1f}  "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            if score >= 200:
                solved_at = episode
                break
    print(
        (
            f"greedy policy reached the cap of 200 at episode {solved_at}"
            if solved_at
            else f"greedy policy did not reach 200 in {args.episodes} episodes"
        )
        + f"; first training episode at 200: {first_200}; mean return of the last 10 "
        f"training episodes {np.mean(returns[-10:]):.1f} ({steps} steps, "
        f"{time.perf_counter() - t0:.0f} s)"
    )
    if args.plot:
        plt = pyplot()
        if plt is not None:
            fig, ax = plt.subplots(figsize=(6, 3.2))
            episodes = np.arange(1, len(returns) + 1)
            ax.plot(episodes, returns, lw=0.8, alpha=0.6, label="return")
            moving = [np.mean(returns[max(0, i - 9) : i + 1]) for i in range(len(returns))]
            ax.plot(episodes, moving, lw=1.5, label="mean of the last 10")
            ax.axhline(200, ls="--", color="grey")
            ax.legend(loc="upper left", fontsize=8)
            ax.set(xlabel="episode", ylabel="return", title="DQN on CartPole-v0")
            fig.tight_layout()
            save(fig, args.plot)
    return returns, solved_at


if __name__ == "__main__":
    main()
