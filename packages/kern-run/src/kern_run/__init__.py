"""kern-run: the `kern` command line (`kern_run.cli`), driving kern-runtime through the Qwen3 caller contract
(docs/caller.md)."""

__version__ = "0.1.0"  # the one source of the version: [tool.hatch.version] reads it, the kern pins must equal it
__all__ = ["__version__"]
