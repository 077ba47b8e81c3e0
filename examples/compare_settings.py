"""Compare two settings over seeds: PPO on CartPole with two learning rates, three seeds each
in one process (``num_seeds``), then an rliable report (IQM, bootstrap CIs, P(X > Y)).

    python examples/compare_settings.py                  # ~100k steps per seed, minutes
    python examples/compare_settings.py --steps 2048     # seconds (what CI runs)
"""

import argparse
import os

import jaxwm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default="runs/example_compare")
    args = parser.parse_args()

    for learning_rate in (2.5e-4, 1e-3):
        config = jaxwm.configs.get("ppo:cartpole", {
            "total_env_steps": args.steps, "num_seeds": args.seeds, "log.progress": False,
            "ppo.learning_rate": learning_rate, "eval.every": "never"})
        summary = jaxwm.train(config, os.path.join(args.out, f"lr_{learning_rate:g}"))
        print(f"learning rate {learning_rate:g}: final return "
              f"{summary['eval/episodic_return']:.1f} (mean of {args.seeds} seeds)")

    report = jaxwm.report.make_report([args.out], os.path.join(args.out, "report"),
                                      ci="auto", reps=500)
    print(report.markdown)


if __name__ == "__main__":
    main()
