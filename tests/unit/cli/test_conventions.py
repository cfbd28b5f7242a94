"""The command line's conventions: --version, shell completion, every command's help (what it
does and examples), and usage errors: every option value that is wrong as written exits 2 with
argparse's usage and the problem (or, under --json, the problem as JSON), before anything is
read."""

from __future__ import annotations

import argparse
import json
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from sglang_fleet import cli
from tests.conftest import FIELD_PROFILE, ROOT

PROFILE = str(FIELD_PROFILE)
INVENTORY = "inventory.py"  # never read: each case stops before the inventory is loaded


def commands() -> dict[str, argparse.ArgumentParser]:
    """The product's subcommands (the lab's are its own package's) by name."""
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p for name, p in sub.choices.items() if name not in cli.LAB_COMMANDS}


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"sglang-fleet {metadata.version('sglang-fleet')}\n"
    assert metadata.version("sglang-fleet") == pyproject
    from sglang_fleet import __version__

    assert __version__ == pyproject


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_names_every_command(shell: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "sglang-fleet" in script
    for name in [*commands(), *cli.LAB_COMMANDS]:
        assert name in script, f"{shell} completion lacks {name}"
    for option in ("--sglang-version", "--batch-instances", "--api-key-file", "--worker"):
        assert option in script
    if shell == "bash":  # bash itself reads it
        (tmp_path / "completion.bash").write_text(script)
        result = subprocess.run(["bash", "-n", str(tmp_path / "completion.bash")],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_completion_of_an_unknown_shell_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "fish"]) == 2
    assert "argument shell: invalid choice: 'fish'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_has_a_description_and_examples(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = commands()[name]
    assert parser.description and len(parser.description) > 40, name
    assert parser.epilog and parser.epilog.startswith("examples:\n"), name
    examples = parser.epilog.split("\n\n")[0].splitlines()[1:]  # exit status may follow
    assert examples and all(f"sglang-fleet {name}" in line for line in examples), examples
    assert cli.main([name, "--help"]) == 0
    shown = capsys.readouterr().out
    assert " ".join(parser.description.split(".")[0].split()) in " ".join(shown.split())
    assert max(len(line) for line in parser.description.splitlines()) <= 88
    assert f"examples:\n  {examples[0].strip()}" in shown  # as written, not rewrapped


# Every option whose value can be wrong as written, per command: (argv, what the error says).
USAGE_ERRORS = [
    (["render", PROFILE, "--gpus", "0"], "argument --gpus: must be a number of GPUs"),
    (["render", PROFILE, "--format", "xml"], "argument --format: invalid choice"),
    (["render", PROFILE, "--sglang-version", "0.4.0"],
     "argument --sglang-version: SGLang 0.4.0 is not a supported release"),
    (["render"], "the following arguments are required: profile"),
    (["check", PROFILE, "--sglang-version", ""], "argument --sglang-version: is empty"),
    (["check", PROFILE, "--gpus", "2000"], "argument --gpus: must be a number of GPUs"),
    (["check", PROFILE, "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["capacity", "-", "--sglang-version", "0.5.99"],
     "argument --sglang-version: SGLang 0.5.99 is not a supported release"),
    (["smoke", "10.0.0.1:30000"], "argument URL: '10.0.0.1:30000' is not an http(s) URL"),
    (["smoke", "http://user:secret@h:1"], "argument URL: 'http://h:1' holds credentials"),
    (["roll", INVENTORY, "--batch", "0"], "argument --batch: must be a count of at least 1 "
     "or a percentage from 1% to 100%, got '0'"),
    (["roll", INVENTORY, "--batch", "two"], "argument --batch: must be a count of at least 1"),
    (["roll", INVENTORY, "--batch", "0%"], "a percentage from 1% to 100%, got '0%'"),
    (["roll", INVENTORY, "--max-unavailable", "101%"], "argument --max-unavailable: must be "
     "a count of at least 1 or a percentage from 1% to 100%, got '101%'"),
    (["roll", INVENTORY, "--tolerate", "-1"], "argument --tolerate: must be a count of at "
     "least 0"),
    (["roll", INVENTORY, "--parallel", "0"], "argument --parallel: must be at least 1"),
    (["roll", INVENTORY, "--batch-instances", "0"],
     "argument --batch-instances: must be at least 1, got 0"),
    (["roll", INVENTORY, "--batch-instances", "-2"],
     "argument --batch-instances: must be at least 1, got -2"),
    (["roll", INVENTORY, "--data", "novalue"], "argument --data: novalue: not key=value"),
    (["roll", INVENTORY, "--data", "bad key=1"], "argument --data: bad key=1: 'bad key' is "
     "not a data key"),
    (["roll", INVENTORY, "--data", "sglang.model.served_name=a\nb"],
     "argument --data: sglang.model.served_name: the value contains a control character"),
    (["roll", INVENTORY, "--drain-timeout", "nan"],
     "argument --drain-timeout: must be seconds from 0 to 86400, got 'nan'"),
    (["roll", INVENTORY, "--drain-timeout", "86401"], "must be seconds from 0 to 86400"),
    (["roll", INVENTORY, "--health-timeout", "-1"],
     "argument --health-timeout: must be seconds from 0 to 86400, got '-1'"),
    (["status"], "the following arguments are required: inventory"),
    (["generate", "in.jsonl", "out"], "the following arguments are required: --url"),
    (["generate", "in.jsonl", "out", "--url", "10.0.0.10:30080"],
     "argument --url: '10.0.0.10:30080' is not an http(s) URL"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--concurrency", "0"],
     "argument --concurrency: must be at least 1, got 0"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--shard-size", "0"],
     "argument --shard-size: must be at least 1, got 0"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--retries", "-1"],
     "argument --retries: must be at least 0, got -1"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--timeout", "0"],
     "argument --timeout: must be seconds of at least 1, got '0'"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--worker", "4/4"],
     "argument --worker: '4/4': write K/N"),
    (["generate", "in.jsonl", "out", "--url", "http://r:1", "--s3-endpoint", "s3.local:9000"],
     "argument --s3-endpoint: 's3.local:9000' is not an http(s) URL"),
    (["results", "out", "--s3-endpoint", "ftp://s3"],
     "argument --s3-endpoint: 'ftp://s3' is not an http(s) URL"),
    (["frobnicate"], "argument command: invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize("argv,says", USAGE_ERRORS, ids=[" ".join(a)[:60] for a, _ in
                                                          USAGE_ERRORS])
def test_an_option_wrong_as_written_is_a_usage_error(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: sglang-fleet"), err
    assert says in err, err
    assert "user:secret" not in err  # a URL's password is never said


@pytest.mark.parametrize("argv", [
    ["check", PROFILE, "--json", "--gpus", "0"],
    ["roll", INVENTORY, "--batch", "0", "--json"],
    ["status", INVENTORY, "--json", "--frobnicate"],
])
def test_under_json_a_usage_error_is_json(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err == ""
    problem = json.loads(out)["errors"][0]
    assert set(problem) == {"source", "key", "problem", "fix"}
    assert problem["source"] == f"sglang-fleet {argv[0]}"
    assert problem["fix"] == f"see sglang-fleet {argv[0]} --help for its usage"
    assert problem["key"] in ("--gpus", "--batch", "")


# --- --json: check, roll and status say their errors as JSON too ---------------------------

@pytest.mark.parametrize("command", ["roll", "status"])
def test_under_json_an_input_problem_is_json(command: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.py")
    assert cli.main([command, missing, "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out) == {"errors": [{
        "source": missing, "key": "", "problem": "no such inventory file",
        "fix": "give a pyinfra inventory, e.g. inventories/b200.py"}]}
    assert cli.main([command, missing]) == 1  # without --json: the lines, as always
    assert capsys.readouterr().err.startswith(f"error: {missing}: no such inventory file\n")


def test_under_json_an_internal_error_is_json_too(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from sglang_fleet.cli import fleet_commands

    def broken(args: object) -> int:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(fleet_commands, "cmd_status", broken)
    monkeypatch.setattr(cli, "_parser", _parser_with(fleet_commands, "status"))
    assert cli.main(["status", INVENTORY, "--json"]) == 3
    out, err = capsys.readouterr()
    problem = json.loads(out)["errors"][0]
    assert problem["problem"] == "internal error: RuntimeError: kaboom"
    saved = Path(err.rsplit("traceback in ", 1)[1].strip())
    assert problem["fix"].endswith(f"traceback in {saved}")
    saved.unlink()


def _parser_with(module: object, name: str) -> object:
    """cli._parser, its ``name`` command calling the module's (patched) function."""
    real = cli._parser

    def parser() -> object:
        made = real()
        made.commands[name].set_defaults(func=getattr(module, f"cmd_{name}"))
        return made

    return parser


def test_roll_json_is_what_the_roll_did(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--json: the runs' output, the table and the fleet's lines on stderr; stdout one object:
    ok, each host's outcome, the fleet (or why it was not read), the --data warning."""
    from types import SimpleNamespace

    from sglang_fleet.cli.fleet_commands import roll_as_json
    from sglang_fleet.fleet import cutover
    from sglang_fleet.fleet import inventory as fleet
    from tests.unit.roll.test_roll import URLS, FakeRouter, Runs, make

    router = FakeRouter({u[0]: True for u in URLS.values()})
    monkeypatch.setattr(fleet, "routers", lambda inventory: [SimpleNamespace(api=lambda: router)])
    monkeypatch.setattr(cutover, "drained", lambda url, timeout: (True, 0))
    ok, document = roll_as_json(make(router, Runs(("serve", "h2"))))
    out, err = capsys.readouterr()
    assert out == "" and "h2: failed; back to the last good release" in err
    assert "fleet: not read: inv.py: : no such inventory file" in err  # as roll.main says it
    assert not ok and document["ok"] is False and document["errors"] == []
    assert [(h["host"], h["result"]) for h in document["hosts"]] == [
        ("h1", "converged"), ("h2", "failed, last good release serving again"),
        ("h3", "untouched")]
    assert set(document["hosts"][0]) == {"host", "result", "seconds", "out_seconds",
                                         "still_out", "notes", "waves", "cause"}
    assert document["hosts"][1]["cause"] == "its deploy failed (its output above)"
    assert document["cause"] == "host 2 of 3 h2: its deploy failed (its output above)"
    assert document["fleet"]["not_read"][0]["problem"] == "no such inventory file"
    warning = document["warnings"][0]
    assert warning["source"] == "--data" and warning["problem"].startswith(
        "--data sglang.memory.page_size=64 is applied to the hosts but is not in the inventory")
    json.dumps(document)  # all of it JSON
