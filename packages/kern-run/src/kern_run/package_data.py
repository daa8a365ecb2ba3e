"""Where the cubins and the committed cuBLASLt pins are: in the installed kern-run wheel (`kern_run/kernels/`,
`kern_run/algos/`, put there by packages/kern-run/hatch_build.py), else in the kern checkout this package runs
from (`kernels/`, `manifests/algos/` at the repository's top level: an editable install, or PYTHONPATH on the GPU
machine). docs/kernels.md "Cubins in the wheel".
"""

from __future__ import annotations

from pathlib import Path

from .errors import KernelsError

_PACKAGE = Path(__file__).resolve().parent


def _checkout_root() -> Path | None:
    """The kern checkout holding this source file (packages/kern-run/src/kern_run/), when it is one."""
    root = _PACKAGE.parents[3] if len(_PACKAGE.parents) > 3 else None
    if root is not None and (root / "packages" / "kern-run").is_dir() and (root / "kernels").is_dir():
        return root
    return None


def kernels_dir() -> Path:
    """The kernels directory (`<module>-<sha12>.cubin` files and kernels.json): the wheel's `kern_run/kernels/`,
    else the checkout's `kernels/`. Raises KernelsError naming both places when neither holds a kernels.json."""
    packaged = _PACKAGE / "kernels"
    if (packaged / "kernels.json").is_file():
        return packaged
    root = _checkout_root()
    if root is not None and (root / "kernels" / "kernels.json").is_file():
        return root / "kernels"
    raise KernelsError(f"no kernels directory: neither {packaged}/kernels.json (the kern-run wheel's) nor a kern "
                       "checkout's kernels/kernels.json: pass --kernels DIR")


def committed_pins_dir() -> Path | None:
    """The directory of the committed cuBLASLt pins files (`h200.json`, ...): the wheel's `kern_run/algos/`, else
    the checkout's `manifests/algos/`; None when there is neither."""
    packaged = _PACKAGE / "algos"
    if packaged.is_dir():
        return packaged
    root = _checkout_root()
    if root is not None and (root / "manifests" / "algos").is_dir():
        return root / "manifests" / "algos"
    return None
