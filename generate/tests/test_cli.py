"""``sglang-fleet-generate``: the package's own command line, in a python where the deploy
cannot be imported (pyinfra and sglang_fleet poisoned in sys.modules), against the simulator:
the package needs neither, and what it prints names its own program."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import Sims, sims, write_input

__all__ = ["sims"]  # the fixture, used by name
WITHOUT_DEPLOY = ("import sys; sys.modules['pyinfra'] = sys.modules['sglang_fleet'] = None; "
                  "from sglang_fleet_generate.cli import main; sys.exit(main())")


def standalone(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", WITHOUT_DEPLOY, *argv], capture_output=True,
                          text=True, timeout=120)


def test_help_without_the_deploy() -> None:
    for command, example in (("generate", "generate in.jsonl out/ --url"),
                             ("results", "results out/ > records.jsonl")):
        result = standalone(command, "--help")
        assert result.returncode == 0, result.stderr
        assert f"sglang-fleet-generate {example}" in result.stdout


def test_a_job_and_its_results_without_the_deploy(sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "4")
    inp, out = write_input(tmp_path / "in.jsonl", 5, max_tokens=2), tmp_path / "out"
    key = tmp_path / "key.txt"
    key.write_text("sk-local\n")
    result = standalone("generate", str(inp), str(out), "--url", url, "--json",
                        "--api-key-file", str(key))
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout.splitlines()[-1])
    assert (done["event"], done["records"]) == ("done", 5)
    assert done["results_command"] == f"sglang-fleet-generate results {out}"
    shown = standalone("results", str(out))
    assert shown.returncode == 0, shown.stderr
    assert sorted(json.loads(line)["id"] for line in shown.stdout.splitlines()) == \
        [f"r{i}" for i in range(5)]


def test_usage_and_key_errors_without_the_deploy(tmp_path: Path) -> None:
    """Refused before anything is sent: exit 2 for a value wrong as written (the password in
    a URL never echoed), 1 for a key file that is not one line."""
    refused = standalone("generate", "in.jsonl", "out", "--url", "http://u:hunter2@h:1")
    assert refused.returncode == 2 and "holds credentials" in refused.stderr
    assert "hunter2" not in refused.stderr
    key = tmp_path / "key.txt"
    key.write_text("two\nlines\n")
    refused = standalone("generate", "in.jsonl", "out", "--url", "http://h:1",
                         "--api-key-file", str(key))
    assert refused.returncode == 1
    assert refused.stderr == (f"error: {key}: the API key must be the file's only line, "
                              "printable ASCII without spaces\n    fix: put the key alone on "
                              "the file's one line\n")
