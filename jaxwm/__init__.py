"""jaxwm: world-model reinforcement learning as pure JAX functions driven by one thin loop.

The public surface (docs/architecture.md shows how the pieces fit):

    import jaxwm

    config = jaxwm.configs.get("ppo:cartpole", {"total_env_steps": 50_000})
    summary = jaxwm.train(config, "runs/cartpole")     # the final metrics
    agent = jaxwm.load("runs/cartpole")                # newest checkpoint, read-only
    action, carry = agent.act(obs)                     # one observation or a batch
    result = agent.evaluate(10, video=True)            # {"eval/episodic_return": ...}
    jaxwm.report.make_report(["runs/"], "report/")     # tables and figures over seeds

``jaxwm.configs``: the packaged configs (``algo:variant``) and what their settings mean;
``jaxwm.train``: validate, make missing inputs (a dataset), build and train;
``jaxwm.load``: a trained run as a ``TrainedAgent`` (``act``, ``evaluate``, and
``world_model.imagine`` for model-based systems); ``jaxwm.report``: rliable reports.
Each is imported on first use, so ``import jaxwm`` stays light.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["configs", "train", "load", "report", "TrainedAgent"]

_LAZY = {"configs": ("jaxwm.configs", None), "train": ("jaxwm.train", None),
         "report": ("jaxwm.report", None), "load": ("jaxwm.trained", "load"),
         "TrainedAgent": ("jaxwm.trained", "TrainedAgent")}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'jaxwm' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    return getattr(value, attribute) if attribute else value
