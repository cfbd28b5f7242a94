"""The last good release kept and put back by the very commands the gate and the restore run, in
a real shell on files in a temporary directory: the environment is kept without its keys and
goes back with the keys in place, so a rollback never brings back a key rotated since (revoked).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from sglang_fleet.config.render import render
from sglang_fleet.paths import ADMIN_API_KEY_VAR, API_KEY_VAR
from sglang_fleet.stages.service import last_good
from sglang_fleet.stages.service.deploy import environment
from tests.conftest import field_profile

UNIT = "sglang.service"
LAUNCH = render(field_profile(gpus=1))
OLD, NEW, ADMIN = "old-key-" + "o" * 24, "new-key-" + "n" * 24, "admin-key-" + "a" * 22


def env_text(keys: dict[str, str], nic: str) -> str:
    """The environment file the service stage writes for the field's server."""
    return environment(LAUNCH, keys, {"NCCL_SOCKET_IFNAME": nic})


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The unit, its environment and the last good copies under ``tmp_path``; a systemctl
    stand-in that only reloads (nothing here runs a unit)."""
    monkeypatch.setattr(last_good, "LAST_GOOD", str(tmp_path / "last-good"))
    monkeypatch.setattr(last_good, "unit_path", lambda unit: str(tmp_path / unit))
    monkeypatch.setattr(last_good, "env_file", lambda unit: str(tmp_path / "sglang.env"))
    monkeypatch.setattr(last_good, "rules_path", lambda unit: str(tmp_path / "sglang.nft"))
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "systemctl").write_text("#!/bin/sh\n[ \"$1\" = daemon-reload ]\n")
    (tools / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def sh(command: str) -> None:
    subprocess.run(["sh", "-c", command], check=True)  # as pyinfra runs a command


def deployed(where: Path, unit: str, env: str) -> None:
    (where / UNIT).write_text(unit)
    (where / "sglang.env").write_text(env)


def test_a_rollback_brings_back_the_release_with_todays_keys(where: Path) -> None:
    """The last good release kept with the keys of then; a deploy rotates them and changes the
    release; its gate fails and the restore puts the release back: its unit and environment,
    with today's keys, never the revoked ones."""
    kept = env_text({API_KEY_VAR: OLD, ADMIN_API_KEY_VAR: ADMIN}, "eth0")
    deployed(where, "unit of 0.5.22\n", kept)
    sh(last_good.keep_command(UNIT))
    assert OLD not in (where / "last-good" / f"{UNIT}.env").read_text()
    assert (where / "last-good" / f"{UNIT}.env").stat().st_mode & 0o777 == 0o600
    deployed(where, "unit of 0.5.23\n", env_text({API_KEY_VAR: NEW}, "eth1"))
    sh(last_good._copy_back_command(UNIT))
    assert (where / UNIT).read_text() == "unit of 0.5.22\n"
    # the kept release's environment, then the keys in place (no admin key any more)
    assert (where / "sglang.env").read_text() == env_text({}, "eth0") + f"{API_KEY_VAR}='{NEW}'\n"
    assert (where / "sglang.env").stat().st_mode & 0o777 == 0o600
    assert not list(where.glob("*.sglang-fleet-new"))


def test_a_copy_kept_with_its_keys_goes_back_without_them(where: Path) -> None:
    """A last good copy kept before keys were left out (it holds the key of then): the restore
    leaves that key out too."""
    (where / "last-good").mkdir()
    (where / "last-good" / UNIT).write_text("unit of 0.5.22\n")
    (where / "last-good" / f"{UNIT}.env").write_text(env_text({API_KEY_VAR: OLD}, "eth0"))
    deployed(where, "unit of 0.5.23\n", env_text({API_KEY_VAR: NEW}, "eth0"))
    sh(last_good._copy_back_command(UNIT))
    text = (where / "sglang.env").read_text()
    assert OLD not in text and text.count(f"{API_KEY_VAR}='{NEW}'\n") == 1


def test_a_restore_that_cannot_read_the_keys_in_place_changes_nothing(where: Path) -> None:
    """No environment file in place: no keys known; the restore stops before the unit goes
    back, rather than starting a server without its keys."""
    deployed(where, "unit of 0.5.22\n", env_text({API_KEY_VAR: OLD}, "eth0"))
    sh(last_good.keep_command(UNIT))
    (where / UNIT).write_text("unit of 0.5.23\n")
    (where / "sglang.env").unlink()
    with pytest.raises(subprocess.CalledProcessError):
        sh(last_good._copy_back_command(UNIT))
    assert (where / UNIT).read_text() == "unit of 0.5.23\n"
    assert not (where / "sglang.env").exists()


def test_the_release_in_place_is_the_kept_one_whatever_its_keys(where: Path) -> None:
    """``in_place`` compares the kept environment with the one in place without its keys (the
    fact's command run here): a rotated key alone is the same release, another NIC is not."""
    from sglang_fleet.ops.secretfile import KeylessSha256

    def keyless_sum() -> str | None:
        fact = KeylessSha256()
        out = subprocess.run(["sh", "-c", fact.command(str(where / "sglang.env"))], check=True,
                             capture_output=True, text=True).stdout.splitlines()
        return fact.process(out) if out else None

    deployed(where, "unit\n", env_text({API_KEY_VAR: OLD}, "eth0"))
    sh(last_good.keep_command(UNIT))
    kept = hashlib.sha256((where / "last-good" / f"{UNIT}.env").read_bytes()).hexdigest()
    assert keyless_sum() == kept
    deployed(where, "unit\n", env_text({API_KEY_VAR: NEW}, "eth0"))
    assert keyless_sum() == kept
    deployed(where, "unit\n", env_text({API_KEY_VAR: NEW}, "eth1"))
    assert keyless_sum() != kept
    (where / "sglang.env").unlink()
    assert keyless_sum() is None


def test_the_ports_table_goes_back_with_its_unit(where: Path) -> None:
    """The unit loads its table as it starts (``ExecStartPre=+nft -f``): a rollback puts back
    the table that passed with it, and none where it had none (a unit whose table is missing
    would not start; one with the newer deploy's would let in whom that one lets in)."""
    env = env_text({API_KEY_VAR: OLD}, "eth0")
    deployed(where, "unit over gRPC\n", env)
    (where / "sglang.nft").write_text("table of the gRPC unit\n")
    sh(last_good.keep_command(UNIT))
    deployed(where, "unit over HTTP\n", env)
    (where / "sglang.nft").unlink()  # the new deploy has no table
    sh(last_good._copy_back_command(UNIT))
    assert (where / UNIT).read_text() == "unit over gRPC\n"
    assert (where / "sglang.nft").read_text() == "table of the gRPC unit\n"
    # kept without a table: the restore removes the one a later deploy wrote
    (where / "sglang.nft").unlink()
    sh(last_good.keep_command(UNIT))
    (where / "sglang.nft").write_text("table of a later deploy\n")
    sh(last_good._copy_back_command(UNIT))
    assert not (where / "sglang.nft").exists()
