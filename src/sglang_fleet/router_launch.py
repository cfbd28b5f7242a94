"""Start sglang-router with its API key from the environment (systemd's root-only
EnvironmentFile) instead of the command line, where every user of the host could read it.

    python router_launch.py launch --host 0.0.0.0 --port 30080 --worker-urls ...

Runs on the router host with the router release's python; standard library plus sglang_router.
"""

import os
import sys

from sglang_router.cli import main  # type: ignore[import-not-found]

if __name__ == "__main__":
    key = os.environ.pop("SGLANG_API_KEY", "")
    sys.exit(main([*sys.argv[1:], *(["--api-key", key] if key else [])]))
