"""`python -m kern_run ...`: the `kern` command line (`kern_run.cli.app`), named `kern` in its usage lines."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="kern")
