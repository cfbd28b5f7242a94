"""One gRPC-mode server's ``HealthCheck``, asked on its own host: its port answers the routers
and the host alone (docs/security.md), so ``status`` asks from there, over SSH, with the serving
release's Python (whose environment has grpcio and the servicer's stubs).

    python -m sglang_fleet.stages.gate.host.grpc_health 127.0.0.1:30000
    # HEALTH {"healthy": true, "why": "Health check passed"}
"""

from __future__ import annotations

import json
import sys

from .gate_grpc import Scheduler

MARK = "HEALTH"
TIMEOUT = 10  # seconds: status's own bound on a server's answer


def main(argv: list[str] | None = None) -> int:
    [target] = argv if argv is not None else sys.argv[1:]
    try:
        with Scheduler(target) as server:
            healthy, why = server.health(TIMEOUT)
    except Exception as exc:  # whatever the channel raises: status says it, as a row
        healthy, why = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(f"{MARK} {json.dumps({'healthy': healthy, 'why': why})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
