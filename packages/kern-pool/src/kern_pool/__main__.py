"""`python -m kern_pool ...`: the `kern-pool` command line (`kern_pool.cli.main`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
