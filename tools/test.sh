#!/usr/bin/env bash
# Set up a fresh environment (uv workspace, all four packages + dev tools) and run the test suite.
# GPU tests skip cleanly without a device; KERN_REQUIRE_GPU=1 makes that an error instead.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
uv sync --all-packages --frozen
# pytest exits 5 when nothing was collected; that is a failure here, as is any failed test.
uv run --frozen pytest "$@"
