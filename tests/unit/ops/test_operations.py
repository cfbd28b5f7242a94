"""The product's own pyinfra operations in pyinfra's style: facts (and what the host answers)
in, commands out; a host in the wanted state gets no command."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand

from sglang_fleet import ops, paths
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.ops import packages, secretfile
from sglang_fleet.paths import CURRENT, PREVIOUS, RELEASES
from sglang_fleet.stages.driver import deploy as driver
from sglang_fleet.stages.engine import deploy as engine
from sglang_fleet.stages.service import deploy as service
from tests.fakes import RELEASE, Host, commands, driver_host


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch) -> Callable[[Host], Host]:
    def install(fake: Host) -> Host:
        for module in (driver, engine, ops, packages, secretfile, service):
            monkeypatch.setattr(module, "host", fake, raising=False)
        return fake

    return install


def test_current_link_switches_and_keeps_previous(use: Callable[[Host], Host]) -> None:
    use(Host({"Link": {"link_target": f"{RELEASES}/old"}}))
    assert commands(engine.current_link, RELEASE) == [
        f"ln -sfn {RELEASES}/old {PREVIOUS}.new && mv -T {PREVIOUS}.new {PREVIOUS}",
        f"ln -sfn {RELEASE.dir} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"]
    use(Host({"Link": None}))
    assert commands(engine.current_link, RELEASE) == [
        f"ln -sfn {RELEASE.dir} {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}"]
    use(Host({"Link": {"link_target": RELEASE.dir}}))
    assert commands(engine.current_link, RELEASE) == []


def test_prune_keeps_the_newest_and_what_the_links_name(use: Callable[[Host], Host]) -> None:
    use(releases_host(["r1", "r3", "r5", "r2", "r4", "r6.partial"],
                      {CURRENT: "r4", PREVIOUS: "r1"}))
    assert commands(engine.prune, keep=2) == [f"rm -rf {RELEASES}/r3", f"rm -rf {RELEASES}/r2"]
    fake = use(releases_host(["r2", "r1"], {}))
    assert commands(engine.prune, keep=3) == [] and fake.noops == ["2 releases, none to remove"]
    use(Host({"FindDirectories": []}))  # no releases directory yet
    assert commands(engine.prune, keep=3) == []


def test_prune_takes_the_caches_marks_and_records_of_what_it_removed(
        use: Callable[[Host], Host]) -> None:
    old, mid, new = ("sglang-0.5.21-aaaaaaaaaa", "sglang-0.5.22-bbbbbbbbbb",
                     "sglang-0.5.23-cccccccccc")
    caches = paths.RELEASE_CACHES
    use(three_releases(old, mid, new, [f"{caches}/0.5.21", f"{caches}/0.5.22", f"{caches}/0.5.23"]))
    marks, records = paths.WARM_MARKS, paths.COMPILED
    assert commands(engine.prune, keep=1) == [
        f"rm -rf {RELEASES}/{old}", PRUNE_COMMAND,
        f"rm -f {marks}/{old}-0123", f"rm -f {marks}/89abcdef",
        f"rm -f {records}/{old}-0123456789abcdef01234567.json"]


# The kept versions are the program's only arguments: it reads the directory itself.
PRUNE_COMMAND = ("/usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath /usr/bin/python3 -m "
                 "sglang_fleet.remote.prune_caches --root /var/cache/sglang/release "
                 "--keep=0.5.22 --keep=0.5.23")


def three_releases(old: str, mid: str, new: str, listed: list[str]) -> Host:
    """Releases old, mid (previous) and new (current), the per-version caches' listing as
    pyinfra splits find's output (one line a path), the warm-up marks and the compiled-kernel
    records."""
    names = {f"{RELEASES}/{n}": day for day, n in enumerate((old, mid, new), start=1)}
    fake = releases_host([], {CURRENT: new, PREVIOUS: mid})
    caches = paths.RELEASE_CACHES
    fake.facts["FindDirectories"] = lambda path, maxdepth: (
        [caches, *listed] if path == caches
        else [RELEASES, *names])
    fake.facts["Directory"] = lambda path: {"mtime": datetime(2026, 1, names[path])}
    found = {paths.WARM_MARKS: [f"{paths.WARM_MARKS}/{old}-0123",
                                f"{paths.WARM_MARKS}/{new}-4567",
                                f"{paths.WARM_MARKS}/89abcdef"],  # the last: an older mark
             paths.COMPILED: [f"{paths.COMPILED}/{old}-0123456789abcdef01234567.json",
                              f"{paths.COMPILED}/{new}-0123456789abcdef01234567.json"]}
    fake.facts["FindFiles"] = lambda path, maxdepth: found.get(path, [])
    return fake


def test_prune_deletes_no_name_the_service_wrote(use: Callable[[Host], Host]) -> None:
    """The service user writes the caches' directory: a directory named "0.5.1\n.ssh" lists
    as two lines, and used to make root run ``rm -rf .ssh`` in its working directory."""
    old, mid, new = ("sglang-0.5.21-aaaaaaaaaa", "sglang-0.5.22-bbbbbbbbbb",
                     "sglang-0.5.23-cccccccccc")
    caches = paths.RELEASE_CACHES
    use(three_releases(old, mid, new, [f"{caches}/0.5.1", ".ssh", f"{caches}/0.5.22"]))
    ran = [c for c in commands(engine.prune, keep=1) if "rm -f " not in c]
    assert ran == [f"rm -rf {RELEASES}/{old}", PRUNE_COMMAND]
    assert not any(".ssh" in c or "0.5.1 " in c for c in ran)
    use(three_releases(old, mid, new, [f"{caches}/0.5.22", f"{caches}/lost+found"]))
    assert PRUNE_COMMAND not in commands(engine.prune, keep=1)  # nothing to prune: no command


def releases_host(names: list[str], links: dict[str, str]) -> Host:
    """Release directories whose age follows their number (r5 newer than r4), and links."""
    def directory(path: str) -> dict[str, Any]:
        return {"mtime": datetime(2026, 1, int(path[-1]) if path[-1].isdigit() else 1)}

    def link(path: str) -> dict[str, Any] | None:
        return {"link_target": f"{RELEASES}/{links[path]}"} if path in links else None

    return Host({"FindDirectories": [RELEASES, *(f"{RELEASES}/{n}" for n in names)],
                 "Directory": directory, "Link": link})


def test_secret_file_uploads_only_a_change_and_mends_its_mode(
        use: Callable[[Host], Host]) -> None:
    content = "SGLANG_API_KEY='k'\n"
    digest = hashlib.sha256(content.encode()).hexdigest()
    use(Host({"Sha256File": None}))
    [upload] = commands(secretfile.secret_file, "/etc/sglang/x.env", content)
    assert isinstance(upload, FunctionCommand) and upload.args[:2] == ("/etc/sglang/x.env",
                                                                       content)
    owner = {"user": "root", "group": "root", "mode": 600}
    use(Host({"Sha256File": digest, "File": owner}))
    assert commands(secretfile.secret_file, "/etc/sglang/x.env", content) == []
    use(Host({"Sha256File": digest, "File": {**owner, "mode": 644}}))
    assert commands(secretfile.secret_file, "/etc/sglang/x.env", content) == [
        "chown root:root /etc/sglang/x.env && chmod 600 /etc/sglang/x.env"]


def test_a_sudo_operation_uploads_its_secret_with_sudo(use: Callable[[Host], Host]) -> None:
    fake = use(Host({"Sha256File": None}))
    fake.current_op_global_arguments = {"_sudo": True, "_sudo_user": None, "_chdir": "/x"}
    [upload] = commands(secretfile.secret_file, "/etc/sglang/x.env", "k\n")
    assert upload.args[2] == {"_sudo": True}


def test_packages_purged_removes_only_what_the_product_added(
        use: Callable[[Host], Host]) -> None:
    installed = {p: ["1"] for p in ("python3-venv", "cuda-keyring", "curl")}
    use(Host({"DebPackages": installed, "FileContents": ["curl"],
              "AptPurgePlan": ["python3.11-venv", "cuda-keyring", "curl"]}))
    [command] = commands(packages.packages_purged, owned=["cuda-keyring", "nvlsm"],
                         shared=["python3-venv", "curl"])
    assert command.endswith("apt-get purge -y -q --allow-change-held-packages cuda-keyring "
                            "python3-venv python3.11-venv")
    fake = use(Host({"DebPackages": {"curl": ["1"]}, "FileContents": ["curl"]}))
    assert commands(packages.packages_purged, owned=["nvlsm"], shared=["curl"]) == []
    assert fake.noops == ["none of them installed by sglang-fleet"]


def test_driver_packages_installs_the_wanted_version_and_holds_it(
        use: Callable[[Host], Host], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = driver.DriverConfig.of(HostConfig.from_data({"nvidia_driver_version": "580.95.05"},
                                                           "h1"))
    use(driver_host(["580.105.08-1", "580.95.05-1"], "580.82.07-1", []))
    found = commands(driver.driver_packages, cfg)
    names = " ".join(cfg.packages)
    assert found[0] == f"apt-mark unhold {names} >/dev/null"
    assert "nvidia-driver-580-open=580.95.05-1" in found[1]
    assert "nvidia-driver-pinning-580" in found[1]
    assert found[2:] == [f"apt-mark hold {names}"]
    use(driver_host(["580.95.05-1"], "580.95.05-1", list(cfg.packages)))
    assert commands(driver.driver_packages, cfg) == []  # installed and held: nothing
    use(driver_host(["580.95.05-1"], "580.95.05-1", []))
    assert commands(driver.driver_packages, cfg) == [f"apt-mark hold {names}"]


def test_driver_packages_refuses_a_version_the_repository_lacks(
        use: Callable[[Host], Host], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = driver.DriverConfig.of(HostConfig.from_data({"nvidia_driver_version": "580.1.1"}, "h1"))
    use(driver_host(["580.95.05-1"], None, []))
    [command] = commands(driver.driver_packages, cfg)
    assert "nvidia_driver_version 580.1.1: the repository offers 580.95.05-1" in command
    assert command.endswith("exit 1")


def test_units_are_found_through_facts_and_retired_by_name(
        use: Callable[[Host], Host]) -> None:
    units = [f"{paths.UNITS}/{n}" for n in ("sglang.service", "sglang-1.service",
                                            "sglang-router.service", "sglang-x.service")]
    use(Host({"FindFiles": units}))
    assert service.installed_units() == ["sglang-1.service", "sglang.service"]
    [command] = commands(service.retire_other_units, keep=["sglang.service"])
    assert command.startswith("systemctl disable --now sglang-1.service; rm -f "
                              f"{paths.UNITS}/sglang-1.service /etc/sglang/sglang-1.env "
                              f"{paths.gate_record('sglang-1.service')} "  # its gate's figures
                              "/etc/sglang/sglang-1.nft ")  # its ports' table
    fake = use(Host({"FindFiles": units[:1]}))
    assert commands(service.retire_other_units, keep=["sglang.service"]) == []
    assert fake.noops == ["no other sglang units"]
    fake = use(Host({"File": None}))
    assert commands(service.unit_absent, "sglang-router.service") == []
    assert fake.noops == ["sglang-router.service is not installed"]
