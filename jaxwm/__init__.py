"""jaxwm: world-model reinforcement learning as pure JAX functions driven by one thin loop.

See docs/architecture.md for how the pieces fit.
"""

__version__ = "0.1.0"
