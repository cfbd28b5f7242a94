"""Teardown's secret files: every file a deploy writes a key or a credential to lies under the
directory teardown removes whole, at every purge level, and teardown names each it finds."""

from __future__ import annotations

import pytest

from sglang_fleet import paths
from sglang_fleet.ops import secretfile
from sglang_fleet.stages.router import deploy as router
from sglang_fleet.stages.service import last_good
from tests.fakes import Host, commands

WRITTEN = [paths.AWS_CREDENTIALS, paths.HF_TOKEN, router.ENV_FILE,
           paths.env_file(paths.server_unit(1, 2)), last_good.saved_unit(paths.SERVER_UNIT),
           f"{last_good.saved_unit(paths.SERVER_UNIT)}.env"]


def test_every_credential_file_goes_with_the_secrets_directory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(secretfile, "logger", type("L", (), {"info": said.append})())
    monkeypatch.setattr(secretfile, "host", Host({"FindFiles": WRITTEN}))
    assert all(path.startswith(f"{paths.SECRETS}/") for path in WRITTEN)
    assert commands(secretfile.secrets_absent) == [f"rm -rf {paths.SECRETS}"]
    assert said == [f"[h1] removing secret file {path}" for path in sorted(WRITTEN)]
