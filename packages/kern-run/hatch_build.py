"""The kern-run build hook: the cubins `kernels/kernels.json` names (and kernels.json itself), and the committed
cuBLASLt pins `manifests/algos/*.json`, as package data (docs/kernels.md "Cubins in the wheel").

In the checkout they stay where they are, at the repository's top level (the GPU machine copies the tree; no
second copy in git): the sdist carries them as `kernels/` and `algos/` beside this file, and the wheel, built from
the sdist or straight from the checkout, as `kern_run/kernels/` and `kern_run/algos/`. Exactly the files
kernels.json names go in, each checked against the sha256 it pins there (a stale or restored cubin in kernels/
stays out); the runtime checks them again at load. Editable installs take nothing: `kern_run.kernels_dir()`
finds the checkout's kernels/ then.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _source(root: Path, name: str, checkout: str) -> Path:
    """`root/name` in an unpacked sdist, else the checkout's `checkout` directory (two levels above root)."""
    local = root / name
    return local if local.is_dir() else root.parents[1] / checkout


def kernel_files(kernels: Path) -> list[str]:
    """kernels.json and the cubin file names its modules give, each cubin checked against its pinned sha256.
    Raises ValueError naming the file."""
    index = kernels / "kernels.json"
    doc = json.loads(index.read_text(encoding="utf-8"))
    names = ["kernels.json"]
    for module, rec in sorted(doc["modules"].items()):
        path = kernels / rec["file"]
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != rec["sha256"]:
            raise ValueError(f"{path}: sha256 {digest}, but {index} pins {rec['sha256']} for module {module!r}")
        names.append(rec["file"])
    return names


class KernelsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            return
        root = Path(self.root)
        prefix = "kern_run/" if self.target_name == "wheel" else ""
        kernels = _source(root, "kernels", "kernels")
        for name in kernel_files(kernels):
            build_data["force_include"][str(kernels / name)] = f"{prefix}kernels/{name}"
        algos = _source(root, "algos", "manifests/algos")
        for path in sorted(algos.glob("*.json")):
            build_data["force_include"][str(path)] = f"{prefix}algos/{path.name}"
