"""Teardown: out of the routers, the router itself (on router hosts), the server units and their
environment files; engine releases, staged weights and the driver only when asked to purge
them; packages only if the product installed them (``packages.py``).

    from sglang_fleet.stages.teardown.deploy import teardown
    teardown(Purge.of(hostconfig.of(host)), urls, routers, is_router)
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host

from sglang_fleet import hostconfig, paths
from sglang_fleet.fleet.inventory import RouterConfig
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.ops import Ops
from sglang_fleet.ops.packages import remove_baseline
from sglang_fleet.ops.secretfile import secrets_absent
from sglang_fleet.stages.driver.deploy import remove_driver
from sglang_fleet.stages.engine.deploy import remove_engine
from sglang_fleet.stages.router.deploy import remove_router
from sglang_fleet.stages.service.deploy import remove_service
from sglang_fleet.stages.service.group_restart import GroupRestart, group_stopped
from sglang_fleet.stages.weights.deploy import remove_weights


def _deregister(state: object, host: object, routers: list[RouterConfig],
                urls: list[str]) -> None:
    for config in routers:
        router = config.api()
        for url in urls:
            router.remove(url)


@operation(is_idempotent=True)
def out_of_routers(routers: list[RouterConfig], urls: list[str]) -> Ops:
    """Take ``urls`` out of every router that still routes to them (from this machine).

        out_of_routers(name="Out of the routers", routers=routers, urls=urls)
    """
    registered = []
    for config in routers:
        try:
            known = config.api().workers()
        except RouterError as err:
            logger.warning(f"{host.print_prefix}{err}: not routing, nothing to take out")
            continue
        registered += [url for url in urls if url in known]
    if registered:
        yield FunctionCommand(_deregister, (routers, registered), {})


@dataclass(frozen=True)
class Purge:
    """What teardown removes beyond the units (host data ``purge``: "engine,weights,driver")."""

    engine: bool = False
    weights: bool = False
    driver: bool = False

    @classmethod
    def of(cls, cfg: HostConfig) -> Purge:
        """What the host's data ``purge`` names (checked with the rest of it).

            Purge.of(HostConfig.from_data({"purge": "engine,weights"}, "h")).weights   # True
        """
        return cls(**{name: True for name in cfg.purge})

    @property
    def everything(self) -> bool:
        return self.engine and self.weights and self.driver


@deploy("Teardown")
def teardown(purge: Purge, urls: list[str], routers: list[RouterConfig],
             is_router: bool, group_units: list[str] | None = None) -> None:
    """``group_units``: a multi-node group's member's server units. Its rank 0 (the one in the
    routers) leaves them and stops first, in an operation of its own that every member builds,
    so pyinfra runs it before any member's removal: a member stopped first is a lost peer for
    rank 0, whose ranks then crash and restart under the teardown."""
    if urls and routers:
        out_of_routers(name="Out of the routers", routers=routers, urls=urls)
    for unit in group_units or []:
        group = hostconfig.of(host).sglang_group or ""
        group_stopped(name=f"Group {group}: rank 0's {unit} stopped first", unit=unit,
                      record=GroupRestart(group, wanted_by=["teardown"]), rank0=True)
    if is_router:
        remove_router()
    remove_service()
    # At every purge level: keys, credentials, last-good copies and orphaned environment files.
    secrets_absent(name=f"Every secret file under {paths.SECRETS}")
    if purge.weights:
        remove_weights()
    if purge.engine:
        remove_engine(with_home=purge.weights)
    if purge.driver:
        remove_driver()
    if purge.everything:
        remove_baseline()
