"""Start the router (smg or sglang-router) with its keys from the environment (systemd's
root-only EnvironmentFile) instead of the command line, where every user of the host could
read them.

    python -m sglang_fleet.stages.router.host.start_router \
        smg.cli launch --host 0.0.0.0 --port 30080 ...

The first word names the package's CLI (``smg.cli`` or ``sglang_router.cli``: both take
``main(argv)`` with ``launch`` first, smg/cli.py and sglang_router/cli.py).
``SGLANG_API_KEY`` is what clients send (``--api-key``); ``SGLANG_ROUTER_ADMIN_KEY`` is the only
key that opens ``/workers`` (``--control-plane-api-keys``, role admin: measured on smg 1.13.0
and sglang-router 0.3.2, the client key then gets 401 there). Runs on the router host with the
router release's python (``sglang_fleet.ops.host_programs.program``); standard library plus
the router.
"""

import importlib
import os
import sys
from collections.abc import MutableMapping

CLIS = ("smg.cli", "sglang_router.cli")


def key_flags(environ: MutableMapping[str, str]) -> list[str]:
    """The key flags for the router's parser, the keys removed from ``environ``."""
    key = environ.pop("SGLANG_API_KEY", "")
    admin = environ.pop("SGLANG_ROUTER_ADMIN_KEY", "")
    return [*(["--api-key", key] if key else []),
            *(["--control-plane-api-keys", f"sglang-fleet:sglang-fleet:admin:{admin}"]
              if admin else [])]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in CLIS:
        sys.exit(f"start_router: the first word must be one of {', '.join(CLIS)}")
    main = importlib.import_module(sys.argv[1]).main
    sys.exit(main([*sys.argv[2:], *key_flags(os.environ)]))
