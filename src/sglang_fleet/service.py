"""Service stage: a templated systemd unit running the rendered argv with the release's python,
secrets and environment in a root-only EnvironmentFile, restarted only when the unit, its
environment, the release or the weights changed.

    from sglang_fleet.service import install_service
    changed = install_service(profile, launch, release)   # in a pyinfra deploy
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api.deploy import deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.context import host
from pyinfra.operations import files, systemd

from sglang_fleet.engine import CACHE_ENV, Release
from sglang_fleet.errors import InputError
from sglang_fleet.profile import Profile
from sglang_fleet.render import Launch
from sglang_fleet.secretfile import secret_file

UNIT = "sglang.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_FILE = "/etc/sglang/sglang.env"
TEMPLATE = "templates/sglang.service.j2"
_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_word(word: str) -> str:
    """One argv word as systemd's ExecStart reads it; ``${VAR}`` references stay expandable."""
    if re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*\}", word):
        return word
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _env_line(name: str, value: str) -> str:
    return f'{name}="{value}"' if re.search(r"[\s#'\"\\$]", value) is None else \
        f"{name}='{value}'" if "'" not in value else f'{name}="{value}"'


def environment(launch: Launch, secrets: dict[str, str]) -> str:
    """The EnvironmentFile: caches, the profile's env and the secrets' values."""
    env = {**CACHE_ENV, **launch.env, **secrets}
    return "# Managed by sglang-fleet (root, 0600): holds secrets.\n" + "".join(
        f"{_env_line(k, v)}\n" for k, v in sorted(env.items()))


def secret_values(launch: Launch, host_name: str, data: object) -> dict[str, str]:
    """Values of the secrets the launch refers to, from host data (``secrets`` mapping)."""
    available = getattr(data, "get", lambda *_: None)("secrets") or {}
    values = {}
    for var, name in launch.secrets.items():
        if name not in available:
            raise InputError.one(f"pyinfra data of {host_name}", f"secrets.{name}",
                                 f"the profile needs the secret {name!r} ({var}) but host data "
                                 "has no value for it",
                                 f"set secrets = {{'{name}': ...}} in group data, read from a "
                                 "file or the environment, never committed")
        values[var] = str(available[name])
    return values


@dataclass(frozen=True)
class ServiceOps:
    unit: OperationMeta
    env: OperationMeta


@deploy("SGLang service")
def install_service(profile: Profile, launch: Launch, release: Release,
                    restart_if: list[OperationMeta]) -> ServiceOps:
    secrets = secret_values(launch, host.name, host.data)
    exec_start = " ".join(systemd_word(w) for w in
                          (release.python_bin, *launch.argv[1:]))
    files.directory(name="Secrets directory", path="/etc/sglang", user="root", group="root",
                    mode="700")
    env = secret_file(name="Environment and secrets (root, 0600)", dest=ENV_FILE,
                      content=environment(launch, secrets))
    unit = files.template(
        name=f"Unit {UNIT}", src=TEMPLATE, dest=UNIT_PATH, mode="644",
        profile_path=profile.path, version=launch.version, release_id=release.id,
        env_file=ENV_FILE, served_name=profile.model.served_name, exec_start=exec_start,
        timeout_start=int(host.data.get("startup_budget_seconds", 1800)),
        timeout_stop=int(host.data.get("drain_budget_seconds", 600)),
        start_limit_interval=int(host.data.get("startup_budget_seconds", 1800)) * 4)
    systemd.daemon_reload(name="Reload systemd", _if=unit.did_change)
    changes = [unit, env, *restart_if]
    # Restart first: it touches only a running unit, so a fresh host starts exactly once.
    systemd.service(name=f"Restart {UNIT} (its definition changed)", service=UNIT,
                    restarted=True, _if=lambda: any(op.did_change() for op in changes))
    systemd.service(name=f"Enable and start {UNIT}", service=UNIT, running=True, enabled=True)
    return ServiceOps(unit, env)
