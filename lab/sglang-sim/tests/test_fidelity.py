"""The simulator's log lines, JSON keys and metric names checked against SGLang's own source
(the pinned release's wheel, unpacked by scripts/sglang_oracle.py)."""

from __future__ import annotations

import ast
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MTP, REPO, Launcher, Sim
from sglang_sim import args as sim_args

CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 64}


@pytest.fixture(scope="module")
def srt() -> Path:
    release = sim_args.default_version()
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "sglang_oracle.py"),
                             "source", release], capture_output=True, text=True, timeout=1800)
    if result.returncode:
        pytest.fail(f"cannot unpack SGLang {release}'s source (needs uv and the package "
                    f"index):\n{result.stderr[-2000:]}")
    return Path(result.stdout.strip()) / "sglang" / "srt"


def _regex(node: ast.expr) -> str:
    """An f-string (or %-format string) from SGLang's source as a regex over its output."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.sub(r"%(\\.\d+)?[dsf]", ".+?", re.escape(node.value).replace(r"\%", "%"))
    assert isinstance(node, ast.JoinedStr)
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(re.escape(str(value.value)))
        else:
            parts.append(".*?")
    return "".join(parts)


def _strings(path: Path) -> list[tuple[str, str]]:
    """(literal prefix, regex) of every string or f-string in a source file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            first = node.values[0] if node.values else None
            prefix = first.value if isinstance(first, ast.Constant) else ""
            out.append((str(prefix), _regex(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.value, _regex(node)))
    return out


def _message(line: str) -> str:
    return re.sub(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( TP\d+)?\] ", "", line)


# (what our line starts with, SGLang file that prints it, a literal its format string holds)
LINES = [
    ("Load weight begin.", "model_executor/model_runner.py", "Load weight begin"),
    ("Load weight end.", "model_executor/model_runner.py", "Load weight end. "),
    ("KV Cache is allocated.", "mem_cache/memory_pool.py", "#tokens: "),
    ("Mamba Cache is allocated.", "mem_cache/memory_pool.py", "Mamba Cache is allocated. "),
    ("Memory pool end.", "mem_cache/kv_cache_configurator.py", "Memory pool end. "),
    ("max_total_num_tokens=", "managers/scheduler.py", "max_total_num_tokens="),
    ("max_running_requests is capped", "mem_cache/kv_cache_configurator.py",
     "max_running_requests is capped to %d"),
    ("The server is fired up", "entrypoints/http_server.py", "The server is fired up"),
    ("Capture target verify CUDA graph begin.",
     "model_executor/model_runner_components/cuda_graph_setup.py", "num_tokens_per_req="),
    ("Capture target verify CUDA graph end.",
     "model_executor/model_runner_components/cuda_graph_setup.py", " end. bs="),
    ("Capture draft decode CUDA graph begin.", "speculative/eagle_worker_v2.py",
     "Capture draft decode CUDA graph begin. "),
    ("Capture draft extend CUDA graph end.", "speculative/eagle_worker_v2.py",
     "Capture draft extend CUDA graph end. "),
    ("SIGTERM received.", "managers/tokenizer_manager.py", "SIGTERM received. "),
    ("Gracefully exiting...", "managers/tokenizer_manager.py", "Gracefully exiting... "),
    ("Max running requests is reset to 48", "arg_groups/speculative_hook.py",
     "Max running requests is reset to 48"),
]


def _format_regexes(srt: Path, file: str, marker: str) -> list[str]:
    path = srt / file
    if not path.exists():
        hits = [p for p in srt.rglob("*.py") if marker in p.read_text()]
        assert hits, f"no SGLang source prints {marker!r}"
        path = hits[0]
    found = [rx for _, rx in _strings(path) if marker.replace("%d", ".+?") in rx.replace("\\", "")
             or re.escape(marker) in rx or marker in rx]
    assert found, f"{marker!r} not found in {path}"
    return found


def test_log_lines_match_sglang_format_strings(sims: Launcher, srt: Path) -> None:
    sim = sims.start(*MTP, "--mamba-radix-cache-strategy", "extra_buffer",
                         "--max-mamba-cache-size", "24")
    with sim.client() as c:  # one request in flight while SIGTERM drains
        c.post("/v1/chat/completions", json=CHAT)
    sim.stop()
    messages = [_message(line) for line in sim.output().splitlines()]
    for start, file, marker in LINES:
        ours = [m for m in messages if m.startswith(start)]
        assert ours, f"the simulator printed no {start!r} line"
        regexes = _format_regexes(srt, file, marker)
        for line in ours:
            assert any(re.fullmatch(rx, line, re.S) for rx in regexes), (line, regexes)


def test_prefill_batch_line_is_sglangs(field_sim: Sim, srt: Path) -> None:
    """SGLang builds the line in pieces (msg += ...): its first piece, then the graph and
    throughput pieces, in order."""
    field_sim.client().post("/v1/chat/completions", json=CHAT)
    lines = [_message(line) for line in field_sim.output().splitlines()
             if "Prefill batch" in line]
    path = srt / "managers" / "scheduler_components" / "metrics_reporter.py"
    head = _format_regexes(srt, str(path.relative_to(srt)), "#pending-token: ")[0]
    assert lines and all(re.match(head + r"cuda graph: (True|False), input throughput "
                                  r"\(token/s\): \d+\.\d\d$", line) for line in lines), lines
    assert '"{self._graph_backend_label}: {can_run_cuda_graph}, "' in \
        path.read_text().replace("f\"", "\"")


def _fields(srt: Path, cls: str) -> set[str]:
    tree = ast.parse((srt / "entrypoints" / "openai" / "protocol.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {s.target.id for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise AssertionError(f"SGLang has no {cls}")


def test_chat_json_keys_are_sglangs(field_sim: Sim, srt: Path) -> None:
    c = field_sim.client()
    body = c.post("/v1/chat/completions", json={**CHAT, "return_meta_info": True}).json()
    assert set(body) == _fields(srt, "ChatCompletionResponse")
    assert set(body["choices"][0]) == _fields(srt, "ChatCompletionResponseChoice")
    assert set(body["choices"][0]["message"]) == _fields(srt, "ChatMessage")
    assert set(body["usage"]) <= _fields(srt, "UsageInfo")
    models = c.get("/v1/models").json()
    assert set(models) == _fields(srt, "ModelList")
    assert set(models["data"][0]) == _fields(srt, "ModelCard")


def test_completion_json_keys_are_sglangs(field_sim: Sim, srt: Path) -> None:
    body = field_sim.client().post("/v1/completions",
                                   json={"model": "m", "prompt": "hi", "max_tokens": 4}).json()
    assert set(body) == _fields(srt, "CompletionResponse")
    assert set(body["choices"][0]) == _fields(srt, "CompletionResponseChoice")


def test_stream_chunk_keys_are_sglangs(field_sim: Sim, srt: Path) -> None:
    import json

    with field_sim.client().stream("POST", "/v1/chat/completions",
                                   json={**CHAT, "stream": True}) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: {"))
    chunk = json.loads(first[6:])
    assert set(chunk) <= _fields(srt, "ChatCompletionStreamResponse")
    assert set(chunk["choices"][0]) <= _fields(srt, "ChatCompletionResponseStreamChoice")
    assert set(chunk["choices"][0]["delta"]) <= _fields(srt, "DeltaMessage")


def test_model_info_keys_are_sglangs(field_sim: Sim, srt: Path) -> None:
    tree = ast.parse((srt / "entrypoints" / "http_server.py").read_text())
    fn = next(n for n in ast.walk(tree)
              if isinstance(n, ast.AsyncFunctionDef) and n.name == "model_info")
    result = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Dict))
    assert isinstance(result, ast.Dict)
    keys = {k.value for k in result.keys if isinstance(k, ast.Constant)}
    assert set(field_sim.client().get("/model_info").json()) == keys


def test_server_info_keys_are_sglangs(field_sim: Sim, srt: Path) -> None:
    info = field_sim.client().get("/server_info").json()
    source = (srt / "entrypoints" / "http_server.py").read_text()
    for key in ("startup_time", "internal_states", "version"):
        assert f'"{key}"' in source and key in info
    internal = (srt / "managers" / "scheduler_components" / "internal_state.py").read_text()
    written = set(re.findall(r'state\["(\w+)"\]\s*=', internal))
    assert set(info["internal_states"][0]) <= written


def test_metric_names_are_sglangs(field_sim: Sim, srt: Path) -> None:
    field_sim.client().post("/v1/chat/completions", json=CHAT)
    text = field_sim.client().get("/metrics").text
    ours = {re.sub(r"_(bucket|sum|count)$", "", line.split("{")[0])
            for line in text.splitlines() if line.startswith("sglang:")}
    collector = (srt / "observability" / "metrics_collector.py").read_text()
    theirs = set(re.findall(r'name="(sglang:\w+)"', collector))
    assert ours and ours <= theirs, ours - theirs


# A node ≥ 1 and the process group's lines (the pinned release is 0.5.21+: "Init parallel …").
MULTINODE_LINES = [
    ("Init parallel begin.", "distributed/bootstrap.py", "Init parallel begin."),
    ("Init parallel ends.", "distributed/bootstrap.py", "Init parallel ends. "),
    ("Memory baseline taken.", "distributed/bootstrap.py", "Memory baseline taken. "),
    ("Dummy health check server started", "utils/common.py",
     "Dummy health check server started in background thread at "),
    ("SIGTERM received on node_rank", "entrypoints/engine.py", "SIGTERM received on node_rank "),
    ("Scheduler or DataParallelController", "entrypoints/engine.py",
     "Scheduler or DataParallelController "),
]


def test_multinode_log_lines_match_sglang_format_strings(sims: Launcher, srt: Path) -> None:
    from test_multinode import pair

    zero, one = pair(sims, sim_args.default_version())
    one.proc.send_signal(signal.SIGTERM)  # 0.5.21+: a warning, node 1 waits for rank 0
    time.sleep(1)
    zero.stop()
    one.proc.wait(20)
    messages = [_message(line) for sim in (zero, one) for line in sim.output().splitlines()]
    for start, file, marker in MULTINODE_LINES:
        ours = [m for m in messages if m.startswith(start)]
        assert ours, f"the simulator printed no {start!r} line"
        regexes = _format_regexes(srt, file, marker)
        for line in ours:
            assert any(re.fullmatch(rx, line, re.S) for rx in regexes), (line, regexes)
