"""``jit`` with jaxwm's per-backend XLA compiler options.

Every top-level ``jax.jit`` in jaxwm goes through ``backend.jit``, so that the options below
apply to jaxwm's programs only (no process-wide ``XLA_FLAGS``) and are chosen in one place.

CPU: recent XLA:CPU hands convolutions to YNNPACK (``xla_cpu_experimental_ynn_fusion_type``
includes individual convolutions). On the 2-core machines this project targets, a Nature-CNN
gradient step at batch 256 took 0.385 s with YNNPACK's convolutions and 0.113 s with XLA's own
(Eigen) convolutions (``benchmarks/results/conv_grad_cpu.md``), so jaxwm keeps YNNPACK for
dots only (measured no slower than the default on the MLP workloads). A jax that does not
know the option (older or newer) compiles with its defaults, and ``compiler_options()`` says
so once with a warning.

Other backends: no options.
"""

from __future__ import annotations

import functools
import warnings

import jax

CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


@functools.cache
def compiler_options() -> dict[str, str] | None:
    """The options for the default backend, or None where there are none (or not supported)."""
    if jax.default_backend() != "cpu":
        return None
    try:
        jax.jit(lambda x: x + 1, compiler_options=CPU_OPTIONS)(0.0).block_until_ready()
    except Exception as err:  # an option this jaxlib does not know: compile with its defaults
        warnings.warn(f"jaxwm: XLA:CPU rejected {CPU_OPTIONS} ({err}); compiling with the "
                      "defaults, so convolutions may be slower.", stacklevel=2)
        return None
    return dict(CPU_OPTIONS)


def jit(fun=None, **kwargs):
    """``jax.jit`` with ``compiler_options()``; usable as ``@jit`` or ``@jit(static_argnums=...)``."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    options = compiler_options()
    if options:  # only then: an older jax.jit takes no compiler_options at all
        kwargs["compiler_options"] = options
    return jax.jit(fun, **kwargs)
