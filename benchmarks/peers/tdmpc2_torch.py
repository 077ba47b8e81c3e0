"""TD-MPC2's own PyTorch code timed on this host: the peer of the JAX TD-MPC2 benchmark.

Run it with a Python that has torch (CPU build) and tensordict<=0.13, pointing ``--src`` at a
checkout of nicklashansen/tdmpc2 (kept outside this repository; its code is never committed
here). The reference pins torch 2.7.1 + tensordict 0.8.3; measured here with torch 2.13.0+cpu and
tensordict 0.13.0. tensordict 0.14 changed ``to_module()`` to keep nn.Parameter registrations, so
``layers.Ensemble``'s meta-device copy of a Q-net keeps meta Parameters and ``WorldModel.to()``
fails ('Cannot copy out of meta tensor'); 0.13 still swaps in plain tensors (with a
FutureWarning, silenced below), as the reference expects. Only
the agent is imported (``tdmpc2/tdmpc2.py`` and ``tdmpc2/common/``); hydra, omegaconf, torchrl
(the replay buffer) and the environments are not needed. The config is ``tdmpc2/config.yaml``'s
defaults with what ``common/parser.py:parse_cfg`` derives for one state-observation task
(bin_size, the MODEL_SIZE preset, multitask=False, task_dim=0), ``episode_length`` 500 (discount
0.99) and ``cfg.compile`` from ``--compile`` (the reference's default is true; eager here unless
asked). Random weights (the reference's init, seeded with cfg.seed), random inputs, no env.

Timed, per model size: ``update_s``, one ``agent.update`` (-> ``agent._update``, preceded by
``torch.compiler.cudagraph_mark_step_begin()`` as the reference does) on one fixed random batch
of the buffer's shapes (obs [H+1,B,obs_dim], action [H,B,A], reward [H,B,1], terminated zeros,
task None) handed out by a stand-in buffer, so sampling is excluded; ``plan_s``, one
``agent.act(obs, t0=False, eval_mode=False)`` for one env (MPPI: 6 iterations x 512 samples,
24 policy trajectories, horizon 3) after a t0=True call. Medians of ``--repeats`` calls after
``--warmup`` calls. Prints one JSON line.

Deviations from the reference, applied at run time (the checkout is not edited):
  * device: the reference hard-codes ``torch.device('cuda:0')`` in ``TDMPC2.__init__`` and
    ``RunningScale.__init__``. While the agent is built, the ``torch`` name in those two modules
    is a stand-in whose ``device('cuda...')`` gives the CPU device (everything else is torch
    itself); the real module is put back before anything is timed or compiled. With
    ``--device cuda`` nothing is swapped: the reference runs as written, on its ``cuda:0``.
  * ``--compile``: torch 2.13's inductor fails on CPU to compile both ``_update`` and ``_plan``
    (BackendCompilerFailed in the randperm-index pattern matcher, reached through
    ``WorldModel.Q``'s ``torch.randperm(num_q)[:2]``); the error goes into the JSON
    (``update_error``/``plan_error``). ``--skip-randperm-pattern`` disables inductor's
    ``misc_patterns`` (rewrites that only speed things up) so that compilation goes through:
    minutes per size on 2 cores, and the JSON says ``compile_workaround``.
  * ``capturable=True`` Adam: kept if torch accepts it for CPU tensors; otherwise the two
    optimizers' param groups get ``capturable=False`` and the JSON says so
    (``adam_capturable``).

    <venv>/bin/python benchmarks/peers/tdmpc2_torch.py --src ../tdmpc2 --threads 2 --sizes 1,5
    python3 benchmarks/peers/tdmpc2_torch.py --src ../tdmpc2 --device cuda   # on a GPU
"""
import argparse
import functools
import json
import os
import re
import sys
import time
import warnings


def _src():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--src", default=os.environ.get("TDMPC2_SRC", ""))
    known, _ = ap.parse_known_args()
    if not known.src:
        sys.exit("tdmpc2_torch.py: pass --src <checkout of nicklashansen/tdmpc2>.")
    src = os.path.abspath(known.src)
    pkg = os.path.join(src, "tdmpc2")  # the reference imports `common...` from here
    if not os.path.isfile(os.path.join(pkg, "tdmpc2.py")):
        sys.exit(f"tdmpc2_torch.py: no tdmpc2/tdmpc2.py under {src}.")
    return src, pkg


SRC, PKG = _src()
sys.path.insert(0, PKG)

import torch  # noqa: E402
from peer_timing import timed  # noqa: E402

# tensordict 0.13 warns (FutureWarning) that to_module() replaces nn.Parameters by plain tensors:
# that replacement is what the reference's Ensemble relies on (see the module docstring).
warnings.filterwarnings("ignore", message=r"TensorDict\.to_module\(\) is replacing")


def _yaml_scalar(v):
    v = v.split(" #")[0].strip()
    if v in ("???", "", "null", "~"):
        return None
    if v in ("true", "false"):
        return v == "true"
    for cast in (int, float):  # OmegaConf reads 10_000_000 as int and 3e-4 as float
        try:
            return cast(v.replace("_", ""))
        except ValueError:
            pass
    return v


def reference_config(model_size, obs_dim, action_dim, compile_):
    """config.yaml's flat `key: value` defaults, then parse_cfg's derived fields."""
    from common import MODEL_SIZE
    cfg = {}
    for line in open(os.path.join(PKG, "config.yaml")):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):\s*(.*)$", line.rstrip("\n"))
        if m and m.group(1) != "defaults":
            cfg[m.group(1)] = _yaml_scalar(m.group(2))
    cfg.update(
        task="cheetah-run", obs="state", model_size=model_size, compile=compile_,
        obs_shape={"state": (obs_dim,)}, action_dim=action_dim, episode_length=500,
        multitask=False, task_dim=0, tasks=["cheetah-run"], task_title="Cheetah Run",
        seed_steps=max(1000, 5 * 500),  # as train.py; unused by the timed paths
    )
    cfg["bin_size"] = (cfg["vmax"] - cfg["vmin"]) / (cfg["num_bins"] - 1)
    cfg.update(MODEL_SIZE[model_size])

    class Config:  # attribute access + .get, like parser.cfg_to_dataclass
        def get(self, k, default=None):
            return getattr(self, k, default)

    c = Config()
    c.__dict__.update(cfg)
    return c


class _CpuTorch:
    """The `torch` name seen by tdmpc2.py / common/scale.py while the agent is built."""
    _real_device = torch.device

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def device(spec=None, *a, **k):
        if isinstance(spec, str) and spec.startswith("cuda"):
            return torch.device("cpu")
        return torch.device(spec, *a, **k)


def build_agent(cfg, device):
    import common.scale
    import tdmpc2 as ref
    if device == "cuda":  # the reference's own device: nothing to swap
        agent = ref.TDMPC2(cfg)
        assert agent.device.type == "cuda"
        return agent
    mods = (ref, common.scale)
    for m in mods:
        m.torch = _CpuTorch()
    try:
        agent = ref.TDMPC2(cfg)
    finally:
        for m in mods:
            m.torch = torch
    assert agent.device.type == "cpu" and agent.scale.value.device.type == "cpu"
    return agent


class FixedBatch:
    """Stand-in for common.buffer.Buffer: sample() hands out one pre-drawn batch."""

    def __init__(self, cfg, gen, device):
        H, B = cfg.horizon, cfg.batch_size
        self.batch = tuple(t.to(device) for t in (
            torch.randn(H + 1, B, cfg.obs_shape["state"][0], generator=gen),
            torch.rand(H, B, cfg.action_dim, generator=gen) * 2 - 1,
            torch.randn(H, B, 1, generator=gen),
            torch.zeros(H, B, 1),
        )) + (None,)

    def sample(self):
        return self.batch


def _capturable_ok(agent):
    """Does torch's Adam accept capturable=True for CPU tensors? (one throwaway step)."""
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=1e-3, capturable=True)
    p.grad = torch.ones(2)
    try:
        opt.step()
        return True, None
    except Exception as e:  # noqa: BLE001
        for o in (agent.optim, agent.pi_optim):
            for g in o.param_groups:
                g["capturable"] = False
            o.defaults["capturable"] = False
        return False, f"{type(e).__name__}: {e}"[:300]


def run_size(size, args):
    torch.manual_seed(1)  # config.yaml seed
    cfg = reference_config(size, args.obs_dim, args.action_dim, args.compile)
    out = {}
    t = time.perf_counter()
    agent = build_agent(cfg, args.device)
    out["build_s"] = round(time.perf_counter() - t, 3)
    out["params"] = agent.model.total_params
    out["discount"] = agent.discount
    ok, err = (True, None) if args.device == "cuda" else _capturable_ok(agent)
    out["adam_capturable"] = ok
    if err:
        out["adam_capturable_error"] = err

    gen = torch.Generator().manual_seed(0)
    buf = FixedBatch(cfg, gen, args.device)
    obs = torch.randn(args.obs_dim, generator=gen).to(args.device)

    def update():
        info = agent.update(buf)
        float(info["total_loss"])  # reads one result: waits for the GPU's queue too
        return info

    def plan():
        a = agent.act(obs, t0=False, eval_mode=False)
        assert a.shape == (args.action_dim,) and bool(torch.isfinite(a).all()), a
        return a

    for name, fn, first in (("update", update, None),
                            ("plan", plan, lambda: agent.act(obs, t0=True, eval_mode=False))):
        try:
            t = time.perf_counter()
            if first is not None:
                first()
            fn()
            out[f"{name}_first_s"] = round(time.perf_counter() - t, 3)  # includes compile
            c0, w0 = time.process_time(), time.perf_counter()
            med, ts = timed(fn, args.warmup, args.repeats)
            # CPU seconds / wall seconds: ~threads when the cores were ours alone
            out[f"{name}_cpu_per_wall"] = round((time.process_time() - c0) / (time.perf_counter() - w0), 2)
            out[f"{name}_s"] = med
            out[f"{name}_all_s"] = [round(x, 5) for x in ts]
        except Exception as e:  # noqa: BLE001  (torch.compile on CPU may fail)
            if not args.compile:
                raise
            out[f"{name}_s"] = None
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:500]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the reference's own device (needs a CUDA build of torch)")
    ap.add_argument("--sizes", default="1,5")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls after the first")
    ap.add_argument("--obs-dim", type=int, default=17)
    ap.add_argument("--action-dim", type=int, default=6)
    ap.add_argument("--compile", action="store_true",
                    help="cfg.compile=true: torch.compile(mode='reduce-overhead') of _update and _plan")
    ap.add_argument("--skip-randperm-pattern", action="store_true",
                    help="with --compile: leave out inductor's misc_patterns (randperm-index rewrites), "
                         "whose matcher fails on WorldModel.Q's randperm(num_q)[:2] in torch 2.13 on CPU")
    args = ap.parse_args()
    if args.skip_randperm_pattern:
        import torch._inductor.fx_passes.misc_patterns as misc_patterns
        # joint_graph.lazy_init imports this name at call time; the patterns are speed-ups only
        misc_patterns._misc_patterns_init = functools.cache(lambda input_device=None: None)

    torch.set_num_threads(args.threads)
    out = {"threads": args.threads, "torch": torch.__version__, "compile": args.compile,
           "device": args.device}
    if args.device == "cuda":
        out["device_name"] = torch.cuda.get_device_name(0)
    if args.skip_randperm_pattern:
        out["compile_workaround"] = "inductor fx_passes.misc_patterns disabled"
    try:
        import tensordict
        out["tensordict"] = tensordict.__version__
    except Exception:  # noqa: BLE001
        pass
    out["torch_num_threads"] = torch.get_num_threads()
    out["obs_dim"], out["action_dim"] = args.obs_dim, args.action_dim
    out["loadavg_start"] = os.getloadavg()
    out["sizes"] = {}
    for s in [int(x) for x in args.sizes.split(",") if x]:
        out["sizes"][str(s)] = run_size(s, args)
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
