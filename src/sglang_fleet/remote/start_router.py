"""Start sglang-router with its keys from the environment (systemd's root-only EnvironmentFile)
instead of the command line, where every user of the host could read them.

    python -m sglang_fleet_remote.start_router launch --host 0.0.0.0 --port 30080 \\
        --worker-urls ...

``SGLANG_API_KEY`` is what clients send (``--api-key``); ``SGLANG_ROUTER_ADMIN_KEY`` is the only
key that opens ``/workers`` (``--control-plane-api-keys``, role admin: measured on 0.3.2, the
client key then gets 401 there). Runs on the router host with the router release's python
(``sglang_fleet.hostcode.program``); standard library plus sglang_router.
"""

import os
import sys
from collections.abc import MutableMapping


def key_flags(environ: MutableMapping[str, str]) -> list[str]:
    """The key flags for the router's parser, the keys removed from ``environ``."""
    key = environ.pop("SGLANG_API_KEY", "")
    admin = environ.pop("SGLANG_ROUTER_ADMIN_KEY", "")
    return [*(["--api-key", key] if key else []),
            *(["--control-plane-api-keys", f"sglang-fleet:sglang-fleet:admin:{admin}"]
              if admin else [])]


if __name__ == "__main__":
    from sglang_router.cli import main  # type: ignore[import-not-found]

    sys.exit(main([*sys.argv[1:], *key_flags(os.environ)]))
