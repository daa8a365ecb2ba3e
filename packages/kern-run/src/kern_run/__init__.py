"""kern-run: the `kern` command line (`kern_run.cli`), driving kern-runtime through the Qwen3 caller contract
(docs/caller.md). `kernels_dir()`: the cubins this package runs (the wheel's, or the checkout's kernels/)."""

from pathlib import Path

__version__ = "0.1.0"  # the one source of the version: [tool.hatch.version] reads it, the kern pins must equal it


def kernels_dir() -> "Path":
    """The kernels directory: kern_run.package_data.kernels_dir (imported on call, so `import kern_run` stays
    light). Raises kern_run.errors.KernelsError when there is none."""
    from .package_data import kernels_dir as find

    return find()


__all__ = ["__version__", "kernels_dir"]
