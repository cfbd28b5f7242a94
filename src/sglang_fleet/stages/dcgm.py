"""DCGM and NVIDIA's exporter of its fields for Prometheus (:9400), for the driver stage when
host data sets ``install_dcgm``: both from NVIDIA's repository (the exporter's package and
unit: NVIDIA/dcgm-exporter packaging/ and hack/package/), the exporter on the host's own
address.

    apt.packages(name="CUDA toolkit and DCGM", packages=DCGM_PACKAGES)
    dcgm_running()          # in the driver stage's pyinfra deploy, once the packages are in
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api.operation import OperationMeta
from pyinfra.context import host
from pyinfra.operations import files, systemd

from sglang_fleet import paths
from sglang_fleet.config import validators
from sglang_fleet.errors import InputError
from sglang_fleet.report.metrics_targets import DCGM_EXPORTER_PORT
from sglang_fleet.rollout import fleet
from sglang_fleet.stages.service import unit_running

DCGM_PACKAGES = ["datacenter-gpu-manager-4-cuda13", "datacenter-gpu-manager-exporter"]
DCGM_EXPORTER_UNIT = "nvidia-dcgm-exporter.service"
DCGM_EXPORTER_DROP_IN = f"{paths.UNITS}/{DCGM_EXPORTER_UNIT}.d/sglang-fleet.conf"


def dcgm_exporter_listen() -> OperationMeta:
    """The exporter on the host's own address (the one the fleet's Prometheus targets name),
    not on every interface: a drop-in setting the address its ``-a`` flag reads from the
    environment (``DCGM_EXPORTER_LISTEN``)."""
    where = fleet.address(host)
    wrong = validators.host_problem(where)
    if wrong:
        raise InputError.one(f"pyinfra data of {host.name}", "sglang_address", wrong,
                             "give the host's IP address or DNS name")
    listen = f"[{where}]" if ":" in where else where
    files.directory(name="DCGM exporter drop-in directory",
                    path=DCGM_EXPORTER_DROP_IN.rsplit("/", 1)[0], mode="755")
    return files.put(name=f"DCGM exporter on {listen}:{DCGM_EXPORTER_PORT}", mode="644",
                     dest=DCGM_EXPORTER_DROP_IN,
                     src=StringIO("# Managed by sglang-fleet\n[Service]\nEnvironment="
                                  f"DCGM_EXPORTER_LISTEN={listen}:{DCGM_EXPORTER_PORT}\n"))


def dcgm_running() -> None:
    """DCGM enabled and running, and its exporter on the host's address, restarted when that
    address changed."""
    systemd.service(name="DCGM", service="nvidia-dcgm", running=True, enabled=True)
    listen = dcgm_exporter_listen()
    systemd.daemon_reload(name="Reload systemd", _if=listen.did_change)
    unit_running(name="DCGM exporter (restarted when its address changed)",
                 unit=DCGM_EXPORTER_UNIT, changes=[listen])
