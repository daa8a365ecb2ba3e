"""The CUDA layer: driver calls, memory, modules, launches, graphs, tensor maps, cuBLASLt, NCCL, SASS scans.

Nothing here imports a CUDA library at import time (each binding is imported on first use). The names in
`__all__` are the runtime's public low-level API for tools (kern_runtime.gemm_pins, tools/sass_paths.py,
bench/park_wake.py): the one driver entry point `call` (raises DriverError), the cuBLASLt GEMM mapping and
planner, and the SASS reader. Everything else in this package is internal.
"""

from . import sass
from .blas import ALGO_KEYS, WORKSPACE_BYTES, Blas, algo_config, alignment_bytes, blas_call, gemm_call
from .driver import call, cu

__all__ = ["ALGO_KEYS", "WORKSPACE_BYTES", "Blas", "algo_config", "alignment_bytes", "blas_call", "call", "cu", "gemm_call",
           "sass"]
