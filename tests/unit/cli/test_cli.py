from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_fleet import cli as cli_module
from sglang_fleet.cli import profile_commands
from tests.conftest import FIELD_PROFILE, MINIMAL, ROOT

Write = Callable[..., Path]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_fleet.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_render_json_for_three_releases() -> None:
    for version, strategy_flag in (("0.5.23", "--mamba-radix-cache-strategy"),
                                   ("0.5.12", "--mamba-scheduler-strategy"),
                                   ("0.5.10", "--mamba-scheduler-strategy")):
        result = cli("render", str(FIELD_PROFILE), "--sglang-version", version, "--format", "json")
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        assert out["argv"][:3] == ["python", "-m", "sglang.launch_server"]
        i = out["argv"].index(strategy_flag)
        assert out["argv"][i + 1] == "extra_buffer"
        assert ("SGLANG_ENABLE_SPEC_V2" in out["env"]) == (version == "0.5.10")


def test_render_shell_is_the_default() -> None:
    result = cli("render", str(FIELD_PROFILE))
    assert result.returncode == 0
    # instances: auto on the default 8 GPUs: the first server, on GPU 0 alone
    assert result.stdout.startswith("env CUDA_VISIBLE_DEVICES=0 python -m sglang.launch_server "
                                    "\\\n  --model-path ")


def test_render_divides_the_gpus_given() -> None:
    one = cli("render", str(FIELD_PROFILE), "--gpus", "1")
    assert one.returncode == 0 and one.stdout.startswith("python -m sglang.launch_server")
    bad = cli("render", str(FIELD_PROFILE), "--gpus", "0")
    assert bad.returncode == 2 and "--gpus: must be a number of GPUs" in bad.stderr


def test_check_field_failure_exits_1(write_profile: Write, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"]}))
    path = write_profile(MINIMAL + """
speculative: {algorithm: NEXTN, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}
mamba: {strategy: no_buffer}
""")
    result = cli("check", str(path), "--sglang-version", "0.5.12", "--model-config", str(config))
    assert result.returncode == 1
    assert "extra_buffer" in result.stderr and "Traceback" not in result.stderr


def test_check_ok() -> None:
    result = cli("check", str(FIELD_PROFILE))
    assert result.returncode == 0, result.stderr
    assert "ok for SGLang 0.5.23" in result.stdout


def test_misspelled_key_exits_1_without_traceback(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "servr:\n  port: 1\n")
    for command in ("render", "check"):
        result = cli(command, str(path))
        assert result.returncode == 1
        assert "servr" in result.stderr and "did you mean 'server'" in result.stderr
        assert "Traceback" not in result.stderr


def test_usage_error_exits_2() -> None:
    assert cli("render").returncode == 2
    assert cli("render", str(FIELD_PROFILE), "--format", "xml").returncode == 2
    assert cli("frobnicate").returncode == 2


def test_unknown_release_is_a_usage_error() -> None:
    """A release is judged from the option's text alone: exit 2, before the profile is read
    (an unsupported engine.version in the profile is a problem in it: exit 1)."""
    result = cli("render", str(FIELD_PROFILE), "--sglang-version", "0.4.0")
    assert result.returncode == 2 and result.stderr.startswith("usage: sglang-fleet render")
    assert "argument --sglang-version: SGLang 0.4.0 is not a supported release" in result.stderr


def test_internal_error_exits_3_with_the_traceback_in_a_file(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(args: object) -> int:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(profile_commands, "cmd_render", broken)
    code = cli_module.main(["render", str(FIELD_PROFILE)])
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1, err
    assert err.startswith("internal error") and "RuntimeError: kaboom" in err
    saved = Path(err.rsplit("traceback in ", 1)[1].strip())
    try:
        text = saved.read_text()
        assert text.startswith("Traceback") and "kaboom" in text and "broken" in text
    finally:
        saved.unlink()


def test_each_problem_is_an_error_line_with_its_fix(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "server: {port: 80, host: 'a b'}\n")
    result = cli("check", str(path))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: {path}: server.host: 'a b' is neither an IP address nor a host name"
    assert lines[1].startswith("    fix: ") and lines[2].startswith(f"error: {path}: server.port")
    assert len(lines) == 4


def test_insecure_index_needs_the_flag(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "engine: {index_url: 'http://10.0.0.2/simple'}\n")
    refused = cli("render", str(path))
    assert refused.returncode == 1 and "plain http" in refused.stderr
    assert cli("render", str(path), "--allow-insecure-urls").returncode == 0


def test_render_shows_a_targets_first_start(write_profile: Write) -> None:
    """memory.target_running_requests renders --max-running-requests, never a size (the size
    is the host's, from the log of a start)."""
    text = FIELD_PROFILE.read_text().replace("  context_length: 262144\n",
                                             "  context_length: 262144\n"
                                             "  target_running_requests: 64\n")
    result = cli("render", str(write_profile(text)), "--format", "json")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert argv[argv.index("--max-running-requests") + 1] == "64"
    assert "--max-mamba-cache-size" not in argv and "--target-running-requests" not in argv
