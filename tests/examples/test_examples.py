"""What ``examples/`` gives a user in their first hour, held to the product:

- the Grafana dashboard queries only metric names that exist: SGLang's (as the simulator, built
  from the pinned release's own source, serves them), the DCGM fields the lab's dcgm-exporter
  serves, and the router's ``smg_*`` names ``tests/unit/fleet/test_gateways.py`` finds on both
  gateways;
- the Prometheus configuration reads the file_sd list the deploy writes, for the jobs it writes;
- the prompts are ``sglang-fleet generate`` input, and a job of them runs;
- each example profile passes ``sglang-fleet check`` (and pins a commit:
  tests/examples/test_safe_examples.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_fleet import cli
from sglang_fleet.config import preflight
from sglang_fleet.config.multinode import Rank
from sglang_fleet.config.profile import load
from sglang_fleet.config.render import Launch, render, render_all
from sglang_fleet.errors import InputError
from sglang_fleet.fleet.inventory import load as load_inventory
from sglang_fleet.report import metrics_targets
from sglang_fleet_generate.batchformat import CHAT, open_detected
from sglang_fleet_lab import aptrepo
from tests.conftest import ROOT, Sims

EXAMPLES = ROOT / "examples"
DASHBOARD = EXAMPLES / "grafana" / "sglang-fleet.json"
PROMETHEUS = EXAMPLES / "prometheus" / "prometheus.yml"
PROMPTS = EXAMPLES / "prompts.jsonl"
EXAMPLE_PROFILES = sorted((EXAMPLES / "profiles").glob("*.yaml"))
MODEL_CONFIG = ROOT / "lab" / "models" / "qwen3.6-27b" / "config.json"
FILE_SD = "/etc/prometheus/file_sd/sglang-fleet.json"


# --- metric names that exist ------------------------------------------------------------------

def sglang_names() -> set[str]:
    """SGLang's names as the simulator serves them (lab/sglang-sim/src/sglang_sim/metrics.py,
    whose names lab/sglang-sim/tests/test_fidelity.py checks against the release's source):
    each gauge and counter, and a histogram's _bucket, _sum and _count series."""
    text = (ROOT / "lab" / "sglang-sim" / "src" / "sglang_sim" / "metrics.py").read_text()
    names = set(re.findall(r'"(sglang:[a-z0-9_]+)', text))
    histograms = set(re.findall(r'_histogram\(out, "(sglang:[a-z0-9_]+)"', text, re.S))
    assert len(names) >= 10 and histograms, (names, histograms)
    return names | {h + s for h in histograms for s in ("_bucket", "_sum", "_count")}


def dcgm_names() -> set[str]:
    """The fields the lab's dcgm-exporter stub (lab/nvidia/dcgm-exporter) serves: those of the
    counters file the lab's package installs, read by the stub's own parser."""
    loader = importlib.machinery.SourceFileLoader("dcgm_exporter",
                                                  str(ROOT / "lab" / "nvidia" / "dcgm-exporter"))
    spec = importlib.util.spec_from_loader("dcgm_exporter", loader)
    assert spec is not None
    stub = importlib.util.module_from_spec(spec)
    loader.exec_module(stub)
    with tempfile.NamedTemporaryFile("w", suffix=".csv") as counters:
        counters.write(aptrepo.DCGM_COUNTERS)
        counters.flush()
        return {field for field, _, _ in stub.counters(counters.name)}


def router_names() -> set[str]:
    """The router's names tests/unit/fleet/test_gateways.py asserts on both gateways'
    metrics port."""
    source = (ROOT / "tests" / "unit" / "fleet" / "test_gateways.py").read_text()
    names = set(re.findall(r'"(smg_[a-z_]+)"', source))
    assert {"smg_worker_health", "smg_router_requests_total"} <= names, names
    return names


def known_names() -> set[str]:
    return sglang_names() | dcgm_names() | router_names()


# --- PromQL: the metric names an expression reads ---------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_CLAUSES = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (function names, keywords, label matchers,
    grouping labels, ranges and strings aside).

    >>> sorted(metric_names('sum by (host) (rate(a:b_total{x="y"}[1m])) / c'))
    ['a:b_total', 'c']
    """
    text = _STRINGS.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _CLAUSES.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        after = text[match.end():].lstrip()
        if after.startswith("(") or match.group() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(match.group())
    return names


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel's targets and every query variable."""
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((f"panel {inner['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert inner, f"variable {var['name']}: {query!r} is not label_values(METRIC, LABEL)"
            found.append((f"variable {var['name']}", inner.group(1)))
    return found


def unknown_names(dashboard: dict[str, Any], known: set[str]) -> list[str]:
    """Each query that names a metric nothing exports, or none at all."""
    wrong = []
    for where, expr in queries(dashboard):
        names = metric_names(expr)
        if not names:
            wrong.append(f"{where}: no metric in {expr!r}")
        wrong += [f"{where}: {name} is exported by nothing" for name in sorted(names - known)]
    return wrong


def test_every_dashboard_query_names_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15 and all(p.get("targets") for p in panels)
    assert unknown_names(dashboard, known_names()) == []
    used = {n for _, expr in queries(dashboard) for n in metric_names(expr)}
    # every source is on the dashboard: SGLang, the GPUs' health, the router
    assert {"sglang:generation_tokens_total", "sglang:num_running_reqs", "sglang:num_queue_reqs",
            "sglang:time_to_first_token_seconds_bucket", "sglang:spec_accept_length",
            "sglang:token_usage", "sglang:mamba_usage", "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "smg_router_requests_total",
            "smg_worker_health"} <= used


def test_a_bogus_metric_name_fails_the_check() -> None:
    """The check can fail: one misspelled name in one panel, and one invented router name."""
    dashboard = json.loads(DASHBOARD.read_text())
    text = json.dumps(dashboard).replace("sglang:num_queue_reqs", "sglang:num_queued_reqs", 1)
    broken = json.loads(text)
    broken["panels"][-1]["targets"][0]["expr"] = "sum(rate(smg_router_bogus_total[1m]))"
    wrong = unknown_names(broken, known_names())
    assert len(wrong) == 2, wrong
    assert "sglang:num_queued_reqs is exported by nothing" in wrong[0]
    assert wrong[1].endswith("smg_router_bogus_total is exported by nothing")


def test_the_doc_queries_are_on_the_dashboard() -> None:
    """The table of queries in docs/status-and-metrics.md and the dashboard name the same
    SGLang metrics."""
    section = (ROOT / "docs" / "status-and-metrics.md").read_text()
    rows = [line.split(" | ", 1)[1] for line in
            section[section.index("| what | PromQL |"):].splitlines()[2:] if line.startswith("| ")]
    readme = {n for row in rows for expr in re.findall(r"`([^`]+)`", row)
              for n in metric_names(expr)}
    assert len(readme) >= 8, readme
    dashboard = json.loads(DASHBOARD.read_text())
    used = {n for _, expr in queries(dashboard) for n in metric_names(expr)}
    assert readme - used <= {"sglang:gen_throughput"}, readme - used  # a gauge of the same
    assert readme <= known_names()


def test_the_dashboard_is_importable_as_it_is() -> None:
    """A data source variable instead of a fixed uid, unique panel ids, panels on the grid."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all('host=~"$host"' in t["expr"] for t in panel["targets"]), panel["title"]


# --- Prometheus -------------------------------------------------------------------------------

def example_fleet(tmp_path: Path) -> list[Any]:
    """One B200 host serving the instances-auto example (4 servers), with the router and DCGM,
    loaded as the deploy loads an inventory (nothing is contacted)."""

    profile = EXAMPLES / "profiles" / "qwen3.6-27b-mtp-instances-auto.yaml"
    path = tmp_path / "fleet.py"
    path.write_text(
        f"gpus = [('gpu1', {{'ssh_hostname': '127.0.0.1', 'sglang_profile': {str(profile)!r},\n"
        "    'install_dcgm': True, 'gpu_count': 8,\n"
        "    'secrets': {'sglang-api-key': 'k' * 20, 'sglang-router-admin-key': 'a' * 20}})]\n"
        "routers = ['gpu1']\n")
    return list(load_inventory(str(path), {}))


def test_the_prometheus_config_scrapes_what_the_deploy_writes(tmp_path: Path) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    [job] = config["scrape_configs"]
    [sd] = job["file_sd_configs"]
    assert sd["files"] == [FILE_SD]
    # the same path docs/status-and-metrics.md and the example group data give prometheus_file_sd
    assert f'prometheus_file_sd = "{FILE_SD}"' in (
        ROOT / "docs" / "status-and-metrics.md").read_text()
    assert f'prometheus_file_sd = "{FILE_SD}"' in (
        ROOT / "inventories" / "group_data" / "b200.py").read_text()
    assert job.get("metrics_path", "/metrics") == "/metrics"
    [keep] = [r for r in job["relabel_configs"] if r["action"] == "keep"]
    assert keep["source_labels"] == ["job"]
    kept = set(keep["regex"].split("|"))

    groups = metrics_targets.targets(example_fleet(tmp_path))
    written = {g["labels"]["job"] for g in groups}
    assert kept == written == {"sglang", "sglang-router", "dcgm"}
    servers = [g["targets"][0] for g in groups if g["labels"]["job"] == "sglang"]
    assert servers == [f"127.0.0.1:{30000 + i}" for i in range(4)]  # auto: 8 GPUs / tp 2
    # and the dashboard's job filters, if any, name only those jobs
    dashboard_jobs = set(re.findall(r'job=~?\\?"([^"\\]+)', DASHBOARD.read_text()))
    assert dashboard_jobs <= written


# --- prompts ----------------------------------------------------------------------------------

def test_the_prompts_are_generate_input() -> None:
    opened = open_detected(str(PROMPTS), None)
    try:
        assert opened.format is CHAT
        items = [opened.format.parse(i, raw, str(PROMPTS), "qwen3.6-27b")
                 for i, raw in enumerate(opened.lines) if raw.strip()]
    finally:
        opened.close()
    ids = [item.id for item in items]
    assert len(ids) >= 8 and len(set(ids)) == len(ids)


def test_a_job_of_the_prompts_runs(sims: Sims, tmp_path: Path) -> None:
    url = sims.start("--max-running-requests", "8")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "generate", str(PROMPTS),
                          str(out), "--url", url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    results = subprocess.run([sys.executable, "-m", "sglang_fleet.cli", "results", str(out)],
                             capture_output=True, text=True, timeout=60)
    ids = [json.loads(line)["id"] for line in results.stdout.splitlines()]
    want = [json.loads(line).get("id") for line in PROMPTS.read_text().splitlines()]
    assert sorted(ids) == sorted(want)


# --- profiles ---------------------------------------------------------------------------------

def flag(launch: Launch, name: str) -> str:
    return launch.argv[launch.argv.index(name) + 1]


@pytest.mark.parametrize("path", EXAMPLE_PROFILES, ids=lambda p: p.stem)
def test_each_example_profile_passes_check(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["check", str(path), "--model-config", str(MODEL_CONFIG)])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith(f"{path}: ok for SGLang 0.5.23"), err
    assert err == ""  # no warning either: the revision is a commit


def test_the_example_profiles_are_what_they_say() -> None:
    names = {p.stem.removeprefix("qwen3.6-27b-mtp-") for p in EXAMPLE_PROFILES}
    assert names == {"tp2", "instances-auto", "multinode"}
    tp2 = load(EXAMPLES / "profiles" / "qwen3.6-27b-mtp-tp2.yaml").for_gpus(8, "b200")
    assert tp2.parallel.servers == 1 and flag(render(tp2), "--tp-size") == "2"
    auto = load(EXAMPLES / "profiles" / "qwen3.6-27b-mtp-instances-auto.yaml")
    assert auto.parallel.instances == "auto"
    launches = render_all(auto.for_gpus(8, "b200"))
    assert [launch.env["CUDA_VISIBLE_DEVICES"] for launch in launches] == \
        ["0,1", "2,3", "4,5", "6,7"]
    multi = load(EXAMPLES / "profiles" / "qwen3.6-27b-mtp-multinode.yaml").for_gpus(8, "b200")
    launch = render(multi, rank=Rank(1, "10.0.0.11"))
    assert [flag(launch, f) for f in ("--tp-size", "--nnodes", "--node-rank", "--dist-init-addr",
                                      "--dist-timeout")] == \
        ["16", "2", "1", "10.0.0.11:20000", "900"]


def test_the_multinode_example_fits_two_8_gpu_hosts() -> None:
    """What its comment says: each host runs its share, tp 16 / nnodes 2 = 8 GPUs."""
    multi = load(EXAMPLES / "profiles" / "qwen3.6-27b-mtp-multinode.yaml").for_gpus(8, "b200")
    preflight.require_host(multi, render_all(multi), "b200-01", 8)
    with pytest.raises(InputError, match=r"tp x dp / nnodes = 16 / 2 = 8 GPUs need 8, "
                       r"b200-01 has 4"):
        preflight.require_host(multi, render_all(multi), "b200-01", 4)
