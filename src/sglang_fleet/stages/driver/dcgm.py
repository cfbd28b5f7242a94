"""DCGM and its Prometheus exporter (:9400) when host data sets ``install_dcgm`` (the
exporter's package and unit: NVIDIA/dcgm-exporter packaging/ and hack/package/); the host
engine (:5555) on loopback; with ``sglang_allowed_clients``, the exporter answers those
clients and the host only, as the servers do.

    apt.packages(name="CUDA toolkit and DCGM", packages=DCGM_PACKAGES)
    dcgm_running()          # in the driver stage's pyinfra deploy, once the packages are in
"""

from __future__ import annotations

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from sglang_fleet import paths
from sglang_fleet.config import validators
from sglang_fleet.errors import InputError
from sglang_fleet.fleet import inventory as fleet
from sglang_fleet.report.metrics_targets import DCGM_EXPORTER_PORT
from sglang_fleet.stages.service.deploy import allowed_clients, unit_running

DCGM_PACKAGES = ["datacenter-gpu-manager-4-cuda13", "datacenter-gpu-manager-exporter"]
DCGM_UNIT = "nvidia-dcgm.service"
DCGM_EXPORTER_UNIT = "nvidia-dcgm-exporter.service"
DROP_INS = {unit: f"{paths.UNITS}/{unit}.d/sglang-fleet.conf"
            for unit in (DCGM_UNIT, DCGM_EXPORTER_UNIT)}
# The packaged unit's command (DCGM's config-files/systemd/nvidia-dcgm.service.in) with the
# address said: 127.0.0.1 is nv-hostengine's default (hostengine/src/HostEngineCommandLine.cpp,
# --bind-interface), written out so no other default or flag of the package opens :5555.
HOSTENGINE_START = ("/usr/bin/nv-hostengine -n --service-account nvidia-dcgm "
                    "--bind-interface 127.0.0.1")


def allow_lines(clients: list[str]) -> str:
    """The unit's IP filter: the host itself and ``clients``, nothing else, either way."""
    return f"IPAddressAllow={' '.join(['localhost', *clients])}\nIPAddressDeny=any\n"


def hostengine_drop_in() -> str:
    """The host engine on loopback, and reached from this host only (its clients, dcgmi and
    the exporter, are on the host; systemd's filter cannot tell local users apart)."""
    return ("# Managed by sglang-fleet: the host engine (:5555) on loopback only.\n"
            f"[Service]\nExecStart=\nExecStart={HOSTENGINE_START}\n" + allow_lines([]))


def exporter_drop_in(listen: str, clients: list[str]) -> str:
    """The exporter on ``listen`` (its ``-a`` flag reads ``DCGM_EXPORTER_LISTEN``); with
    ``clients`` (``sglang_allowed_clients``) answering them and the host only."""
    text = ("# Managed by sglang-fleet\n[Service]\n"
            f"Environment=DCGM_EXPORTER_LISTEN={listen}:{DCGM_EXPORTER_PORT}\n")
    if not clients:
        return text
    return text + "# Only these clients (and the host itself): sglang_allowed_clients.\n" + \
        allow_lines(clients)


def exporter_listen() -> str:
    """The host's own address (the one the fleet's Prometheus targets name), as the exporter's
    ``-a`` takes it; InputError when host data gives no usable one."""
    where = fleet.address(host)
    wrong = validators.host_problem(where)
    if wrong:
        raise InputError.one(f"pyinfra data of {host.name}", "sglang_address", wrong,
                             "give the host's IP address or DNS name")
    return f"[{where}]" if ":" in where else where


def drop_ins() -> dict[str, str]:
    """This host's drop-in of each unit, by unit."""
    return {DCGM_UNIT: hostengine_drop_in(),
            DCGM_EXPORTER_UNIT: exporter_drop_in(exporter_listen(), allowed_clients())}


def dcgm_running() -> None:
    """DCGM's host engine on loopback and its exporter on the host's address, both behind
    their IP filters, enabled and running; each restarted when its drop-in changed."""
    written = []
    for unit, text in drop_ins().items():
        files.directory(name=f"{unit} drop-in directory", mode="755",
                        path=DROP_INS[unit].rsplit("/", 1)[0])
        written.append(files.put(name=f"{unit} drop-in", mode="644", dest=DROP_INS[unit],
                                 src=StringIO(text)))
    systemd.daemon_reload(name="Reload systemd", _if=any_changed(*written))
    for unit, put in zip(DROP_INS, written, strict=True):
        unit_running(name=f"{unit} enabled and running", unit=unit,
                     changes=[put])
