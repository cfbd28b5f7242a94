"""Whether hosts answer over SSH (pyinfra's connector, as a deploy connects), and the
connection's own error when one does not: ``status`` and a roll name an unreachable host by it
rather than by what failed after it.

    unreachable(plan_hosts)   # {"b200-02": "SSH to b200-02 (10.0.0.12) failed: Could not ..."}
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pyinfra.api.host import Host

from sglang_fleet import hostconfig


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The error's first line (its type when it says nothing), at most ``limit`` characters."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def connect_error(host: Host) -> str | None:
    """None once ``host`` is connected, else why it could not be (the first line)."""
    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except Exception as exc:  # whatever the SSH layer raises is the answer here
        return first_line(exc)
    return None


def ssh_address(host: Host) -> str:
    """Where pyinfra connects: ``ssh_hostname``, else the host's name."""
    return hostconfig.of(host).ssh_hostname or host.name


def unreachable(hosts: Sequence[Host]) -> dict[str, str]:
    """Each of ``hosts`` that does not answer over SSH, with what the connection said; all at
    once. Those that answer are disconnected again (the deploys connect on their own)."""
    if not hosts:
        return {}
    if getattr(hosts[0], "state", None) is None:  # a host connects through a state
        from pyinfra.api.config import Config
        from pyinfra.api.state import State

        State(hosts[0].inventory, Config())  # type: ignore[no-untyped-call]

    def probe(host: Host) -> str | None:
        error = connect_error(host)
        if error is None:
            host.disconnect()
            return None
        return f"SSH to {host.name} ({ssh_address(host)}) failed: {error}"

    with ThreadPoolExecutor(max_workers=32) as pool:  # gevent's under pyinfra: one per host
        found = dict(zip((h.name for h in hosts), pool.map(probe, hosts), strict=True))
    return {name: error for name, error in found.items() if error is not None}
