#!/usr/bin/env bash
# Set up a fresh environment (uv workspace, all four packages + dev tools) and run the test suite.
# GPU tests skip cleanly without a device; KERN_REQUIRE_GPU=1 makes that an error instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v uv >/dev/null 2>&1; then
    # pip into the current environment; where that is refused (a PEP 668 "externally managed" system Python),
    # into a private venv whose bin/ goes on PATH for this script only
    if ! python3 -m pip install -q uv 2>/dev/null; then
        boot="${XDG_CACHE_HOME:-$HOME/.cache}/kern-uv"
        python3 -m venv "$boot" || { echo "tools/test.sh: no uv, pip refused, and python3 -m venv failed (install python3-venv or uv)" >&2; exit 1; }
        "$boot/bin/pip" install -q uv
        export PATH="$boot/bin:$PATH"
    fi
    command -v uv >/dev/null 2>&1 || export PATH="$(python3 -m site --user-base)/bin:$PATH"
fi
uv sync --all-packages --frozen
# pytest exits 5 when nothing was collected; that is a failure here, as is any failed test.
uv run --frozen pytest "$@"
