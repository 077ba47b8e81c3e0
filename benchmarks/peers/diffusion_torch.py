"""Diffusion Policy's own PyTorch code timed on this host: the peer of benchmarks/diffusion.py.

Run it with a Python that has torch, einops and diffusers, pointing ``--src`` at a checkout of
real-stanford/diffusion_policy (kept outside this repository; its code is never committed
here). Only ``diffusion_policy/model/diffusion/`` is imported (``ConditionalUnet1D``); the
training step and the sampler are written here exactly as the reference's
``DiffusionUnetLowdimPolicy`` does them (``compute_loss``: noise, random timesteps,
``scheduler.add_noise``, ``F.mse_loss`` on the noise; ``conditional_sample``: the scheduler's
timesteps, the model, ``scheduler.step``), with its lowdim workspace's settings: down dims
per size, step embedding, kernel 5, 8 groups, ``cond_predict_scale=True``,
``obs_as_global_cond``, DDPM with 100 ``squaredcos_cap_v2`` steps, epsilon prediction,
``clip_sample``, AdamW lr 1e-4 (0.95, 0.999), weight decay 1e-6, batch 256. The EMA update
(the reference's ``EMAModel.step`` over every parameter) is included in the train step as
the workspace does after each optimiser step. Random weights and data, no env.

Timed per size: ``train_s`` (one step), ``ddpm100_s`` and ``ddim10_s`` (one chunk for one
observation history, under ``torch.no_grad``). Medians of ``--repeats`` after ``--warmup``.
Prints one JSON line.

    <venv>/bin/python benchmarks/peers/diffusion_torch.py --src ../diffusion_policy --threads 2
"""
import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F  # noqa: N812
from peer_timing import timed

SIZES = {"full": ([256, 512, 1024], 256), "small": ([64, 128, 256], 64)}


def run_size(size, args, ConditionalUnet1D, DDPMScheduler, DDIMScheduler):  # noqa: N803
    torch.manual_seed(0)
    dims, embed = SIZES[size]
    horizon, to, obs_dim, action_dim, batch = 16, 2, args.obs_dim, args.action_dim, 256
    model = ConditionalUnet1D(input_dim=action_dim, global_cond_dim=obs_dim * to,
                              diffusion_step_embed_dim=embed, down_dims=dims, kernel_size=5,
                              n_groups=8, cond_predict_scale=True)
    ema = copy.deepcopy(model).requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.95, 0.999),
                            weight_decay=1e-6)
    kwargs = dict(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2", clip_sample=True,
                  prediction_type="epsilon")
    ddpm = DDPMScheduler(variance_type="fixed_small", **kwargs)
    ddim = DDIMScheduler(set_alpha_to_one=True, steps_offset=0, **kwargs)
    trajectory = torch.rand(batch, horizon, action_dim) * 2 - 1
    cond = torch.randn(batch, obs_dim * to)

    def train():
        noise = torch.randn(trajectory.shape)
        t = torch.randint(0, 100, (batch,)).long()
        noisy = ddpm.add_noise(trajectory, noise, t)
        loss = F.mse_loss(model(noisy, t, global_cond=cond), noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # EMAModel.step: decay * ema + (1 - decay) * param
            for e, p in zip(ema.parameters(), model.parameters(), strict=True):
                e.mul_(0.999).add_(p, alpha=0.001)
        return float(loss)

    one_cond = torch.randn(1, obs_dim * to)

    def sample(scheduler, steps):
        scheduler.set_timesteps(steps)
        x = torch.randn(1, horizon, action_dim)
        with torch.no_grad():
            for t in scheduler.timesteps:
                x = scheduler.step(model(x, t, global_cond=one_cond), t, x).prev_sample
        return x

    out = {"params": sum(p.numel() for p in model.parameters())}
    out["train_s"] = timed(train, args.warmup, args.repeats)[0]
    out["ddpm100_s"] = timed(lambda: sample(ddpm, 100), 1, args.repeats)[0]
    out["ddim10_s"] = timed(lambda: sample(ddim, 10), args.warmup, args.repeats)[0]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=os.environ.get("DIFFUSION_POLICY_SRC", ""))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sizes", default="full,small")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--obs-dim", type=int, default=20)
    ap.add_argument("--action-dim", type=int, default=2)
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.src, "diffusion_policy", "model", "diffusion",
                                       "conditional_unet1d.py")):
        sys.exit(f"diffusion_torch.py: no diffusion_policy/model/diffusion under {args.src!r}.")
    sys.path.insert(0, args.src)
    import diffusers
    from diffusers import DDIMScheduler, DDPMScheduler
    from diffusion_policy.model.diffusion.conditional_unet1d import ConditionalUnet1D

    torch.set_num_threads(args.threads)
    out = {"threads": args.threads, "torch": torch.__version__,
           "diffusers": diffusers.__version__, "loadavg_start": os.getloadavg(), "sizes": {}}
    for size in args.sizes.split(","):
        out["sizes"][size] = run_size(size, args, ConditionalUnet1D, DDPMScheduler,
                                      DDIMScheduler)
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
