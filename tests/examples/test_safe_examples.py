"""The examples are safe to copy: the shipped and example profiles pin a commit (a branch is
warned about by check and the deploy), and no test, bench or demo reaches the example
inventory's hosts, whose addresses look real (``tests/noconnect.py``: the guards, and a scan
that every process started with the example inventory runs under one)."""

from __future__ import annotations

import ast
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_fleet import cli
from sglang_fleet.config import validators
from sglang_fleet.config.profile import load
from tests import noconnect
from tests.conftest import PROFILES, ROOT, free_port

EXAMPLE_PROFILES = sorted((ROOT / "examples" / "profiles").glob("*.yaml"))

# --- revisions: a commit, never a branch ------------------------------------------------------

@pytest.mark.parametrize("path", [*PROFILES, *EXAMPLE_PROFILES], ids=lambda p: p.stem)
def test_shipped_and_example_profiles_pin_a_commit(path: Path) -> None:
    source = load(path).model.source
    assert source.startswith("hf://") and validators.revision_warning(source) is None, source
    assert re.fullmatch(r"hf://[^@]+@[0-9a-f]{40}", source)


def test_check_warns_about_a_branch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = PROFILES[0].read_text()
    pinned = re.search(r"@([0-9a-f]{40})", text)
    assert pinned
    for revision in ("main", "v1.0"):
        path = tmp_path / f"{revision}.yaml"
        path.write_text(text.replace(pinned.group(0), f"@{revision}"))
        assert cli.main(["check", str(path)]) == 0  # valid: said, not refused
        out, err = capsys.readouterr()  # check: errors on stderr, warnings with the verdict
        assert "ok for SGLang" in out and err == ""
        assert out.startswith(f"warning: {path}: model.source: 'hf://Qwen/Qwen3.6-27B@"
                              f"{revision}' names a branch or a tag"), out
        assert "\n    fix: pin the commit" in out
    assert validators.revision_warning("s3://models/m") is None
    assert validators.revision_warning("/models/m") is None


def test_the_weights_stage_warns_about_a_branch(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_fleet.stages.weights import deploy as weights
    said: list[str] = []
    monkeypatch.setattr(weights, "logger", type("L", (), {"warning": said.append})())
    monkeypatch.setattr(weights, "host", type("H", (), {"print_prefix": "[b200-01] "})())
    profile = load(PROFILES[0], {"model.source": "hf://Qwen/Qwen3.6-27B@main"})

    class Stop(Exception):
        pass

    def stop() -> None:
        raise Stop

    monkeypatch.setattr(weights, "secrets_directory", stop)
    with pytest.raises(Stop):
        weights.stage_weights._inner(profile)
    assert said and said[0].startswith("[b200-01] model.source: 'hf://Qwen/Qwen3.6-27B@main' "
                                       "names a branch or a tag")


# --- the example inventory's hosts are never reached ------------------------------------------

SCANNED = ("tests", "bench", "scripts", "lab")
GUARD_FILES = {ROOT / "tests" / "noconnect.py", Path(__file__).resolve()}
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}


def names_example_inventory(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        bool(re.search(r"inventories/b200\.py|^b200\.py$", node.value))


def unguarded(source: str, filename: str) -> list[str]:
    """Each process started without ``env=noconnect.env(...)`` in a function (or module) that
    names the example inventory: such a process could reach the example's hosts."""
    tree = ast.parse(source, filename)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = {id(n) for f in functions for n in ast.walk(f)}
    # A module-level name (a constant a function may pass on) makes every process suspect.
    module_wide = any(names_example_inventory(n) for n in ast.walk(tree) if id(n) not in inside)
    found = []
    for scope in [tree] if module_wide else functions:
        own = list(ast.walk(scope))
        if not any(names_example_inventory(n) for n in own):
            continue
        for node in own:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in SUBPROCESS_CALLS
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in {"subprocess", "sp"}):
                continue
            guard = [k for k in node.keywords if k.arg == "env"
                     and "noconnect" in ast.unparse(k.value)]
            if not guard:
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)[:80]}")
    return sorted(set(found))


def test_no_process_a_test_starts_with_the_example_inventory_could_reach_its_hosts() -> None:
    wrong = []
    count = 0
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.resolve() in GUARD_FILES:
                continue
            text = path.read_text()
            count += "inventories/b200.py" in text
            wrong += unguarded(text, str(path.relative_to(ROOT)))
    assert count >= 2  # the scan sees the tests that use it (test_roll, test_inventories)
    assert wrong == [], "start these with env=noconnect.env(log) and assert no attempts"


def test_the_scan_finds_an_unguarded_process() -> None:
    bad = ("import subprocess\n"
           "def test_x():\n"
           "    subprocess.run(['sglang-fleet', 'status', 'inventories/b200.py'])\n"
           "def test_y(log):\n"
           "    subprocess.run(['sglang-fleet', 'roll', 'inventories/b200.py'],\n"
           "                   env=noconnect.env(log))\n")
    assert [w.split(":")[1] for w in unguarded(bad, "t.py")] == ["3"]


def test_the_example_hosts_are_refused_in_this_process() -> None:
    """conftest.py's guard: a connection to an example host fails at once, nothing is sent."""
    assert noconnect.example_addresses() == {"10.0.0.11", "10.0.0.12"}
    with socket.socket() as s, pytest.raises(ConnectionRefusedError, match="example inventory"):
        s.connect(("10.0.0.11", 22))


def test_a_guarded_process_reaches_only_this_machine(tmp_path: Path) -> None:
    log = tmp_path / "connections"
    port = free_port()
    script = ("import socket\n"
              f"for where in (('10.0.0.11', 22), ('127.0.0.1', {port})):\n"
              "    try:\n"
              "        socket.create_connection(where, timeout=1).close()\n"
              "    except OSError as exc:\n"
              "        print(where[0], type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=noconnect.env(log))
    lines = done.stdout.splitlines()
    assert lines[0].startswith("10.0.0.11 ConnectionRefusedError noconnect: refused"), lines
    assert lines[1].startswith("127.0.0.1 ConnectionRefusedError [Errno 111]"), lines  # sent
    assert noconnect.attempts(log) == ["('10.0.0.11', 22)"]
