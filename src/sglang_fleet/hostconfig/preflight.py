"""The checks a serving host's change passes before any host is touched, named and in order:
``check --inventory``, a roll's planning and the deploy run this one list, so what one of them
lets through the others cannot refuse later.

    launches = preflight.launches(host, profile, Facts(gpu_count=8))   # InputError: all
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyinfra.api.host import Host

from sglang_fleet.config import connection, exposure
from sglang_fleet.config import preflight as release_rules
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render_all
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.hostconfig import groups
from sglang_fleet.hostconfig.access import of


@dataclass(frozen=True)
class Facts:
    """What the deploy has read from the host besides its data (None: not read, as ``check``
    reads none)."""

    gpu_count: int | None = None
    login_users: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """A named check of a host's change: raises InputError when the change would fail."""

    name: str
    run: Callable[[Host, Profile, list[Launch], Facts], None]


def _release(host: Host, profile: Profile, launches: list[Launch], facts: Facts) -> None:
    release_rules.require_host(profile, launches, host.name, facts.gpu_count)


def _grpc_filter(host: Host, profile: Profile, launches: list[Launch], facts: Facts) -> None:
    data = of(host)
    connection.require_filter(profile, data.sglang_allowed_clients, data.source)


def _exposure(host: Host, profile: Profile, launches: list[Launch], facts: Facts) -> None:
    data = of(host)
    # The account the deploy logs in as is the operator's own (it has root through sudo).
    operator = (host.data.get("ssh_user"),)
    users = [user for user in facts.login_users if user not in operator]
    exposure.require(profile, launches, data.sglang_allowed_clients,
                     data.sglang_trusted_local_users, users, data.source)
    if connection.grpc(profile):
        groups.router_networks(host)  # the routers by address, for the gRPC port's rule


CHECKS = (
    Check("SGLang's startup rules and the host's GPUs", _release),
    Check("gRPC servers behind an allow-list", _grpc_filter),
    Check("each port reaches whom it serves", _exposure),
)


def launches(host: Host, profile: Profile, facts: Facts = Facts()) -> list[Launch]:
    """``host``'s launches of ``profile`` (with its multi-node rank), once every check of
    ``CHECKS`` passed; InputError listing every problem."""
    rendered = render_all(profile, rank=groups.rank_for(host, profile))
    problems: list[Problem] = []
    for check in CHECKS:
        try:
            check.run(host, profile, rendered, facts)
        except InputError as err:
            problems += err.problems
    InputError.raise_any(problems)
    return rendered
