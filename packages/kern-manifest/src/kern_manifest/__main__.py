"""`python -m kern_manifest ...`: the `kern-manifest` command line (`kern_manifest.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
