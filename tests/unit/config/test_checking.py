"""One check: ``render`` refuses what ``check`` refuses, ``check`` says every problem of every
phase in one run (and why a phase could not run), a missing architecture is a warning naming
the rules it skipped, and ``check --inventory`` checks every host's profile and host data
without connecting, each problem once with the hosts that share it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import cli, hostconfig
from sglang_fleet.cli import fleet_check, output
from sglang_fleet.config import checking, keys, preflight, profile, validators
from sglang_fleet.config.profile import Profile
from sglang_fleet.errors import InputError
from sglang_fleet.hostconfig import preflight as host_preflight
from tests.conftest import FIELD_PROFILE, ROOT
from tests.conftest import MINIMAL as SHORT_REVISION
from tests.unit.cli.test_input_corpus import PROFILE_CASES, _expand

Write = Callable[..., Path]
QWEN = "Qwen3_5ForConditionalGeneration"
MTP_MISSPELLED = "speculative: {algorithm: MTP, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}\n"

# A commit, as a profile should pin: a branch or tag would add its own warning here.
MINIMAL = SHORT_REVISION.replace("@0123abc", "@" + "0123abcd" * 5)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


# --- render refuses what check refuses ---------------------------------------------------

def test_render_refuses_what_check_refuses(write_profile: Write,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: render printed a command line SGLang refuses at startup."""
    path = str(write_profile(MINIMAL + MTP_MISSPELLED))
    code, out, err = run(["render", path], capsys)
    assert code == 1 and out == ""
    assert f"error: {path}: speculative.algorithm: Unknown speculative algorithm name: MTP" \
        in err
    assert errors(err) == errors(run(["check", path], capsys)[2])


CHECK_CASES = [c for c in PROFILE_CASES if c.args[0] == "check" and not c.usage]


@pytest.mark.parametrize("case", CHECK_CASES, ids=lambda c: c.name)
def test_render_and_check_say_the_same_errors(case: Any, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = _expand(case, tmp_path)
    checked, _, check_err = run(argv, capsys)
    rendered, _, render_err = run(["render", *argv[1:]], capsys)
    assert (checked, errors(check_err)) == (rendered, errors(render_err)), case.name


# --- every problem of every phase, in one run --------------------------------------------

def test_one_run_says_the_problems_of_every_phase(write_profile: Write,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A refused value (validation), a flag the release lacks (render) and a rule SGLang
    enforces at startup (preflight), all at once; the rules ran with the refused keys at their
    defaults, which a note says."""
    path = str(write_profile(MINIMAL + MTP_MISSPELLED + "memory: {page_size: sixty}\n"
                             "extra_args: [--frobnicate]\n"))
    code, out, err = run(["check", path], capsys)
    assert code == 1
    assert [line.split(": ")[2] for line in errors(err)] == [
        "memory.page_size", "extra_args", "speculative.algorithm"]
    assert "SGLang 0.5.23 has no flag --frobnicate" in err
    assert (f"note: {path}: render, SGLang's startup rules: ran with extra_args, "
            "memory.page_size at their defaults in place of the refused values above") in out


def test_a_later_phase_says_nothing_about_a_key_at_its_default(
        write_profile: Write, capsys: pytest.CaptureFixture[str]) -> None:
    """mamba.strategy refused: the rules run with auto, and say nothing about mamba.strategy
    (that would be about auto, not the profile's value)."""
    path = str(write_profile(MINIMAL + f"  architecture: {QWEN}\n" + MTP_MISSPELLED.replace(
        "MTP", "NEXTN") + "mamba: {strategy: extra_buffer_eager}\nscheduler: "
        "{linear_attn_backend: flashinfer}\n"))
    code, _, err = run(["check", path, "--sglang-version", "0.5.23"], capsys)
    assert code == 1
    assert [line.split(": ")[2] for line in errors(err)] == ["mamba.strategy"]


@pytest.mark.parametrize("text,phase,why", [
    ("- a list\n", "", "not checked further: the profile could not be read"),
    (MINIMAL + "engine: {version: '0.4.0'}\n", "render, SGLang's startup rules",
     "not run: engine.version is refused (above)"),
    ("model: {source: /m, served_name: m, config: /nonexistent/config.json}\n"
     + MTP_MISSPELLED, "SGLang's hybrid-model rules",
     "not applied: the model's config.json could not be read (above)"),
    (MINIMAL.replace("qwen3.6-27b\n", "qwen3.6-27b\n  architecture: 'Qwen 3'\n"),
     "SGLang's hybrid-model rules", "not applied: model.architecture refused (above)"),
])
def test_a_phase_that_cannot_run_says_why(text: str, phase: str, why: str, write_profile: Write,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_profile(text))
    code, out, err = run(["check", path], capsys)
    assert code == 1 and errors(err)
    assert f"note: {path}: {phase + ': ' if phase else ''}{why}" in out, out
    assert "warning:" not in out  # the architecture is unknown for a reason said already
    if "MTP" in text:  # the rules that need no architecture still ran
        assert "Unknown speculative algorithm name: MTP" in err


def test_a_refused_required_key_stands_in_and_the_rest_is_checked(
        write_profile: Write, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_profile("model: {served_name: m}\n" + MTP_MISSPELLED))
    code, out, err = run(["check", path], capsys)
    assert code == 1
    assert [line.split(": ")[2] for line in errors(err)] == [
        "model.source", "speculative.algorithm"]
    assert "model.source at its default" in out


def test_every_required_key_has_a_stand_in_its_check_accepts() -> None:
    required = [spec for spec in keys.declared(Profile) if spec.default is keys.REQUIRED]
    assert {spec.name for spec in required} == set(profile.STAND_INS)
    for spec in required:
        value = profile.STAND_INS[spec.name]
        assert spec.check is None or spec.check(value, {}) is None, spec.name
        assert validators.text_problem(value) is None


# --- the architecture --------------------------------------------------------------------

def test_no_architecture_is_a_warning_naming_the_rules_skipped(
        write_profile: Write, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_profile(MINIMAL))
    code, out, err = run(["check", path], capsys)
    assert code == 0 and err == ""
    warning, fix, ok = out.splitlines()
    assert warning.startswith(f"warning: {path}: model.architecture: no architecture known (no "
                              "model.architecture, model.config or --model-config), so SGLang "
                              "0.5.23's hybrid-model rules were skipped: ")
    for rule in preflight.architecture_rules("0.5.23"):
        assert rule in warning
    assert "mamba.track_interval" in warning and "memory.page_size" in warning
    assert fix.startswith("    fix: set model.architecture to the architectures[0]")
    assert ok == f"{path}: ok for SGLang 0.5.23 (no architecture known: hybrid-model rules " \
                 "skipped)"
    # render says it on stderr: its standard output is the launch alone
    code, out, err = run(["render", path], capsys)
    assert code == 0 and out.startswith("python -m sglang.launch_server")
    assert err.startswith(f"warning: {path}: model.architecture: no architecture known")


def test_the_rules_named_are_the_releases() -> None:
    old, new = preflight.architecture_rules("0.5.12"), preflight.architecture_rules("0.5.23")
    assert any("speculative decoding with the radix cache" in r for r in old)
    assert not any("no_buffer" in r for r in old)
    assert any("no_buffer: memory.page_size 1" in r for r in new)
    assert any("without mamba layers" in r for r in new)
    assert not any("without mamba layers" in r for r in preflight.architecture_rules("0.5.20"))
    assert any("lazy" in r for r in preflight.architecture_rules("0.5.14"))


def test_a_class_outside_the_release_is_a_warning_too(
        write_profile: Write, capsys: pytest.CaptureFixture[str]) -> None:
    """--model-impl serves classes outside SGLang's registry: whether one is hybrid is not
    known, so its rules are skipped, said."""
    path = str(write_profile(MINIMAL + "  architecture: MyHybridForCausalLM\n"
                             "extra_args: [--model-impl, transformers]\n"))
    code, out, _ = run(["check", path], capsys)
    assert code == 0
    assert (f"warning: {path}: model.architecture: MyHybridForCausalLM is not a class SGLang "
            "0.5.23 serves natively") in out


def test_a_known_architecture_has_no_warning(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["check", str(FIELD_PROFILE)], capsys)
    assert code == 0 and err == "" and out == f"{FIELD_PROFILE}: ok for SGLang 0.5.23 ({QWEN})\n"


# --- --json ------------------------------------------------------------------------------

def test_check_json(write_profile: Write, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["check", str(FIELD_PROFILE), "--json"], capsys)
    assert code == 0 and err == ""
    assert json.loads(out) == {"profile": str(FIELD_PROFILE), "ok": True,
                               "sglang_version": "0.5.23", "architecture": QWEN, "errors": [],
                               "warnings": [], "notes": []}
    path = str(write_profile(MINIMAL + MTP_MISSPELLED))
    code, out, err = run(["check", path, "--json"], capsys)
    document = json.loads(out)
    assert code == 1 and err == "" and document["ok"] is False
    assert document["errors"] == [{
        "source": path, "key": "speculative.algorithm",
        "problem": "Unknown speculative algorithm name: MTP",
        "fix": document["errors"][0]["fix"]}]
    assert document["warnings"][0]["key"] == "model.architecture"
    code, out, err = run(["check", str(ROOT / "nope.yaml"), "--json"], capsys)
    assert code == 1 and json.loads(out)["errors"][0]["problem"].startswith("cannot read")


# --- --inventory -------------------------------------------------------------------------

def host(inventory_data: dict[str, Any], **data: Any) -> Any:
    inv = Inventory(  # type: ignore[no-untyped-call]
        ([("h1", data), ("h2", {})], {}),
        b200=(["h1", "h2"], {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8,
                             **inventory_data}))
    return inv.get_host("h1"), inv.get_host("h2")


def test_a_hosts_data_and_its_profile_in_one_run() -> None:
    """The deploy's reading stops at the host data; the profile's phases still run."""
    h1, _ = host({}, gpu_count=0, **{"sglang.speculative.algorithm": "MTP",
                                     "sglang.memory.page_size": "sixty"})
    report = fleet_check.serving_host(h1)
    assert [(p.source, p.key) for p in report.errors] == [
        ("pyinfra data of h1", "gpu_count"), ("pyinfra data of h1", "memory.page_size"),
        ("pyinfra data of h1", "speculative.algorithm")]
    assert any(n.key == "parallel.instances" and "no usable gpu_count" in n.message
               for n in report.notes)


def test_each_problem_once_with_the_hosts_that_share_it() -> None:
    h1, h2 = host({"sglang.speculative.num_draft_tokens": 7})
    merged = fleet_check.merge({h.name: fleet_check.serving_host(h) for h in (h1, h2)})
    [problem] = merged.errors
    assert (problem.source, problem.key) == ("group data of b200 (hosts h1, h2)",
                                             "speculative.num_draft_tokens")
    assert problem.fix == "set speculative.num_draft_tokens: 4"


def test_a_fine_host_is_rendered_for_its_gpus() -> None:
    h1, _ = host({}, gpu_count=2, **{"sglang.parallel.tp": 2})
    report = fleet_check.serving_host(h1)
    assert report.ok and report.warnings == [] and report.notes == []
    assert report.profile is not None and report.profile.parallel.instances == 1
    assert report.launch is not None and report.launch.version == "0.5.23"


def test_more_instances_than_gpus_is_said_per_host() -> None:
    h1, _ = host({"sglang.parallel.instances": 4, "sglang.parallel.tp": 4})
    report = fleet_check.serving_host(h1)
    assert [p.key for p in report.errors] == ["parallel.instances"]
    assert "4 instance(s) of tp x dp = 4 GPUs need 16, h1 has 8" in report.errors[0].message


def test_check_runs_the_deploys_own_checks() -> None:
    """``check --inventory``, a roll's planning and the deploy run one list of checks
    (hostconfig/preflight.py): a gRPC host without an allow-list got "ok" from check and was
    refused by the deploy (issue 45); a multi-node group without one is refused by both now."""
    grpc = {"sglang.server.router_connection": "grpc", "sglang.server.api_key_secret": None}
    h1, _ = host(grpc)
    report = fleet_check.serving_host(h1)
    assert [(p.source, p.key) for p in report.errors] == [
        ("pyinfra data of h1", "sglang_allowed_clients")]
    assert "gRPC mode" in report.errors[0].message
    with pytest.raises(InputError) as refused:
        host_preflight.launches(h1, hostconfig.profile_for(h1), host_preflight.Facts(gpu_count=8))
    assert [(p.source, p.key) for p in refused.value.problems] == [
        (p.source, p.key) for p in report.errors]
    fine, _ = host({**grpc, "sglang_allowed_clients": ["10.0.0.0/24"]})
    assert fleet_check.serving_host(fine).ok


_RUNNER = """
import contextlib, io, json, sys
from sglang_fleet import cli
results = []
for args in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = cli.main(args)
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


SECRETS = {"sglang-api-key": "k" * 24, "sglang-router-admin-key": "a" * 24}


def test_check_inventory_through_the_command(tmp_path: Path) -> None:
    """In a process of its own: loading an inventory imports pyinfra_cli (gevent)."""
    fine = tmp_path / "fine.py"
    fine.write_text(
        "hosts = [('b200-01', {'gpu_count': 8, 'sglang.memory.page_size': 64}), "
        "('b200-02', {'gpu_count': 8})]\nrouters = ['b200-01']\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        f"sglang_profile = 'qwen3.6-27b-mtp'\nsecrets = {SECRETS!r}\n")
    (tmp_path / "other").mkdir()  # away from the group data above
    bad = tmp_path / "other" / "bad.py"
    bad.write_text(f"hosts = [('h1', {{'sglang_profile': {str(FIELD_PROFILE)!r}, "
                   "'gpu_count': 8, 'sglang.speculative.algorithm': 'MTP'}), "
                   f"('h2', {{'sglang_profile': {str(FIELD_PROFILE)!r}}})]\n"
                   "routers = [('r1', {'router_port': 80})]\n")
    argvs = [
        ["check", "--inventory", str(fine)],
        ["check", "--inventory", str(fine), "--json"],
        ["check", "--inventory", str(fine), "--data", "sglang.speculative.num_draft_tokens=7"],
        ["check", "--inventory", str(bad)],
        ["check", "--inventory", str(tmp_path / "nope.py"), "--json"],
    ]
    run = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(argvs),
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    (ok, ok_out, ok_err), (js, js_out, _), (data, _, data_err), (fails, fails_out, fails_err), \
        (missing, missing_out, _) = json.loads(run.stdout.splitlines()[-1])
    assert (ok, ok_err) == (0, "")
    assert ok_out == f"{fine}: ok: 2 serving hosts (b200-01, b200-02), SGLang 0.5.23\n"
    document = json.loads(js_out)
    assert js == 0 and document["ok"] and document["errors"] == []
    assert [(h["host"], h["serving"], h["architecture"]) for h in document["hosts"]] == [
        ("b200-01", True, QWEN), ("b200-02", True, QWEN)]
    # a problem both hosts have: said once, naming them
    [shared] = errors(data_err)
    assert data == 1 and shared.startswith("error: --data (hosts b200-01, b200-02): "
                                           "speculative.num_draft_tokens: with eagle_topk 1")
    # every host's problems, each of its own kind: its profile, its data, a router's data
    said = errors(fails_err)
    assert fails == 1 and "Traceback" not in fails_err
    assert fails_out == ("note: pyinfra data of h2: parallel.instances: auto, and no usable "
                         "gpu_count (above): the rules were applied to one server\n"
                         "    fix: correct the errors above and run check again\n")
    assert f"error: {bad} (host h1): speculative.algorithm: Unknown speculative algorithm " \
           "name: MTP" in said
    assert any(line.startswith("error: pyinfra data of r1: router_port: must be a port")
               for line in said), said
    assert any(line.startswith(f"error: {FIELD_PROFILE} (host h2): parallel.instances: ")
               and "gpu_count" in line for line in said), said
    assert missing == 1 and json.loads(missing_out)["errors"][0]["problem"] == \
        "no such inventory file"


@pytest.mark.parametrize("argv,says", [
    (["check"], "give a profile (a file or a shipped profile's name), or --inventory"),
    (["check", str(FIELD_PROFILE), "--inventory", "inventories/b200.py"],
     "give a profile or --inventory, not both"),
    (["check", "--inventory", "inventories/b200.py", "--gpus", "4"],
     "--gpus: for one profile; with --inventory each host's data decides"),
    (["check", "--inventory", "inventories/b200.py", "--sglang-version", "0.5.12",
      "--model-config", "c.json"], "--sglang-version, --model-config: for one profile"),
    (["check", str(FIELD_PROFILE), "--data", "sglang.memory.page_size=64"],
     "--data goes with --inventory"),
])
def test_check_options_that_do_not_go_together(argv: list[str], says: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and err.startswith("usage: sglang-fleet check")
    assert f"sglang-fleet check: error: {says}" in err
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 2 and err == "" and json.loads(out)["errors"][0]["problem"].startswith(says)


def test_the_report_as_json_has_every_part() -> None:
    report = checking.check_profile(FIELD_PROFILE)
    assert set(output.report_json(report)) == {"ok", "sglang_version", "architecture", "errors",
                                            "warnings", "notes"}


def test_an_override_is_named_by_the_file_that_wrote_it(tmp_path: Path) -> None:
    """Issue 45: an override the profile's rules refuse named the shipped profile under src/,
    which the operator would edit in vain, and one the key's check refuses "pyinfra data of"
    the host; each names the inventory or group-data file that wrote it now."""
    inventory = tmp_path / "fleet.py"
    inventory.write_text("hosts = [('b200-01', {'gpu_count': 8, 'sglang.mamba.strategy': "
                         "'no_buffer'}), ('b200-02', {'gpu_count': 8})]\n")
    (tmp_path / "group_data").mkdir()
    group_file = tmp_path / "group_data" / "all.py"
    group_file.write_text(f"sglang_profile = 'qwen3.6-27b-mtp'\nsecrets = {SECRETS!r}\n"
                          "sglang_overrides = {'memory': {'max_running_requests': 0}}\n")
    run = subprocess.run([sys.executable, "-c", _RUNNER],
                         input=json.dumps([["check", "--inventory", str(inventory)]]),
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    [(code, _, err)] = json.loads(run.stdout.splitlines()[-1])
    said = errors(err)
    assert code == 1 and "profiles/qwen3.6-27b-mtp.yaml" not in err, said
    assert f"error: {group_file} (hosts b200-01, b200-02): memory.max_running_requests: must " \
           "be at least 1, got 0" in said
    # a rule between keys: the files whose overrides changed the profile (the file alone passes)
    assert any(line.startswith(f"error: {group_file}, {inventory} (host b200-01): "
                               "scheduler.overlap_schedule: no_buffer do not support overlap")
               for line in said), said
