"""A gRPC-mode server's ``HealthCheck``, asked on its host (``stages/gate/host/grpc_health.py``):
its port answers the routers and the host alone, so the operator's machine asks through SSH.

    host.get_fact(GrpcHealth, target="127.0.0.1:30000")   # (True, 'Health check passed')
"""

from __future__ import annotations

import json
import re
import shlex

from pyinfra.api.facts import FactBase

from sglang_fleet.ops.host_programs import program
from sglang_fleet.paths import CURRENT

_TARGET = re.compile(r"[A-Za-z0-9.:\[\]-]{1,300}")


class GrpcHealth(FactBase[tuple[bool, str] | None]):
    """``(healthy, why)`` of the server at ``target`` (HOST:PORT), asked with the serving
    release's Python; None when the program said nothing (no release, no host program)."""

    def command(self, target: str) -> str:
        if not _TARGET.fullmatch(target):
            raise ValueError(f"not a HOST:PORT: {target!r}")
        argv = program(f"{CURRENT}/bin/python", "sglang_fleet.stages.gate.host.grpc_health", target)
        return f"{shlex.join(argv)} 2>&1 || true"

    def process(self, output: list[str]) -> tuple[bool, str] | None:
        for line in reversed(output):
            if line.startswith("HEALTH "):
                try:
                    found = json.loads(line.removeprefix("HEALTH "))
                    return bool(found["healthy"]), str(found["why"])
                except (ValueError, KeyError, TypeError):
                    return None
        return None
