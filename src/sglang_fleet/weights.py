"""Weights stage: the model staged once onto the host's local disk (S3 with boto3 on the host,
the Hugging Face hub at a pinned revision, or a path already on the host), verified, renamed
into place when complete; credentials only in root-owned 0600 files.

    from sglang_fleet.weights import stage_weights
    stage_weights(profile)        # in a pyinfra deploy
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.operations import files

from sglang_fleet.engine import TOOLS, UV
from sglang_fleet.ops import Ops, fail
from sglang_fleet.profile import Profile
from sglang_fleet.render import model_path
from sglang_fleet.secretfile import SECRETS_DIR, secret_file, secrets_directory

SCRIPT = f"{TOOLS}/stage_weights.py"
AWS_CREDENTIALS = f"{SECRETS_DIR}/aws-credentials"
HF_TOKEN = f"{SECRETS_DIR}/hf-token"
MANIFEST = ".sglang-fleet-manifest.json"


@operation(is_idempotent=True)
def tools_venv() -> Ops:
    """boto3 and huggingface_hub for the staging script, apart from any engine release."""
    status, _ = host.run_shell_command(f"test -x {TOOLS}/bin/python && "
                                       f"{TOOLS}/bin/python -c 'import boto3, huggingface_hub'")
    if not status:
        yield f"{UV} venv --quiet --allow-existing --python /usr/bin/python3 {TOOLS}"
        yield f"{UV} pip install --quiet --python {TOOLS}/bin/python boto3 huggingface_hub"


@operation(is_idempotent=True)
def staged(source: str, dest: str, endpoint: str | None, token_file: str | None) -> Ops:
    """Run the staging script unless DEST already holds a complete, verified model."""
    status, _ = host.run_shell_command(f"test -f {dest}/{MANIFEST}")
    if status:
        return
    argv = [f"{TOOLS}/bin/python", SCRIPT, source, dest]
    argv += ["--endpoint-url", endpoint] if endpoint else []
    argv += ["--token-file", token_file] if token_file else []
    yield f"AWS_SHARED_CREDENTIALS_FILE={AWS_CREDENTIALS} {shlex.join(argv)}"


@operation(is_idempotent=True)
def present(path: str) -> Ops:
    """A host path: it must already hold a model."""
    status, _ = host.run_shell_command(f"test -f {path}/config.json")
    if not status:
        yield fail(f"{path}/config.json: no model there")


@deploy("Model weights")
def stage_weights(profile: Profile) -> list[OperationMeta]:
    """Returns the operations whose change means the server must restart."""
    source = profile.model.source
    dest = model_path(profile)
    if source.startswith("/"):
        present(name=f"Model at {dest}", path=dest)
        return []
    secrets_directory()
    data = host.data
    if data.get("aws_access_key_id"):
        secret_file(name="AWS credentials (root only)", dest=AWS_CREDENTIALS, content=
                "[default]\n"
                f"aws_access_key_id = {data.aws_access_key_id}\n"
                f"aws_secret_access_key = {data.aws_secret_access_key}\n")
    token_file = None
    if data.get("hf_token"):
        secret_file(name="Hugging Face token (root only)", dest=HF_TOKEN,
                    content=str(data.hf_token) + "\n")
        token_file = HF_TOKEN
    files.directory(name="Models directory", path=str(Path(dest).parent), mode="755")
    tools_venv(name="Staging tools (boto3, huggingface_hub)")
    files.put(name="Staging script", src=str(Path(__file__).with_name("stage_weights.py")),
              dest=SCRIPT, mode="755")
    return [staged(name=f"Stage {source}", source=source, dest=dest,
                   endpoint=data.get("s3_endpoint_url"), token_file=token_file)]
