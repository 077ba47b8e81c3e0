"""MBARC's own PyTorch code timed on this host: the peer of ``benchmarks/simple.py``.

Run it with a Python that has torch (CPU or CUDA) and MBARC's dependencies, pointing ``--src`` at a
checkout of thomas-schillaci/mbarc_atari (kept outside this repository; its code is never
committed here). MBARC's README pins gym 0.15, openai/baselines and opencv; none of them does
work on the timed paths, so ``--shims benchmarks/peers/mbarc_shims`` puts import-level
stand-ins for them first on the path (gym's ``Env``/``spaces``, baselines' ``VecEnv`` and
``VecEnvWrapper``, a no-op ``cv2``; see that folder's README). Random weights, random uint8 frames, no
Atari. Prints one JSON line (``train_step_s``, ``forward16_s``, ``sim_rollout_16x50_s``, ...).

    <venv>/bin/python benchmarks/peers/mbarc_torch.py --src ../mbarc_atari \
        --shims benchmarks/peers/mbarc_shims --threads 2
    python3 benchmarks/peers/mbarc_torch.py --src ../mbarc_atari \
        --shims benchmarks/peers/mbarc_shims --device cuda        # on a GPU
"""
import argparse
import json
import os
import re
import statistics
import sys
import time
from time import strftime  # noqa: F401  (used by the exec'd add_argument lines)


def _paths():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--src", default=os.environ.get("MBARC_SRC", ""))
    ap.add_argument("--shims", default="")
    known, _ = ap.parse_known_args()
    if not known.src:
        sys.exit("mbarc_torch.py: pass --src <checkout of thomas-schillaci/mbarc_atari>.")
    src = os.path.abspath(known.src)
    paths = [src, os.path.join(src, "atari_utils"), os.path.join(src, "a2c_ppo_acktr")]
    return src, ([os.path.abspath(known.shims)] if known.shims else []) + paths


SRC, PATHS = _paths()
# PYTHONPATH too, so the forkserver workers of the simulated env can import the same modules.
os.environ["PYTHONPATH"] = os.pathsep.join(PATHS + [os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path[:0] = PATHS

import numpy as np  # noqa: E402
import torch  # noqa: E402


def reference_config(device):
    """Parser built from the add_argument lines of src/mbarc/__main__.py, default flags."""
    text = open(os.path.join(SRC, 'mbarc', '__main__.py')).read()
    parser = argparse.ArgumentParser()
    lines = re.findall(r"^\s*(parser\.add_argument\(.*\))\s*$", text, flags=re.M)
    for line in lines:
        exec(line, {'parser': parser, 'strftime': strftime})
    config = parser.parse_args([])
    config.device = device  # README: `--device cpu`; its default is cuda
    # Deviation (type only): default --stacking is the float 4; torch>=2 rejects float sizes.
    config.stacking = int(config.stacking)
    return config


class FakeRealEnv:
    """Only the `.buffer` the trainer reads: [obs, action, reward, new_obs, done, value] as
    VecRecorderWrapper.add_interaction stores them (uint8 tensors, float32 value)."""

    def __init__(self, config, n_action, length, gen):
        c, h, w = config.frame_shape
        s = config.stacking
        self.buffer = []
        for _ in range(length):
            obs = torch.randint(0, 256, (c * s, h, w), dtype=torch.uint8, generator=gen)
            a = int(torch.randint(n_action, (1,), generator=gen))
            action = torch.zeros(n_action, dtype=torch.uint8)
            action[a] = 1
            reward = torch.tensor(int(torch.randint(1, 3, (1,), generator=gen)), dtype=torch.uint8)
            new_obs = torch.randint(0, 256, (c, h, w), dtype=torch.uint8, generator=gen)
            done = torch.tensor(0, dtype=torch.uint8)
            value = torch.tensor(float(torch.rand((1,), generator=gen)), dtype=torch.float32)
            self.buffer.append([obs, action, reward, new_obs, done, value])


class _Stop(Exception):
    pass


def med(xs):
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--src')
    ap.add_argument('--shims', default='')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--device', default='cpu', choices=['cpu', 'cuda'],
                    help="MBARC's --device (cuda: the GPU, synchronised before every timestamp)")
    ap.add_argument('--train-steps', type=int, default=8, help='measured optimizer steps after 2 warm-up')
    ap.add_argument('--fwd-reps', type=int, default=5)
    ap.add_argument('--sim-reps', type=int, default=2, help='measured agent.learn() calls after 1 warm-up')
    ap.add_argument('--skip-sim', action='store_true')
    args = ap.parse_args()
    assert 2 + args.train_steps <= 50, 'one train_world_model outer iteration = 50 optimizer steps'

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.multiprocessing.set_sharing_strategy('file_system')  # as __main__ does

    import gym
    from atari_utils.ppo_wrapper import PPO
    from atari_utils.utils import one_hot_encode
    from mbarc.next_frame_predictor import NextFramePredictor
    from mbarc.subproc_vec_env import make_simulated_env
    from mbarc.trainer import Trainer

    config = reference_config(args.device)
    sync = torch.cuda.synchronize if args.device == 'cuda' else (lambda: None)
    n_action = 3  # FreewayNoFrameskip-v4 minimal action set: NOOP, UP, DOWN
    action_space = gym.spaces.Discrete(n_action)
    out = {'threads': args.threads, 'torch': torch.__version__, 'torch_num_threads': torch.get_num_threads(),
           'device': torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu',
           'loadavg_start': os.getloadavg()}
    # main-process CPU seconds / wall seconds per phase: ~threads when the cores are ours alone
    def cpu_ratio(c0, w0):
        return round((time.process_time() - c0) / (time.perf_counter() - w0), 2)

    # --- model + trainer exactly as SimPLe.__init__ ---
    model = NextFramePredictor(config, n_action).to(config.device)
    trainer = Trainer(model, config)
    wm_params = sum(p.numel() for p in model.parameters())
    rew_params = sum(p.numel() for p in model.reward_estimator.parameters())
    out['params'] = wm_params + rew_params
    out['params_world_model_optimizer'] = wm_params  # what trainer.optimizer (Adafactor) updates
    out['params_reward_estimator_sealed'] = rew_params  # hidden by ParameterSealer, own optimizer

    # --- (a) world-model training: real Trainer.train_world_model, epoch=1 (epsilon=0) ---
    gen = torch.Generator().manual_seed(0)
    env = FakeRealEnv(config, n_action, 200, gen)
    need = 2 + args.train_steps
    stamps, opt_times = [], []
    orig_step = trainer.optimizer.step

    def timed_step(*a, **k):
        sync()  # the backward pass before the step is not the step's
        t = time.perf_counter()
        r = orig_step(*a, **k)
        sync()
        now = time.perf_counter()
        opt_times.append(now - t)
        stamps.append(now)
        if len(stamps) >= need:
            raise _Stop
        return r

    trainer.optimizer.step = timed_step
    c0 = time.process_time()
    sync()
    t0 = time.perf_counter()
    try:
        trainer.train_world_model(1, env, steps=config.rollout_length)
    except _Stop:
        pass
    trainer.optimizer.step = orig_step
    out['train_cpu_per_wall'] = cpu_ratio(c0, t0)
    durs = np.diff([t0] + stamps).tolist()
    step_s = med(durs[2:])
    out['train_batch'] = config.batch_size
    out['train_warmup_s'] = [round(x, 4) for x in durs[:2]]
    out['train_step_s'] = step_s
    out['train_steps_measured'] = len(durs[2:])
    out['train_step_all_s'] = [round(x, 4) for x in durs[2:]]
    out['adafactor_step_s'] = med(opt_times[2:])
    out['train_frames_per_s'] = config.batch_size / step_s  # one frame per sample per step
    out['train_50step_rollout_est_s'] = 50 * step_s  # one trange iteration of train_world_model

    # --- (b) simulated-env step compute at 16 agents (body of SubprocVecEnv.step_async) ---
    agents = config.agents
    c = config.frame_shape[0]
    frames = torch.randint(0, 256, (agents, c * config.stacking, *config.frame_shape[1:]),
                           dtype=torch.uint8, generator=gen).float().to(config.device) / 255
    np_actions = np.random.RandomState(0).randint(n_action, size=(agents, 1))

    def sim_step(frames):
        actions = one_hot_encode(np_actions, n_action, dtype=torch.float32).to(config.device)
        model.eval()
        with torch.no_grad():
            new_states, rewards, values = model(frames, actions)
        new_states = torch.argmax(new_states, dim=1)
        frames = torch.cat((frames[:, c:], new_states.float() / 255), dim=1)
        _ = (frames * 255).byte().detach().cpu()
        _ = (torch.argmax(rewards, dim=1).detach().cpu() - 1).numpy().astype('float')
        return frames

    fwd = []
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(1 + args.fwd_reps):
        t = time.perf_counter()
        frames = sim_step(frames)
        sync()
        fwd.append(time.perf_counter() - t)
    out['forward16_cpu_per_wall'] = cpu_ratio(c0, w0)
    out['forward16_warmup_s'] = round(fwd[0], 4)
    out['forward16_s'] = med(fwd[1:])
    out['forward16_reps'] = len(fwd[1:])

    # --- (c) simulated env (16 forkserver subprocess envs) + PPO policy, as train_agent_sim_env ---
    if not args.skip_sim:
        t = time.perf_counter()
        simulated_env = make_simulated_env(config, model, action_space)
        agent = PPO(simulated_env, config.device, gamma=config.ppo_gamma,
                    num_steps=config.rollout_length, num_mini_batch=5, lr=config.ppo_lr)
        out['sim_env_setup_s'] = time.perf_counter() - t
        out['policy_params'] = sum(p.numel() for p in agent.actor_critic.parameters())
        upd = []
        orig_update = agent.agent.update

        def timed_update(rollouts):
            sync()  # the rollout's last GPU work belongs to the rollout
            t = time.perf_counter()
            r = orig_update(rollouts)
            sync()
            upd.append(time.perf_counter() - t)
            return r

        agent.agent.update = timed_update
        agent.set_env(simulated_env)
        shape = simulated_env.observation_space.shape
        restart, learn = [], []
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(1 + args.sim_reps):
            t = time.perf_counter()
            for j in range(config.agents):
                initial_frames = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
                simulated_env.env_method('restart', initial_frames, indices=j)
            restart.append(time.perf_counter() - t)
            t = time.perf_counter()
            agent.learn(config.rollout_length * config.agents, verbose=False, score_training=False,
                        logger=None, use_ppo_lr_decay=config.use_ppo_lr_decay)
            sync()
            learn.append(time.perf_counter() - t)
        out['sim_main_cpu_per_wall'] = cpu_ratio(c0, w0)
        simulated_env.close()
        rollout = [total - u for total, u in zip(learn, upd, strict=True)]
        out['sim_restart16_s'] = med(restart[1:])
        out['sim_learn_warmup_s'] = round(learn[0], 4)
        out['sim_learn_total_s'] = med(learn[1:])
        out['sim_rollout_16x50_s'] = med(rollout[1:])  # reset + 50 x (policy act, env.step, insert) + GAE
        out['sim_rollout_all_s'] = [round(x, 4) for x in rollout[1:]]
        out['ppo_update_s'] = med(upd[1:])  # 4 epochs x 5 minibatches of 160
        out['sim_reps'] = len(learn[1:])
        out['sim_mode'] = 'SubprocVecEnv (forkserver, 16 workers), real PPO.learn'

    out['loadavg_end'] = os.getloadavg()
    print(json.dumps(out))


if __name__ == '__main__':
    main()
