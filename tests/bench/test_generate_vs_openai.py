"""bench/generate_vs_openai.py against real simulator processes on loopback, so the bench cannot
rot unseen: its openai loop writes one line per prompt and keeps a null content, and the bench
runs both clients in its order and prints its table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, Sims, write_input

BENCH = ROOT / "bench"


def test_openai_loop_writes_one_line_per_prompt_and_keeps_null_content(tmp_path: Path) -> None:
    """SGLang 0.5.12 answers an all-reasoning reply with ``content: null``."""
    sims = Sims(tmp_path)
    try:
        url = sims.start("--max-running-requests", "16", release="0.5.12")
        inp = write_input(tmp_path / "in.jsonl", 300, max_tokens=4)
        out = tmp_path / "answers.jsonl"
        done = subprocess.run([sys.executable, str(BENCH / "openai_client.py"), str(inp),
                               str(out), "--url", url, "--concurrency", "16"],
                              capture_output=True, text=True, timeout=120)
    finally:
        sims.stop_all()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"answers": 300}
    raw = out.read_text()
    rows = [json.loads(line) for line in raw.splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"r{i}" for i in range(300))
    assert all(r["content"] is None and r["reasoning_content"] for r in rows), rows[0]
    assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 4
               for r in rows)
    assert '"content": null' in raw


def test_the_bench_runs_each_client_in_turn_and_prints_the_medians() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "generate_vs_openai.py"), "--prompts",
                           "150", "--concurrency", "8", "--repeats", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "150 prompts, concurrency 8" in lines[0]
    runs = [line.split("  ")[0] for line in lines[1:7]]
    assert runs == ["sglang-fleet generate", "openai AsyncOpenAI", "openai AsyncOpenAI",
                    "sglang-fleet generate", "sglang-fleet generate (median)",
                    "openai AsyncOpenAI (median)"]
    assert all(float(line.split()[-5]) > 0 for line in lines[1:7])  # completions/s
    assert lines[7].startswith("generate: ") and "the peak RSS of the openai loop" in lines[7]
