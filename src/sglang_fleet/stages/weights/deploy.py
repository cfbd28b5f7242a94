"""Weights stage: the model staged once onto the host's local disk (S3, the Hugging Face hub
at a pinned revision, or a path already on the host), verified, renamed into place when
complete, by the host program ``download_model``; credentials only in root-owned 0600 files.

    from sglang_fleet.stages.weights.deploy import stage_weights
    stage_weights(profile)        # in a pyinfra deploy
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from importlib import resources
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta, operation
from pyinfra.context import host
from pyinfra.facts.files import File, FindInFile, Sha256File
from pyinfra.operations import files

from sglang_fleet import hostconfig, paths
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import legacy_staging_dir, model_path, normalized_source
from sglang_fleet.config.validators import REVISION_FIX, revision_warning
from sglang_fleet.facts.python import PythonImports
from sglang_fleet.ops import Ops, fail
from sglang_fleet.ops.host_programs import program, upload
from sglang_fleet.ops.live import LiveCommand
from sglang_fleet.ops.secretfile import secret_file, secrets_directory
from sglang_fleet.paths import AWS_CREDENTIALS, HF_TOKEN, MODELS, TOOLS, UV_CACHE
from sglang_fleet.stages.engine.deploy import UV
from sglang_fleet.stages.weights.host.download_model import MANIFEST

HOST = "sglang_fleet.stages.weights.host"
DOWNLOADER = f"{HOST}.download_model"  # the host program (stages/weights/host/download_model.py)
TOOLS_PYTHON = f"{TOOLS}/bin/python"
TOOLS_PACKAGES = ["boto3", "huggingface_hub"]
# Every package of the tools venv, exact versions and hashes (scripts/host_tools_lock.py): an
# unpinned install would run whatever PyPI serves that day as root on every host.
TOOLS_LOCK = Path(str(resources.files("sglang_fleet") / "data" / "host-tools.lock.txt"))
HOST_TOOLS_LOCK = f"{TOOLS}/host-tools.lock.txt"
HOST_TOOLS_INSTALLED = f"{TOOLS}/host-tools.installed.txt"  # the lock the venv was synced to


def tools_lock_sha256() -> str:
    return hashlib.sha256(TOOLS_LOCK.read_bytes()).hexdigest()


@operation(is_idempotent=True)
def tools_venv() -> Ops:
    """boto3 and huggingface_hub for the downloader, in a venv apart from any engine release,
    synced to the shipped lock (``HOST_TOOLS_LOCK``, uploaded before): exact versions, every
    file's hash checked, wheels only (no build step runs code from an sdist as root).

        tools_venv(name="Staging tools (boto3, huggingface_hub)")
    """
    synced = host.get_fact(Sha256File, path=HOST_TOOLS_INSTALLED) == tools_lock_sha256()
    if synced and host.get_fact(PythonImports, python=TOOLS_PYTHON, modules=TOOLS_PACKAGES):
        host.noop(f"{TOOLS_PYTHON} imports {', '.join(TOOLS_PACKAGES)} at the locked versions")
        return
    yield f"{UV} venv --quiet --allow-existing --python /usr/bin/python3 {TOOLS}"
    yield (f"UV_CACHE_DIR={UV_CACHE} {UV} pip sync --quiet --require-hashes --no-build "
           f"--python {TOOLS_PYTHON} {HOST_TOOLS_LOCK} && "
           f"cp {HOST_TOOLS_LOCK} {HOST_TOOLS_INSTALLED}")


def install_tools() -> None:
    """The lock on the host, then the venv synced to it."""
    files.put(name="Staging tools' lock (exact versions and hashes)", src=str(TOOLS_LOCK),
              dest=HOST_TOOLS_LOCK, user="root", group="root", mode="644")
    tools_venv(name="Staging tools (boto3, huggingface_hub)")


def recorded_source(dest: str) -> str | None:
    """The source DEST's manifest records (its first key, on a line of its own), or None."""
    lines = host.get_fact(FindInFile, path=f"{dest}/{MANIFEST}", pattern='^ "source": ')
    try:
        source = json.loads("{" + lines[0].strip().rstrip(",") + "}")["source"]
    except (TypeError, IndexError, ValueError, KeyError):
        return None
    return source if isinstance(source, str) else None


@operation(is_idempotent=True)
def staged(source: str, dest: str, endpoint: str | None, token_file: str | None,
           reuse: str | None = None) -> Ops:
    """Run the downloader unless DEST already holds a complete, verified model of SOURCE (its
    manifest records it).

    ``reuse``: where an earlier release staged SOURCE (linked, not downloaded, if it holds it).

        staged(name="Stage s3://m/q", source="s3://m/q", dest="/var/lib/sglang/models/q-…",
               endpoint=None, token_file=None)
    """
    recorded = recorded_source(dest)
    # Normalized: a model linked from its pre-digest directory records the source as written.
    if recorded is not None and normalized_source(recorded) == source:
        host.noop(f"{dest} holds a staged model of {source} (its {MANIFEST})")
        return
    argv = program(TOOLS_PYTHON, DOWNLOADER, source, dest,
                   *(["--endpoint-url", endpoint] if endpoint else []),
                   *(["--token-file", token_file] if token_file else []),
                   *(["--reuse", reuse] if reuse and reuse != dest else []))
    yield LiveCommand(f"AWS_SHARED_CREDENTIALS_FILE={AWS_CREDENTIALS} {shlex.join(argv)}")


def served_model(profile: Profile) -> str | None:
    """The model path the host's first server unit runs now (None: no unit yet)."""
    unit = paths.unit_path(paths.server_unit(0, profile.parallel.servers))
    lines = host.get_fact(FindInFile, path=unit, pattern="^ExecStart=") or []
    found = re.search(r" --model-path (\S+)", lines[0]) if lines else None
    return found.group(1) if found else None


def stage_name(source: str, dest: str, served: str | None) -> str:
    """The staging operation's name: it says when the source changed, which restarts the
    servers onto the new directory.

        stage_name("s3://m/new", "/m/new-1", "/m/old-2")
        # 'Stage s3://m/new (the model source changed: the server ran /m/old-2; it restarts ...'
    """
    if served is None or served == dest:
        return f"Stage {source}"
    return (f"Stage {source} (the model source changed: the server ran {served}; it restarts "
            f"onto {dest})")


@operation(is_idempotent=True)
def present(path: str) -> Ops:
    """A host path: it must already hold a model.

        present(name="Model at /models/q", path="/models/q")
    """
    if not host.get_fact(File, path=f"{path}/config.json"):
        yield fail(f"{path}/config.json: no model there")
        return
    host.noop(f"{path} holds a model (config.json)")


def credentials(source: str) -> str | None:
    """The credentials ``source`` needs, in their root-only files; the others removed, so that
    none outlives the source or the host data it came from. Returns the token file (None:
    anonymous)."""
    cfg = hostconfig.of(host)  # the credentials' form: checked with the rest of the host's data
    if source.startswith("s3://") and cfg.aws_access_key_id:
        secret_file(name="AWS credentials (root only)", dest=AWS_CREDENTIALS, content=
                    f"[default]\naws_access_key_id = {cfg.aws_access_key_id}\n"
                    f"aws_secret_access_key = {cfg.aws_secret_access_key}\n")
    else:
        files.file(name="No AWS credentials file (the model source is not s3:// with host "
                   "data aws_access_key_id)", path=AWS_CREDENTIALS, present=False)
    if source.startswith("hf://") and cfg.hf_token:
        secret_file(name="Hugging Face token (root only)", dest=HF_TOKEN,
                    content=cfg.hf_token + "\n")
        return HF_TOKEN
    files.file(name="No Hugging Face token file (the model source is not hf:// with host data "
               "hf_token)", path=HF_TOKEN, present=False)
    return None


@deploy("Model weights")
def stage_weights(profile: Profile) -> list[OperationMeta]:
    """Returns the operations whose change means the server must restart."""
    source = profile.model.source
    dest = model_path(profile)
    if source.startswith("/"):
        credentials(source)  # none needed: those of an earlier source go
        present(name=f"Model at {dest}", path=dest)
        return []
    moves = revision_warning(source)
    if moves:  # valid, but hosts staged on different days would serve different weights
        logger.warning(f"{host.print_prefix}model.source: {moves}; {REVISION_FIX}")
    secrets_directory()
    token_file = credentials(source)
    files.directory(name="Models directory (root's; the service only reads it)",
                    path=str(Path(dest).parent), user="root", group="root", mode="755")
    install_tools()
    upload(HOST)
    source = normalized_source(source)
    return [staged(name=stage_name(source, dest, served_model(profile)), source=source,
                   dest=dest, endpoint=hostconfig.of(host).s3_endpoint_url, token_file=token_file,
                   reuse=legacy_staging_dir(source))]


def remove_weights() -> None:
    """Every staged model."""
    files.directory(name="Staged weights", path=MODELS, present=False)
