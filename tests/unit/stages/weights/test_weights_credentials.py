"""The weights stage's credential files as pyinfra builds the stage on ``@local`` (facts of this
machine, nothing executed), the files under a temporary directory, left there by an earlier
deploy: a deploy writes the credentials its model source needs and removes any other, so an
AWS key or a hub token never outlives the source or the host data it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.stages.weights import deploy as weights
from tests.conftest import field_profile

COMMIT = "ab12" * 10
AWS = {"aws_access_key_id": "AKIAEXAMPLEKEY123456", "aws_secret_access_key": "s" * 40}
HUB = {"hf_token": "hf_" + "t" * 34}


def built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
          data: dict[str, Any]) -> dict[str, list[str]]:
    """Each operation of the stage for ``source`` with host ``data``: its commands by name."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.state import State
    from pyinfra.context import ctx_host, ctx_state

    for name in ("AWS_CREDENTIALS", "HF_TOKEN"):
        path = tmp_path / name.lower()
        path.write_text("of an earlier deploy\n")
        monkeypatch.setattr(weights, name, str(path))
    profile = field_profile({"model.source": source}, gpus=1)
    inventory = Inventory((["@local"], data))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    with ctx_state.use(state):
        connect_all(state)
        add_deploy(state, weights.stage_weights, profile=profile)
    host = inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):  # what each operation would run
        return {sorted(state.op_meta[h].names)[0].split(" | ")[-1]:
                [str(c) for c in state.ops[host][h].command_generator()]
                for h in state.get_op_order()  # type: ignore[no-untyped-call]
                if h in state.ops[host]}


def credential_ops(ops: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: found for name, found in ops.items()
            if "AWS" in name or "Hugging Face" in name}


def test_a_hub_source_removes_the_aws_credentials(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The source moved from S3 to the hub, the AWS keys still in host data: their file goes,
    the token is written."""
    ops = credential_ops(built(tmp_path, monkeypatch, f"hf://org/model@{COMMIT}",
                               {**AWS, **HUB}))
    aws = "No AWS credentials file (the model source is not s3:// with host data " \
          "aws_access_key_id)"
    assert list(ops) == [aws, "Hugging Face token (root only)"]
    assert ops[aws] == [f"rm -f {tmp_path / 'aws_credentials'}"]
    assert len(ops["Hugging Face token (root only)"]) == 1  # its upload


def test_an_s3_source_without_a_token_removes_the_token(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """hf_token removed from host data (or never needed: an S3 source): its file goes."""
    ops = credential_ops(built(tmp_path, monkeypatch, "s3://models/m", {**AWS, **HUB}))
    token = "No Hugging Face token file (the model source is not hf:// with host data hf_token)"
    assert list(ops) == ["AWS credentials (root only)", token]
    assert ops[token] == [f"rm -f {tmp_path / 'hf_token'}"]


@pytest.mark.parametrize("source", [f"hf://org/model@{COMMIT}", "/models/m"])
def test_no_credential_in_host_data_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """The secrets taken out of host data, or a model already on the host: both files go."""
    ops = credential_ops(built(tmp_path, monkeypatch, source, {}))
    assert sorted(found for commands in ops.values() for found in commands) == [
        f"rm -f {tmp_path / 'aws_credentials'}", f"rm -f {tmp_path / 'hf_token'}"]
