"""Train a small PPO agent on CartPole, load it back, act with it in a gymnasium env, and
evaluate it again: jaxwm's Python surface end to end.

    python examples/train_load_evaluate.py                 # ~50k steps, a few minutes on a CPU
    python examples/train_load_evaluate.py --steps 2048    # seconds (what CI runs)
"""

import argparse

import gymnasium as gym

import jaxwm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps to train")
    parser.add_argument("--workdir", default="runs/example_cartpole")
    args = parser.parse_args()

    config = jaxwm.configs.get("ppo:cartpole", {"total_env_steps": args.steps,
                                                "eval.every": "never", "log.progress": False})
    summary = jaxwm.train(config, args.workdir)
    print(f"trained {summary['counters']['env_steps']:,} env steps; final evaluation return "
          f"{summary['eval/episodic_return']:.1f}")

    agent = jaxwm.load(args.workdir)  # the newest checkpoint, read-only
    print(agent)

    env = gym.make("CartPole-v1")  # any env with the same spaces: here gymnasium's own
    obs, _ = env.reset(seed=0)
    carry, total, done = None, 0.0, False
    while not done:
        action, carry = agent.act(obs, carry)  # the carry matters for memory backbones
        obs, reward, terminated, truncated, _ = env.step(int(action))
        total, done = total + reward, terminated or truncated
    print(f"one greedy gymnasium episode: return {total:.0f}")

    result = agent.evaluate(5)
    print(f"5 evaluation episodes: {result['eval/episodic_return']:.1f} "
          f"+- {result['eval/episodic_return_std']:.1f}")


if __name__ == "__main__":
    main()
