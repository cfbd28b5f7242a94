"""DCGM's drop-ins, as the driver stage writes them for a host: the host engine on loopback and
reached from the host only; the exporter on the host's address and, with
``sglang_allowed_clients``, answering those clients and the host only; both read back by
systemd over the units NVIDIA's packages install (the lab's copies of them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.stages.driver import dcgm
from sglang_fleet.stages.service import deploy as service
from sglang_fleet_lab import aptrepo
from tests.fakes import Host


def drop_ins(monkeypatch: pytest.MonkeyPatch, **data: Any) -> dict[str, str]:
    fake = Host()
    fake.data = {"sglang_address": "10.0.0.11", **data}  # type: ignore[attr-defined]
    for module in (dcgm, service):
        monkeypatch.setattr(module, "host", fake)
    return dcgm.drop_ins()


def test_the_host_engine_listens_on_loopback_for_the_host_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for data in ({}, {"sglang_allowed_clients": ["192.0.2.0/24"]}):
        engine = drop_ins(monkeypatch, **data)["nvidia-dcgm.service"]
        assert engine.splitlines()[1:] == [
            "[Service]", "ExecStart=",
            "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm "
            "--bind-interface 127.0.0.1",
            "IPAddressAllow=localhost", "IPAddressDeny=any"]
    # the packaged command, the address added (the lab's unit is a copy of NVIDIA's)
    [packaged] = [line for line in aptrepo.DCGM_UNIT.splitlines() if line.startswith("Exec")]
    assert f"{packaged} --bind-interface 127.0.0.1" == f"ExecStart={dcgm.HOSTENGINE_START}"


def test_the_exporter_answers_the_allowed_clients_and_the_host_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = drop_ins(monkeypatch, sglang_allowed_clients=["192.0.2.0/24", "10.1.2.3"])[
        "nvidia-dcgm-exporter.service"]
    assert [line for line in exporter.splitlines() if not line.startswith("#")] == [
        "[Service]", "Environment=DCGM_EXPORTER_LISTEN=10.0.0.11:9400",
        "IPAddressAllow=localhost 192.0.2.0/24 10.1.2.3/32", "IPAddressDeny=any"]
    anyone = drop_ins(monkeypatch)["nvidia-dcgm-exporter.service"]
    assert "IPAddress" not in anyone and "DCGM_EXPORTER_LISTEN=10.0.0.11:9400" in anyone


def test_systemd_reads_each_drop_in_over_the_packaged_unit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "needs systemd-analyze (Debian package systemd)"
    texts = drop_ins(monkeypatch, sglang_allowed_clients=["192.0.2.0/24"])
    for unit, packaged in (("nvidia-dcgm.service", aptrepo.DCGM_UNIT),
                           ("nvidia-dcgm-exporter.service", aptrepo.DCGM_EXPORTER_UNIT)):
        path = tmp_path / unit  # the drop-in's lines after the unit's, as systemd merges them
        path.write_text(packaged + texts[unit])
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                                capture_output=True, text=True)
        complaints = [line for line in result.stderr.lower().splitlines()
                      if "unknown" in line or "ignoring" in line or "failed to parse" in line]
        assert not complaints, f"{unit}: {complaints}"

