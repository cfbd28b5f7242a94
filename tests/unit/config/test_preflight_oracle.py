"""Differential test: preflight and the simulator against each release's real ``ServerArgs``.

For every supported release, a matrix of profiles (architecture x speculative decoding x mamba
strategy x radix cache x overlap schedule x page size x track interval) is rendered to the
release's argv and resolved three ways: by SGLang's own ``ServerArgs`` (scripts/sglang_oracle.py
``construct``: the real code, its platform and GPU queries answered as an 8 x B200 host answers
them), by ``preflight.check`` and by the simulator's ``rules.resolve``. They must agree on
accepted or refused, and on the message where SGLang has one. All command lines of a release go to
one oracle subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang_sim import args as sim_args
from sglang_sim import rules as sim_rules

from sglang_fleet.config import flags, preflight, profile, releases
from sglang_fleet.config.render import GRPC_PORT_WITH_KEY, render
from tests.conftest import ROOT

pytestmark = pytest.mark.oracle

# Hybrid with extra_buffer on every release; hybrid with extra_buffer from 0.5.19; hybrid that
# never has extra_buffer; dense.
ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "JetNemotronForCausalLM",
         "LlamaForCausalLM")
ALWAYS_HYBRID = "Qwen3_5ForConditionalGeneration"
PER_RELEASE = 40  # command lines drawn from the matrix for each release (18 releases: 720)
SPEC = {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


@dataclass(frozen=True)
class Case:
    arch: str
    spec: bool
    strategy: str
    radix: bool
    overlap: bool
    page: int | None
    track: int | None

    def profile_text(self, version: str) -> str:
        doc: dict[str, Any] = {
            "engine": {"version": version},
            "model": {"source": "hf://Qwen/Qwen3.6-27B@0123abc", "served_name": "m",
                      "architecture": self.arch},
            "mamba": {"strategy": self.strategy},
            # An explicit attention backend: on sm100 the Qwen3.5 overrides otherwise pick one
            # and rewrite the page size with it (model_overrides/qwen3_5.py, 0.5.19+).
            "scheduler": {"radix_cache": self.radix, "overlap_schedule": self.overlap,
                          "attention_backend": "triton"},
        }
        if self.spec:
            doc["speculative"] = SPEC
        if self.track is not None:
            doc["mamba"]["track_interval"] = self.track
        if self.page is not None:
            doc["memory"] = {"page_size": self.page}
        return yaml.safe_dump(doc)


def strategies(version: str) -> list[str]:
    table = flags.load(version)
    option = table.option_for("mamba_radix_cache_strategy") or "--mamba-scheduler-strategy"
    return [str(c) for c in table.flags[option].choices or ()]


def matrix(version: str) -> list[Case]:
    """PER_RELEASE cases drawn (seeded by the release) from the full product, plus the field's
    own line; every release sees a different slice of the product."""
    # Only models the release serves: for the others the model loader refuses before any mamba
    # rule matters, and rendering says so (releases.architecture_problem).
    served = [a for a in ARCHS if releases.architecture_problem(a, version) is None]
    full = [Case(*c) for c in product(served, (True, False), strategies(version), (True, False),
                                      (True, False), (None, 64, 96), (None, 2, 288))]
    picked = random.Random(version).sample(full, PER_RELEASE - 1)
    return [Case(ALWAYS_HYBRID, True, "extra_buffer", True, True, None, None), *picked]


def real_server_args(version: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if shutil.which("uv") is None:
        pytest.fail("the SGLang oracle needs uv on PATH (pip install uv); .ci/run installs it")
    work = os.environ.get("SGLANG_FLEET_ORACLE_WORK")
    extra = ["--work", work] if work else []
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sglang_oracle.py"), *extra, "construct",
         version], input=json.dumps(cases), capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"the oracle could not run SGLang {version}'s ServerArgs:\n"
                    f"{result.stderr[-3000:]}")
    answers: list[dict[str, Any]] = json.loads(result.stdout)
    return answers


def preflight_verdict(version: str, case: Case, tmp: Path) -> tuple[list[str], Any]:
    path = tmp / "p.yaml"
    path.write_text(case.profile_text(version))
    p = profile.load(path)
    launch = render(p, version)
    return [x.message for x in preflight.check_server_args(p, launch, case.arch)], launch


def simulator_verdict(version: str, argv: list[str], env: dict[str, str], arch: str) -> str | None:
    """None when the simulator starts; else its exception as 'Type: message'."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        ns = sim_args.parse(argv, version)
        sim_rules.resolve(ns, arch, version, sim_args.table(version)["speculative_algorithms"])
        return None
    except (ValueError, AssertionError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class Run:
    """One release's matrix: the cases, preflight's verdicts and the oracle's answers."""

    cases: list[Case]
    verdicts: list[tuple[list[str], Any]]
    answers: list[dict[str, Any]]


def run(version: str, tmp: Path) -> Run:
    """One release's matrix through preflight and one oracle subprocess. Per test, not a
    shared fixture: xdist spreads these tests over its workers one by one, and a module
    fixture would run every release's oracle on each worker (and again each time a worker
    came back to the module)."""
    cases = matrix(version)
    verdicts = [preflight_verdict(version, c, tmp) for c in cases]
    payload = [{"argv": list(launch.argv[3:]), "arch": c.arch, "env": launch.env}
               for c, (_, launch) in zip(cases, verdicts, strict=True)]
    return Run(cases, verdicts, real_server_args(version, payload))


def disagreements(version: str, run: Run) -> Iterator[str]:
    for case, (ours, launch), real in zip(run.cases, run.verdicts, run.answers, strict=True):
        argv = list(launch.argv[3:])
        sim = simulator_verdict(version, argv, launch.env, case.arch)
        where = f"{version} {case}"
        assert not str(real.get("error", "")).startswith("sglang.launch_server"), (where, real)
        if preflight.is_hybrid(case.arch, version):
            assert real["hooks"], (where, "the release's mamba hook did not run", real)
        if case.arch == ALWAYS_HYBRID and real["ok"] and case.radix:
            # The release's mamba rules ran and resolved a strategy: not a CPU short cut.
            strategy = (real["resolved"]["mamba_radix_cache_strategy"]
                        or real["resolved"]["mamba_scheduler_strategy"])
            assert real["hooks"] and strategy != "auto", (where, real)
        if real["ok"] != (not ours):
            yield f"{where}: SGLang {'accepts' if real['ok'] else real['error']}; preflight {ours}"
        elif (not real["ok"] and (msg := real["error"].split(": ", 1)[1])
              and not any(msg in m or m in msg for m in ours)):
            yield f"{where}: SGLang says {msg!r}; preflight {ours}"
        if real["ok"] != (sim is None) or (sim and sim != real["error"]):
            yield f"{where}: SGLang {'accepts' if real['ok'] else real['error']}; simulator {sim}"


@pytest.mark.parametrize("version", releases.supported())
def test_preflight_and_simulator_agree_with_real_server_args(version: str,
                                                             tmp_path: Path) -> None:
    found = list(disagreements(version, run(version, tmp_path)))
    assert not found, f"{len(found)} disagreement(s):\n" + "\n".join(found)


def test_the_matrix_is_large_enough() -> None:
    assert sum(len(matrix(v)) for v in releases.supported()) >= 300


def _oracle_module() -> Any:
    spec = importlib.util.spec_from_file_location("sglang_oracle",
                                                  ROOT / "scripts" / "sglang_oracle.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def release_source(version: str) -> Path:
    work = os.environ.get("SGLANG_FLEET_ORACLE_WORK")
    extra = ["--work", work] if work else []
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sglang_oracle.py"), *extra,
                             "source", version], capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"cannot stage SGLang {version}: {result.stderr[-2000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def test_mamba_architecture_table_is_each_releases_own() -> None:
    """data/mamba_archs.json is what scripts/sglang_oracle.py reads from each release."""
    oracle = _oracle_module()
    table = json.loads((ROOT / "src" / "sglang_fleet" / "data" / "mamba_archs.json").read_text())
    assert set(table) == set(releases.supported())
    for version in releases.supported():
        assert oracle.mamba_archs(release_source(version)) == table[version], version


@pytest.mark.parametrize("version", sorted(preflight.LATER_CHECKS))
def test_later_checks_are_where_preflight_cites_them(version: str) -> None:
    """Each check SGLang makes after ServerArgs is at the file and line preflight cites."""
    where, text = preflight.LATER_CHECKS[version]
    path, line = where.rsplit(":", 1)
    lines = (release_source(version) / path).read_text().splitlines()
    assert text in "\n".join(lines[int(line) - 3:int(line) + 1]), (version, where)


@pytest.mark.parametrize("version", ["0.5.12", "0.5.23"])
def test_a_dp_server_resolves_as_the_simulator_resolves_it(version: str) -> None:
    """``parallel.dp: 8`` (--dp-size 8, no DP attention): the real ServerArgs accepts it on an
    8 x B200 host, resolves ``--load-balance-method auto`` to round_robin (or keeps the one
    given) and keeps max_running_requests as each DP rank's (48 with speculative decoding):
    the simulator's rules and dp.resolve_load_balance_method say the same."""
    from sglang_sim import dp as sim_dp

    p = profile.load("qwen3.6-27b-mtp", overrides={"parallel.dp": 8, "engine.version": version}
                     ).for_gpus(8, "a B200 host")  # auto: one server of dp 8
    launch = render(p, version)
    argvs = [list(launch.argv[3:]), [*launch.argv[3:], "--load-balance-method", "total_requests"]]
    cases = [{"argv": argv, "arch": ALWAYS_HYBRID, "env": launch.env} for argv in argvs]
    for argv, real in zip(argvs, real_server_args(version, cases), strict=True):
        assert real["ok"], real
        ns = sim_args.parse(argv, version)
        sim_rules.resolve(ns, ALWAYS_HYBRID, version,
                          sim_args.table(version)["speculative_algorithms"])
        sim_dp.resolve_load_balance_method(ns)
        mine = {k: getattr(ns, k) for k in ("load_balance_method", "dp_size",
                                            "max_running_requests")}
        assert mine == {k: real["resolved"][k] for k in mine}, (argv[-2:], real["resolved"])
    assert real["resolved"]["load_balance_method"] == "total_requests"


GRPC_PORT_RELEASES = [v for v in releases.supported() if flags.load(v).get("--grpc-port")]


@pytest.mark.parametrize("version", GRPC_PORT_RELEASES)
def test_every_release_with_grpc_port_refuses_it_with_a_key(version: str) -> None:
    """render refuses extra_args --grpc-port beside server.api_key_secret in SGLang's words:
    each release that has the flag raises them under a check of api_key or admin_api_key."""
    hits = []
    for path in (release_source(version) / "sglang" / "srt").rglob("*.py"):
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if GRPC_PORT_WITH_KEY in line:
                hits.append("\n".join(lines[max(0, i - 4):i]))
    assert hits, (version, "no release source says it")
    assert all("api_key" in above and "admin_api_key" in above for above in hits), hits

