"""`kern serve`'s app over the fake engine on real uvicorn, for the SIGTERM test (test_sigterm.py).

    python tests/serve/fake_server.py PORT     (the script's folder is on sys.path: serve_testutil imports)
"""

from __future__ import annotations

import sys

import uvicorn

from serve_testutil import served


def main() -> None:
    port = int(sys.argv[1])
    s = served(step_s=0.01)
    config = uvicorn.Config(s.app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5,
                            lifespan="on")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
