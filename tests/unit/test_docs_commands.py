"""Every command the docs show is run, so the docs stay true.

Each command of a ```sh or ```console block in README.md and docs/*.md (a ``console`` block's
``$ `` lines) is either run here or named in ``ELSEWHERE`` with the test that runs it:

- run here: in a scratch directory that links every top-level entry of the checkout but holds
  its own copy of README.md and docs/ (a ``--write`` regenerates the copy, never the checkout),
  through ``bash -c``, with ``uv run X`` run as ``X`` from ``.venv/bin`` (the environment ``uv
  sync`` made, first on PATH: what ``uv run`` would run, without a sync per command), under
  ``tests/noconnect.py``'s guard (no connection leaves this machine). It must exit 0, or the
  status ``STATUS`` gives it, and print what ``STATUS`` expects.
- ``ELSEWHERE``: commands that need the lab, real hosts or root on this machine, each mapped to
  ``FILE::TEST`` (the file must define the test) or to a script that holds the command itself
  (``.ci/run``). A command the docs gain that needs hosts and is in neither fails here: it is
  run, and the guard refuses its connections.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests import noconnect
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```(sh|console)\n(.*?)^\1```", re.M | re.S)
HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?")

# Commands run elsewhere: the command as the docs write it -> the test (or script) that runs it.
ELSEWHERE: dict[str, str] = {
    "uv run sglang-fleet demo     # the demo on the lab (then: uv run sglang-fleet lab down)":
        "tests/lab/test_demo.py::test_the_demo_serves_through_the_router_and_lab_down_ends_it",
    "uv run pytest                # the tests": ".ci/run",
    "uv run pytest": ".ci/run",
    # the operator's secret files: root, /etc
    "sudo install -d -m 0700 /etc/sglang-fleet":
        "tests/unit/test_docs_commands.py::test_the_secret_files_are_what_the_group_data_reads",
    "openssl rand -hex 32 | sudo sh -c 'umask 077; cat > /etc/sglang-fleet/sglang-api-key'":
        "tests/unit/test_docs_commands.py::test_the_secret_files_are_what_the_group_data_reads",
    "openssl rand -hex 32 | sudo sh -c 'umask 077; cat > "
    "/etc/sglang-fleet/sglang-router-admin-key'":
        "tests/unit/test_docs_commands.py::test_the_secret_files_are_what_the_group_data_reads",
    "printf 'aws_access_key_id=%s\\naws_secret_access_key=%s\\n' \"$AWS_ACCESS_KEY_ID\" "
    "\"$AWS_SECRET_ACCESS_KEY\" | sudo sh -c 'umask 077; cat > /etc/sglang-fleet/aws-credentials'":
        "tests/unit/test_docs_commands.py::test_the_secret_files_are_what_the_group_data_reads",
    # real hosts (inventories/b200.py): the lab runs the same on inventories/lab.py
    "pyinfra inventories/b200.py deploys/sglang.py":
        "tests/lab/test_serving.py::test_fresh_hosts_converge_and_pass_the_gate",
    "pyinfra -y inventories/b200.py deploys/router.py":
        "tests/lab/test_fleet.py::test_router_routes_to_every_host_with_the_key",
    "uv run sglang-fleet status inventories/b200.py":
        "tests/lab/test_gpu_status.py::test_status_of_a_deployed_host",
    "uv run sglang-fleet status inventories/b200.py [--json]":
        "tests/lab/test_gpu_status.py::test_status_of_a_deployed_host",
    "uv run sglang-fleet roll inventories/b200.py [--batch K] [--batch-instances K] "
    "[--data sglang.KEY=VALUE ...] [--json]":
        "tests/lab/test_fleet.py::test_roll_restarts_each_host_once_without_a_failed_request",
    # rolls at fleet scale: the same roll over 120 hosts with a fake launcher and router
    "uv run sglang-fleet roll inventories/b200.py --batch 10% --max-unavailable 12% "
    "--tolerate 2% --parallel 50": "tests/unit/roll/test_fleet_scale.py::"
        "test_a_tolerant_preparation_skips_failed_hosts_and_reports_them",
    "uv run sglang-fleet roll inventories/b200.py --batch 10% --max-unavailable 12% "
    "--tolerate 2% --parallel 50 --resume": "tests/unit/roll/test_fleet_scale.py::"
        "test_the_budget_counts_hosts_already_unhealthy_and_the_roll_resumes",
    "pyinfra -y inventories/b200.py deploys/teardown.py [--data purge=engine,weights,driver]":
        "tests/lab/test_fleet.py::test_teardown_purges_back_to_a_fresh_host_and_deploy_works_again",
    # a job through a fleet's router
    "sglang-fleet generate s3://data/prompts.jsonl s3://data/run-1/ --url "
    "http://10.0.0.10:30080 --api-key-file ~/.sglang-key --worker \"$SLURM_ARRAY_TASK_ID/8\"":
        "tests/lab/test_generate.py::test_roll_and_kill_9_mid_job_then_rerun_writes_each_id_once",
    "for k in 0 1 2; do\nsglang-fleet generate prompts.jsonl run-1/ --url "
    "http://10.0.0.10:30080 --worker \"$k/3\" &\ndone; wait":
        "tests/lab/test_generate.py::test_roll_and_kill_9_mid_job_then_rerun_writes_each_id_once",
    # the simulator: a server that runs until stopped
    "uv sync": ".ci/run",
    "uv run python -m sglang_sim.launch_server --model-path lab/models/qwen3.6-27b "
    "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4 --mamba-radix-cache-strategy extra_buffer "
    "--reasoning-parser qwen3 --enable-metrics --port 30000":
        "lab/sglang-sim/tests/test_http.py::test_server_info_reports_resolved_arguments",
    # the lab (root, systemd-nspawn)
    "sudo apt-get install debootstrap systemd-container openssh-client dpkg-dev apt-utils gnupg":
        "tests/labpkg/test_hostpkgs.py::test_missing_packages_are_installed_and_named",
    "sudo uv run sglang-fleet lab up --hosts 3 [--gpus 8] [--hgx] [--sudo-user NAME]":
        "tests/lab/test_lab.py::test_status_lists_three_running_hosts",
    "uv run sglang-fleet lab status [--json]":
        "tests/lab/test_lab.py::test_status_lists_three_running_hosts",
    "sudo uv run sglang-fleet lab ssh lab1 [command]":
        "tests/lab/test_lab.py::test_upgrade_without_reboot_is_a_version_mismatch",
    "sudo uv run pyinfra -y inventories/lab.py exec -- nvidia-smi -L":
        "tests/lab/test_lab.py::test_pyinfra_reaches_every_host_and_nvidia_smi_is_absent",
    "sudo uv run sglang-fleet lab down": "tests/lab/test_lab.py::test_down_leaves_nothing_behind",
    "flock /tmp/sglang-lab.lock uv run python bench/faults.py [--only crash-after-n ...]   # root":
        "tests/lab/test_recovery.py::test_a_server_that_dies_under_its_first_batch_fails_the_gate",
}
# Commands run here that end otherwise than 0: (exit status, a fragment of their output).
# (The example inventory's keys come from /etc/sglang-fleet, which a test machine lacks.)
STATUS: dict[str, tuple[int, str]] = {
    "uv run sglang-fleet check --inventory inventories/b200.py   # every host, without connecting":
        (1, "or router_allow_no_key = True to run an open router"),
    "uv run sglang-fleet check --inventory inventories/b200.py":
        (1, "or router_allow_no_key = True to run an open router"),
    "uv run sglang-fleet check seed.yaml": (
        1, "mamba.strategy: Speculative decoding for Qwen3_5ForConditionalGeneration is not "
           "compatible with radix cache when using --mamba-scheduler-strategy no_buffer."),
}
# Words that mean a command needs the lab, a host or root: such a command must be ELSEWHERE.
NEEDS_HOSTS = re.compile(r"\b(sudo|pyinfra|lab|demo|roll|status|generate|smoke|flock)\b")


def commands(text: str) -> list[str]:
    """The commands of the ``sh``/``console`` blocks in ``text``: a line each, continuation
    lines (``\\``) joined, a ``for``/``while``/``if`` up to its end and a here-document with its
    lines (joined with newlines); comments and blank lines left out."""
    found = []
    for match in BLOCK.finditer(text):
        indent, kind, body = len(match.group(1)), match.group(2), match.group(3)
        lines = [line[indent:] for line in body.splitlines()]
        if kind == "console":
            lines = [line[2:] for line in lines if line.startswith("$ ")]
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            i += 1
            if not line or line.startswith("#"):
                continue
            while line.endswith("\\") and i < len(lines):
                line = line[:-1].rstrip() + " " + lines[i].strip()
                i += 1
            if heredoc := HEREDOC.search(line):
                while i < len(lines) and lines[i].strip() != heredoc.group(1):
                    line += "\n" + lines[i]
                    i += 1
                line += "\n" + heredoc.group(1)
                i += 1
            elif re.match(r"(for|while|if)\b", line):
                while i < len(lines) and not re.match(r"(done|fi)\b", line.splitlines()[-1]):
                    line += "\n" + lines[i].strip()
                    i += 1
            found.append(line)
    return found


def documented() -> list[tuple[str, str]]:
    """(where, command) for every command of every doc, in order."""
    return [(f"{path.relative_to(ROOT)}", command)
            for path in DOCS for command in commands(path.read_text())]


RUN_HERE = [(where, c) for where, c in documented() if c not in ELSEWHERE]


def files_before(where: str, command: str) -> list[str]:
    """The here-documents the doc writes before ``command`` (a file the command reads): run
    first, since the tests of one doc may run apart and in any order (two pytest workers)."""
    earlier = [c for w, c in RUN_HERE if w == where]
    return [c for c in earlier[:earlier.index(command)] if HEREDOC.search(c.splitlines()[0])]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout's top level as links, with README.md and docs/ copied."""
    work = tmp_path_factory.mktemp("docs")
    for entry in ROOT.iterdir():
        if entry.name in ("README.md", "docs"):
            continue
        (work / entry.name).symlink_to(entry)
    shutil.copy(ROOT / "README.md", work / "README.md")
    shutil.copytree(ROOT / "docs", work / "docs")
    return work


def run(command: str, cwd: Path, log: Path) -> subprocess.CompletedProcess[str]:
    path = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(["bash", "-c", re.sub(r"\buv run ", "", command)], cwd=cwd,
                          env=noconnect.env(log, dict(os.environ, PATH=path)),
                          capture_output=True, text=True, timeout=300)


def test_the_docs_show_commands() -> None:
    """The extraction found the docs' commands at all (and the blocks inside list items)."""
    found = [c for _, c in documented()]
    assert len(DOCS) > 10 and len(found) > 20, found
    assert "uv run sglang-fleet check qwen3.6-27b-mtp" in found
    assert any(c.startswith("for k in 0 1 2; do\n") for c in found), found


@pytest.mark.parametrize(("where", "command"), RUN_HERE,
                         ids=[f"{w}:{c.splitlines()[0][:60]}" for w, c in RUN_HERE])
def test_the_command_runs(where: str, command: str, workdir: Path, tmp_path: Path) -> None:
    assert not NEEDS_HOSTS.search(command.replace("sglang-fleet", "")), (
        f"{where}: {command!r} looks like it needs the lab or a host: name the test that runs it "
        "in ELSEWHERE (tests/unit/test_docs_commands.py)")
    status, fragment = STATUS.get(command, (0, ""))
    log = tmp_path / "connections.log"
    for before in files_before(where, command):
        run(before, workdir, log)
    result = run(command, workdir, log)
    assert result.returncode == status, (where, command, result.stdout, result.stderr)
    assert fragment in result.stdout + result.stderr, (where, command, result.stderr)
    assert noconnect.attempts(log) == [], (where, command)


@pytest.mark.parametrize("command", sorted(ELSEWHERE))
def test_a_command_run_elsewhere_has_a_runner_that_exists(command: str) -> None:
    runner = ELSEWHERE[command]
    path, _, test = runner.partition("::")
    text = (ROOT / path).read_text()
    if test:
        assert re.search(rf"^(async )?def {re.escape(test)}\(", text, re.M), (
            f"{runner} (the runner of {command!r}) is not there")
    else:
        assert re.sub(r"\s+#.*", "", command).replace("sudo ", "") in text.replace(
            "uv run ruff", ""), f"{path} does not run {command!r}"


def test_every_command_run_elsewhere_is_still_in_the_docs() -> None:
    shown = {c for _, c in documented()}
    assert set(ELSEWHERE) - shown == set(), "ELSEWHERE names commands the docs no longer show"


def test_a_new_command_that_needs_a_host_fails_without_a_runner() -> None:
    """The check can fail: a roll the docs gain, not in ELSEWHERE, is refused before it runs."""
    new = commands("```sh\nuv run sglang-fleet roll inventories/b200.py --batch 2\n```\n")
    assert new == ["uv run sglang-fleet roll inventories/b200.py --batch 2"]
    assert new[0] not in ELSEWHERE
    assert NEEDS_HOSTS.search(new[0].replace("sglang-fleet", ""))


def test_the_secret_files_are_what_the_group_data_reads(tmp_path: Path) -> None:
    """The quick start's commands for the operator's secret files, run with ``/etc/sglang-fleet``
    in a scratch directory (and without sudo), make files of mode 0600 in a 0700 directory
    that the example group data reads as the keys and the S3 credentials."""
    etc = tmp_path / "etc-sglang-fleet"
    quickstart = commands((ROOT / "docs" / "quickstart.md").read_text())
    secret = [c for c in quickstart if "/etc/sglang-fleet" in c]
    assert len(secret) == 4 and all(c in ELSEWHERE for c in secret), secret
    aws = dict(os.environ, AWS_ACCESS_KEY_ID="AKIAEXAMPLE", AWS_SECRET_ACCESS_KEY="s" * 40)
    log = tmp_path / "connections.log"
    for command in secret:
        local = command.replace("sudo ", "").replace("/etc/sglang-fleet", str(etc))
        result = subprocess.run(["bash", "-c", local], env=noconnect.env(log, aws),
                                capture_output=True, text=True)
        assert result.returncode == 0, (command, result.stderr)
    assert noconnect.attempts(log) == []
    assert stat.S_IMODE(etc.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in etc.iterdir()} == {
        "sglang-api-key": 0o600, "sglang-router-admin-key": 0o600, "aws-credentials": 0o600}
    source = (ROOT / "inventories" / "group_data" / "b200.py").read_text()
    assert 'Path("/etc/sglang-fleet")' in source
    data: dict[str, object] = {}
    exec(compile(source.replace('"/etc/sglang-fleet"', repr(str(etc))), "b200.py", "exec"), data)
    secrets = data["secrets"]
    assert isinstance(secrets, dict) and set(secrets) == {"sglang-api-key",
                                                          "sglang-router-admin-key"}
    assert all(re.fullmatch(r"[0-9a-f]{64}", v) for v in secrets.values())
    assert (data["aws_access_key_id"], data["aws_secret_access_key"]) == ("AKIAEXAMPLE", "s" * 40)
