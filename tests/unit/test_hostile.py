"""Hostile strings through every renderer: the unit files, the environment files, the router's
files and every shell command built from data. Each string either comes back as itself (one
argv word, one environment value, one line of text) or is refused by name; none adds a line,
a directive, a command or an expansion."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest

from sglang_fleet.ops import host_programs as hostcode
from sglang_fleet.ops import unitfile
from sglang_fleet.ops.unitfile import UnsafeValue, env_line, systemd_word, unit_text
from sglang_fleet.stages.engine import deploy as engine
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.router import deploy as router
from sglang_fleet.stages.service import deploy as service
from sglang_fleet.stages.service.deploy import restart_policy
from sglang_fleet.stages.weights import deploy as weights
from tests.fakes import Host

HOSTILE = [
    "a; touch /tmp/pwned; #", "$(touch /tmp/pwned)", "`touch /tmp/pwned`", "${SGLANG_API_KEY}",
    "$SGLANG_API_KEY", "50%n %i %%", "it's", 'say "hi"', "back\\slash",
    "line\nExecStartPre=+/bin/sh", "cr\rx", "tab\tx", "nul\x00x", "\u202enew",
    "-", "--", " lead", "trail ", "", "a b  c",
    "{}\\;", "*?[x]", "~root", "!event", "#comment", "a=b", "|&<>",
]
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def render_template(name: str, **values: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(
        [Path(service.TEMPLATE).parent, Path(router.TEMPLATE).parent]),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.get_template(name).render(**values)


def directives(unit: str) -> list[str]:
    """The ``Key=`` names of a unit, in order (comments and sections left out)."""
    return [line.split("=", 1)[0] for line in unit.splitlines()
            if line and not line.startswith(("#", "[")) and "=" in line]


def server_unit(word: str, text: str) -> str:
    return render_template(
        "sglang.service.j2", profile_path=unit_text(text), version="0.5.23", release_id="r",
        env_file="/etc/sglang/sglang.env", served_name=unit_text(text),
        paths={"user": "sglang", "home": "/var/lib/sglang/state", "cache": "/var/cache/sglang"},
        allowed_clients=[], group_peers=[], infiniband=[],
        exec_start=f"/usr/bin/python3 -c pass {systemd_word(word)}",
        timeout_start=1800, timeout_stop=600, start_limit_interval=7200,
        **restart_policy(252))


@pytest.mark.parametrize("text", HOSTILE)
def test_the_server_unit_keeps_its_shape(text: str) -> None:
    if "\x00" in text:
        with pytest.raises(UnsafeValue, match="NUL"):
            systemd_word(text)
        return
    unit = server_unit(text, text)
    assert directives(unit) == directives(server_unit("plain", "plain"))
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert not CONTROL.search(exec_line)
    # systemd expands $ and % only where they are not doubled: none is left single.
    assert not re.search(r"(?<![$])\$(?![$])", exec_line.replace("$$", ""))
    description = next(line for line in unit.splitlines() if line.startswith("Description="))
    assert not re.search(r"%[^%]", description.replace("%%", ""))


@pytest.mark.parametrize("text", HOSTILE)
def test_environment_lines_are_literal_or_refused(text: str) -> None:
    if CONTROL.search(text):
        with pytest.raises(UnsafeValue, match="control character"):
            env_line("X", text)
        return
    line = env_line("X", text)
    assert "\n" not in line and line.startswith("X=")
    quote = line[2]
    assert quote in "'\"" and line.endswith(quote)
    inner = line[3:-1]
    if quote == "'":
        assert inner == text and "'" not in inner
    else:
        assert inner.replace('\\"', "").count('"') == 0


@pytest.mark.parametrize("name", ["X Y", "X;Y", "1X", "X\nY", "${X}", ""])
def test_environment_names_are_checked(name: str) -> None:
    with pytest.raises(UnsafeValue, match="not an environment variable name"):
        env_line(name, "v")


@pytest.mark.parametrize("text", [*HOSTILE, "10.0.0.0/8 0.0.0.0/0", "any"])
def test_allow_lists_take_networks_only(text: str) -> None:
    with pytest.raises(UnsafeValue, match="not an IP address or CIDR"):
        unitfile.networks([text])
    assert unitfile.networks(["10.0.0.7", "192.0.2.0/24", "fd00::/8"]) == \
        ["10.0.0.7/32", "192.0.2.0/24", "fd00::/8"]


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> Host:
    fake = Host()  # facts answer None, shell commands fail
    for module in (engine, weights, router):
        monkeypatch.setattr(module, "host", fake)
    return fake


def words(command: object) -> list[str]:
    """How a POSIX shell splits ``command`` into words (``&&`` and ``;`` stay words); a
    command object (the weights' ``LiveCommand``) by its text."""
    return shlex.split(str(command))


@pytest.mark.parametrize("text", [t for t in HOSTILE if t and "\x00" not in t])
def test_shell_commands_keep_each_value_one_word(fake_host: Host, text: str) -> None:
    dest = f"/opt/sglang/releases/{text}"
    commands = list(engine.venv_install(dest, "/usr/bin/python3", f"pkg=={text}",
                                        ["--find-links", text]))
    assert words(commands[0]) == ["rm", "-rf", f"{dest}.partial"]
    assert f"pkg=={text}" in words(commands[2]) and text in words(commands[2])
    assert words(commands[3])[-1] == dest
    release = Release(text, "1", (), None, None, "/usr/bin/python3")
    link = list(engine.current_link._inner(release))
    assert release.dir in words(link[-1])
    [stage] = list(weights.staged._inner(
        f"s3://b/{text}", f"/var/lib/sglang/models/{text}", text, None))
    assert words(stage)[1:] == hostcode.program(
        weights.TOOLS_PYTHON, weights.DOWNLOADER, f"s3://b/{text}",
        f"/var/lib/sglang/models/{text}", "--endpoint-url", text)


def test_systemd_reads_each_rendered_unit_back(tmp_path: Path) -> None:
    """``systemd-analyze verify`` parses every rendered unit without a complaint."""
    assert shutil.which("systemd-analyze"), "needs systemd-analyze (Debian package systemd)"
    for i, text in enumerate(t for t in HOSTILE if "\x00" not in t):
        path = tmp_path / f"hostile-{i}.service"
        path.write_text(server_unit(text, text).replace(
            "EnvironmentFile=/etc/sglang/sglang.env", f"EnvironmentFile=-{tmp_path}/none.env"))
        result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(path)],
                                capture_output=True, text=True)
        complaints = [line for line in result.stderr.splitlines()
                      if path.name in line or "Unknown" in line or "Ignoring" in line]
        assert not complaints, f"{text!r}: {complaints}"


# --- a multi-node group's values: its name, interfaces and adapters (the environment file),
# rank 0's address (the command line), the peers and InfiniBand devices (the unit) ---

@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.parametrize("key", ["sglang_group", "nccl_socket_ifname", "gloo_socket_ifname",
                                 "nccl_ib_hca", "sglang_address"])
def test_group_and_network_host_data_refuse_hostile_strings(key: str, text: str) -> None:
    from sglang_fleet.errors import InputError
    from sglang_fleet.hostconfig import HostConfig

    with pytest.raises(InputError, match=rf"pyinfra data of h: {key}: "):
        HostConfig.from_data({key: text}, "h")


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_rank0_address_never_reaches_the_command_line(text: str) -> None:
    from sglang_fleet.config.multinode import Rank
    from sglang_fleet.config.render import render
    from sglang_fleet.errors import InputError
    from tests.conftest import field_profile

    prof = field_profile({"parallel.tp": 16, "parallel.nnodes": 2})
    with pytest.raises(InputError, match=r"sglang_group: rank 1 of 2"):
        render(prof, rank=Rank(1, text))


@pytest.mark.parametrize("text", HOSTILE)
def test_the_unit_of_a_member_keeps_its_shape(text: str) -> None:
    from sglang_fleet.facts.infiniband import parse

    devices = parse([text, "uverbs0"])
    assert devices == ["/dev/infiniband/uverbs0"]  # a hostile device name is left out
    with pytest.raises(UnsafeValue):
        unitfile.networks([text])  # what a peer's address goes through
    member = render_template(
        "sglang.service.j2", profile_path="p", version="0.5.23", release_id="r",
        env_file="/etc/sglang/sglang.env", served_name="m",
        paths={"user": "sglang", "home": "/var/lib/sglang/state", "cache": "/var/cache/sglang"},
        allowed_clients=["192.0.2.0/24"], group_peers=unitfile.networks(["10.0.0.11"]),
        infiniband=devices, exec_start="/usr/bin/python3 -c pass", timeout_start=1800,
        timeout_stop=600, start_limit_interval=7200, **restart_policy(252))
    assert "DeviceAllow=/dev/infiniband/uverbs0 rw" in member.splitlines()
    assert "IPAddressAllow=10.0.0.11/32" in member.splitlines()


@pytest.mark.parametrize("text", [t for t in HOSTILE if not CONTROL.search(t)])
def test_network_environment_values_are_literal(text: str) -> None:
    """What the host-data checks let through is written literally all the same."""
    from sglang_fleet.config.render import render
    from sglang_fleet.stages.service.deploy import environment
    from tests.conftest import field_profile

    env = environment(render(field_profile()), {}, {"NCCL_SOCKET_IFNAME": text})
    [line] = [x for x in env.splitlines() if x.startswith("NCCL_SOCKET_IFNAME=")]
    assert line == env_line("NCCL_SOCKET_IFNAME", text)
