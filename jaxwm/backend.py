"""``jit`` with jaxwm's per-backend XLA compiler options.

Every top-level ``jax.jit`` in jaxwm goes through ``backend.jit``, so that the options below
apply to jaxwm's programs only (no process-wide ``XLA_FLAGS``) and are chosen in one place.

CPU: recent XLA:CPU hands convolutions to YNNPACK (``xla_cpu_experimental_ynn_fusion_type``
includes individual convolutions). On the 2-core machines this project targets, a Nature-CNN
gradient step is several times slower with YNNPACK's convolutions than with XLA's own (Eigen)
convolutions (``benchmarks/results/conv_grad_cpu.md``), so jaxwm keeps YNNPACK for dots only
(no slower than the default on the MLP workloads). A jax that does not
know the option (older or newer) compiles with its defaults, and ``compiler_options()`` says
so once with a warning.

Other backends: no options.

Float32 precision. jaxwm sets no matmul precision of its own: float32 matmuls and convolutions
run at JAX's ``jax_default_matmul_precision``, which unset means XLA's default for the backend.
That is exact float32 on CPU, TF32 on NVIDIA GPUs since Ampere (inputs rounded to a 10-bit
mantissa, ~5e-4 relative per product, several times faster) and one bfloat16 pass on TPU
(7-bit mantissa). Training keeps the fast default; to run a GPU at exact float32, set
``JAX_DEFAULT_MATMUL_PRECISION=float32`` in the environment (or ``jax.config.update``, or the
``jax.default_matmul_precision`` context manager). ``matmul_precision()`` is the setting in
force and ``float32_tolerance()`` the relative tolerance that comparisons of two mathematically
equal float32 computations should use under it; tests take their tolerances from it.
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


# Relative tolerance per effective arithmetic, for comparing two float32 computations of the same
# quantity (loop forms, fused vs unfused, sharded vs not). Exact float32: the programs differ
# only in summation order and fusion, i.e. roundings of 2**-24 (~6e-8) that add up over the
# terms of a sum and the steps of a loop; 1e-5 leaves room for ~150 of them. TF32 and bfloat16:
# the dominant error is the one rounding of each matmul/convolution input, 2**-11 (~5e-4) and
# 2**-8 (~4e-3), which does not grow with the sum's length; a few of those. (Two programs that
# feed a matmul bit-identical inputs round them identically and agree more closely than that;
# the tolerance is for inputs that differ by an ulp and round apart.)
TOLERANCE = {"float32": 1e-5, "tensorfloat32": 2e-3, "bfloat16": 2e-2}
_EXACT = {"highest", "float32", "F32_F32_F32", "F64_F64_F64", "BF16_BF16_F32_X6",
          "BF16_BF16_F32_X9", "TF32_TF32_F32_X3"}
_TF32 = {"high", "tensorfloat32", "TF32_TF32_F32", "BF16_BF16_F32_X3"}


def matmul_precision() -> str:
    """The float32 matmul/convolution precision in force: ``jax_default_matmul_precision``
    (a context manager's too), or ``"default"`` (XLA's per-backend default) when unset."""
    return jax.config.jax_default_matmul_precision or "default"


def float32_tolerance(precision: str | None = None, platform: str | None = None) -> float:
    """Relative tolerance for two mathematically equal float32 computations under
    ``precision`` (default: ``matmul_precision()``) on ``platform`` (default: the default
    backend): ``TOLERANCE["float32"]`` where float32 matmuls are exact (every setting on CPU,
    ``"highest"``/``"float32"`` anywhere), ``TOLERANCE["tensorfloat32"]`` for TF32 (a GPU's
    default, 10-bit mantissa), ``TOLERANCE["bfloat16"]`` otherwise (a TPU's default, and any
    preset not listed). It bounds the arithmetic's differences, not what a chaotic step does
    with them: an optimiser that divides by a tiny gradient scale (Adam's eps) can turn a TF32
    difference into one of order the learning rate, which no tolerance from here describes."""
    precision = precision or matmul_precision()
    platform = platform or jax.default_backend()
    if precision in _EXACT or (platform == "cpu" and precision in
                               ("default", "high", "bfloat16", "tensorfloat32")):
        return TOLERANCE["float32"]
    if precision in _TF32 or (platform == "gpu" and precision in ("default", "bfloat16")):
        return TOLERANCE["tensorfloat32"]
    return TOLERANCE["bfloat16"]


def jit(fun=None, **kwargs):
    """``jax.jit`` with ``compiler_options()``; usable as ``@jit`` or ``@jit(static_argnums=...)``."""
    if fun is None:
        return functools.partial(jit, **kwargs)
    options = compiler_options()
    if options:  # only then: an older jax.jit takes no compiler_options at all
        kwargs["compiler_options"] = options
    return jax.jit(fun, **kwargs)
