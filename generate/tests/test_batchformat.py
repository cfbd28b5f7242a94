"""sglang-fleet generate on OpenAI Batch input (what ``vllm run-batch`` and OpenAI's Batch API
read) and on standard input, against the simulator as generate/tests/test_job.py runs it: the
output's fields, a first line of no format refused before anything is sent, a bad later line
failing alone, resume and --retry-failures of a batch job, and custom_ids that would hurt a
shell or a terminal."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_job import ANSWER, FaultyProxy, check_manifest, cli, generate, records, run_cli
from tests.conftest import MODEL, Sims, write_input

URL_PATH = "/v1/chat/completions"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    """The URL of one simulator (8 running requests)."""
    launcher = Sims(tmp_path)
    try:
        yield launcher.start("--max-running-requests", "8")
    finally:
        launcher.stop_all()


def request(cid: Any, content: str = "q", **body: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": URL_PATH,
            "body": {"max_tokens": 8, "messages": [{"role": "user", "content": content}],
                     **body}}


def write_batch(path: Path, n: int, extra: list[str] | None = None) -> Path:
    lines = [json.dumps(request(f"b{i}", f"q {i}")) for i in range(n)] + (extra or [])
    path.write_text("".join(line + "\n" for line in lines))
    return path


def failures(out: Path) -> dict[int, dict[str, Any]]:
    """failures.jsonl by input line number."""
    rows = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    return {row["line"]: row for row in rows}


def through_503s(sim: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command, through a proxy that answers 503 to each request holding "always-503"."""
    proxy = FaultyProxy(sim, every_503=10**9, every_drop=10**9, always="always-503")
    try:
        return subprocess.run(cli(*args, "--url", proxy.url), capture_output=True, text=True,
                              timeout=120)
    finally:
        proxy.close()


def sent_sha(body: dict[str, Any], model: str) -> str:
    """What request_sha256 is over: the body as sent (model added, stream dropped)."""
    sent = {"model": model, **{k: v for k, v in body.items() if k != "stream"}}
    data = json.dumps(sent, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()


def test_an_openai_batch_file_in_and_out(sim: str, tmp_path: Path) -> None:
    """Each record is OpenAI's output line: batch_req_ id, the custom_id, the server's whole
    completion as the body, its id as request_id; request_sha256 over the body sent."""
    inp = tmp_path / "in.jsonl"
    lines = [request(f"b{i}", f"q {i}") for i in range(23)]
    lines += [request("named", model="another-name"), request("streamed", stream=True)]
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    summary, stats = generate(str(inp), str(out), sim, shard_size=10)
    assert summary["records"] == 25 and summary["failures"] == 0
    rows = {r["custom_id"]: r for r in records(out)}
    assert set(rows) == {line["custom_id"] for line in lines}
    served = httpx.get(f"{sim}/v1/models").json()["data"][0]["id"]
    assert served == str(MODEL)
    for line in lines:
        row = rows[line["custom_id"]]
        assert list(row) == ["id", "custom_id", "response", "error", "request_sha256",
                             "fingerprint"]
        assert row["id"].startswith("batch_req_") and len(row["id"]) == len("batch_req_") + 32
        assert row["error"] is None and row["response"]["status_code"] == 200
        body = row["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 8
        assert body["choices"][0]["finish_reason"] == "length" and "sglext" in body
        assert row["response"]["request_id"] == body["id"] and len(body["id"]) == 32
        assert row["request_sha256"] == sent_sha(line["body"], served), line["custom_id"]
    assert len({r["id"] for r in rows.values()}) == 25
    assert stats.reasoning_tokens + stats.answer_tokens == 25 * 8  # usage read from the body
    assert check_manifest(out, 25)["format"] == "openai-batch"
    chat_out = tmp_path / "chat"
    generate(str(write_input(tmp_path / "chat.jsonl", 3)), str(chat_out), sim)
    assert json.loads((chat_out / "manifest.json").read_text())["format"] == "chat"


@pytest.mark.parametrize(("first", "what"), [
    ('{"id": "x", "temperature": 0.5}', "an object with keys 'id', 'temperature'"),
    ('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}',
     "an object with keys 'custom_id', 'method', 'url'"),
    ("[1, 2]", "a list"), ("null", "null"), ("not json", "not JSON (Expecting value"),
    ('{"\\u001b[31m": 1}', "an object with keys '\\x1b[31m'")])
def test_a_first_line_of_no_format_is_refused_before_anything_is_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str, what: str) -> None:
    """One error line, exit 1, no request (not even /v1/models) and no output (before: every
    line failed on its own, exit 120)."""
    from tests.conftest import Origin

    router = Origin({"/v1/models": (200, {}, b'{"data": [{"id": "m"}]}'),
                     URL_PATH: (200, {}, ANSWER)})
    inp = write_input(tmp_path / "in.jsonl", 19)
    inp.write_text(first + "\n" + inp.read_text())
    out = tmp_path / "out"
    try:
        code, err = run_cli(capsys, str(inp), str(out), "--url", router.url)
    finally:
        router.close()
    assert code == 1 and router.seen == [] and not out.exists(), err
    assert err.startswith(f"error: {inp} line 1: {what}") and err.count("\n") == 1, err
    assert "a chat request ({\"messages\": [...]}" in err, err
    assert 'an OpenAI Batch request ({"custom_id": "...", "method": "POST"' in err, err
    assert "\x1b" not in err


def test_blank_lines_before_the_first_request_are_skipped_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("\n  \n{\"prompt_text\": \"x\"}\n")
    code, err = run_cli(capsys, str(inp), str(tmp_path / "out"), "--url", "http://127.0.0.1:9")
    assert code == 1 and err.startswith(f"error: {inp} line 3: an object with keys "), err


def test_a_bad_line_after_the_first_fails_alone(sim: str, tmp_path: Path) -> None:
    """A chat line in a batch file, a wrong method, url, custom_id or body, a repeated
    custom_id, a line that is not JSON, an answer other than 200: each fails for its own
    reason, in OpenAI's error-file form with its line number; every other line has its
    record."""
    extra = [json.dumps({"id": "c1", "messages": [{"role": "user", "content": "chat"}]}),
             json.dumps({**request("get"), "method": "GET"}),
             json.dumps({**request("completions"), "url": "/v1/completions"}),
             json.dumps(request("")), json.dumps(request(7)),
             json.dumps({**request("text-body"), "body": "hi"}),
             json.dumps({**request("no-messages"), "body": {"messages": []}}),
             json.dumps(request("b1", "again")), "not json",
             json.dumps(request("stuck", "always-503"))]
    inp = write_batch(tmp_path / "in.jsonl", 6, extra)
    out = tmp_path / "out"
    result = through_503s(sim, str(inp), str(out), "--retries", "2", "--shard-size", "4")
    assert result.returncode == 110, result.stderr  # 100 + 10 failed lines
    assert sorted(r["custom_id"] for r in records(out)) == [f"b{i}" for i in range(6)]
    fails = failures(out)
    expected = {7: ("line-7", "no key 'custom_id'"), 8: ("get", "key 'method' is 'GET'"),
                9: ("completions", "key 'url' is '/v1/completions'; write \"url\": "
                    "\"/v1/chat/completions\""),
                10: ("", "key 'custom_id' must be a non-empty string, not ''"),
                11: ("7", "key 'custom_id' must be a non-empty string, not 7"),
                12: ("text-body", "key 'body' must be an object (the chat request), not a "
                     "string"),
                13: ("no-messages", "key 'body.messages' must be a non-empty list"),
                14: ("b1", "id 'b1' appears earlier in the input"),
                15: ("line-15", "line 15: not JSON"), 16: ("stuck", "HTTP 503")}
    assert set(fails) == set(expected)
    for line, (cid, message) in expected.items():
        fail = fails[line]
        assert fail["custom_id"] == cid and message in fail["error"]["message"], fail
        assert set(fail) == {"id", "custom_id", "response", "error", "line", "tries",
                             "request_sha256"} and fail["id"].startswith("batch_req_")
    assert "one input holds one format" in fails[7]["error"]["message"]
    assert {line: fails[line]["error"]["code"] for line in (7, 14, 16)} == {
        7: "invalid_line", 14: "duplicate_id", 16: "http_error"}
    assert all(fails[line]["response"] is None and fails[line]["tries"] == 1
               for line in expected if line != 16)
    assert fails[16]["tries"] == 3 and fails[16]["response"] == {
        "status_code": 503, "request_id": None, "body": {"error": "no healthy worker"}}
    assert fails[14]["request_sha256"] and fails[7]["request_sha256"] is None
    chat_out = tmp_path / "chat-out"
    chat = write_input(tmp_path / "chat.jsonl", 3, extra=[json.dumps(request("batch"))])
    summary, _ = generate(str(chat), str(chat_out), sim)
    assert summary["records"] == 3 and summary["failures"] == 1
    assert "it is an OpenAI Batch request, but the input's first line is a chat request" in \
        failures(chat_out)[4]["error"]


def test_standard_input_is_read_and_the_same_lines_piped_again_resume(
        sim: str, tmp_path: Path) -> None:
    """INPUT ``-``: stdin, never a file named ``-`` (no size, so no ETA); the job is its
    content, so a rerun piping the same lines redoes only the unfinished shard, and other
    lines are refused. A terminal on stdin is refused at once."""
    data = write_batch(tmp_path / "in.jsonl", 30).read_bytes()
    write_input(tmp_path / "-", 500)  # a file named "-": neither read nor measured
    argv = cli("-", "out", "--url", sim, "--shard-size", "10", "--json")

    def piped(stdin: bytes) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, input=stdin.decode(), capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)

    first = piped(data)
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stdout.splitlines()[-1])
    assert done["records"] == 30 and done["eta_s"] is None
    out = tmp_path / "out"
    assert sorted(r["custom_id"] for r in records(out)) == sorted(f"b{i}" for i in range(30))
    manifest = check_manifest(out, 30)
    assert manifest["input"] == "-" and manifest["format"] == "openai-batch"
    (out / "shard-000001.jsonl").unlink()  # as if killed before shard 1's commit
    manifest["shards"] = [e for e in manifest["shards"] if e["name"] != "shard-000001.jsonl"]
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    again = piped(data)
    assert again.returncode == 0, again.stderr
    done = json.loads(again.stdout.splitlines()[-1])
    assert (done["done"], done["skipped"], done["shards_written"]) == (10, 20, 1)
    assert all(out.joinpath(name).stat().st_mtime_ns == t for name, t in kept.items())
    assert sorted(r["custom_id"] for r in records(out)) == sorted(f"b{i}" for i in range(30))
    other = piped(data.replace(b'"q 3"', b'"q 3, edited"'))
    assert other.returncode == 1 and "-: lines 1-10 (shard 0): shard-000000.jsonl was made " \
        "from other lines" in other.stderr, other.stderr
    primary, secondary = os.openpty()
    try:
        tty = subprocess.run(argv, stdin=secondary, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
    finally:
        os.close(primary)
        os.close(secondary)
    assert tty.returncode == 1
    assert tty.stderr.startswith("error: -: standard input is a terminal; pipe the JSONL in")


def test_a_batch_job_resumes_and_refuses_input_of_the_other_format(
        sim: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shard lost to a kill is redone, each custom_id once; the manifest's format holds:
    chat lines on a batch job's output are refused (and the reverse, for a manifest written
    before there were formats), naming the fix and changing nothing."""
    inp = write_batch(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out"
    args = (str(out), "--url", sim, "--shard-size", "10", "--json")
    assert run_cli(capsys, str(inp), *args)[0] == 0
    (out / "shard-000002.jsonl").unlink()
    code, err = run_cli(capsys, str(inp), *args)
    assert code == 0, err
    assert sorted(r["custom_id"] for r in records(out)) == sorted(f"b{i}" for i in range(30))
    manifest = check_manifest(out, 30)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    chat = write_input(tmp_path / "chat.jsonl", 30)
    code, err = run_cli(capsys, str(chat), *args)
    assert code == 1, err
    assert err == (f"error: {chat}: its lines are in the chat format, but the job at {out}/"
                   "manifest.json was started with input in the openai-batch format\n"
                   "    fix: give the job's own input (the same lines), or write this input "
                   "to another output\n")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    del manifest["format"]  # as an sglang-fleet before this change wrote it: a chat job
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, err = run_cli(capsys, str(inp), *args)
    assert code == 1 and "its lines are in the openai-batch format, but the job at" in err \
        and "with input in the chat format" in err, err


def test_retry_failures_on_a_batch_job(sim: str, tmp_path: Path) -> None:
    """The failures carry their line: --retry-failures sends the 503'd line again into
    retry-001.jsonl, in the batch form; the repeated custom_id fails again."""
    inp = write_batch(tmp_path / "in.jsonl", 5, [json.dumps(request("stuck", "always-503")),
                                                 json.dumps(request("b2", "again"))])
    out = tmp_path / "out"
    args = (str(inp), str(out), "--retries", "1", "--shard-size", "3")
    first = through_503s(sim, *args)
    assert first.returncode == 102, first.stderr
    assert {line: f["custom_id"] for line, f in failures(out).items()} == {6: "stuck", 7: "b2"}
    again = subprocess.run(cli(*args, "--url", sim, "--retry-failures"), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 101, again.stderr
    retried = [json.loads(line) for line in (out / "retry-001.jsonl").read_text().splitlines()]
    assert [(r["custom_id"], r["response"]["status_code"], r["error"]) for r in retried] == [
        ("stuck", 200, None)]
    assert retried[0]["response"]["body"]["choices"]
    fails = failures(out)
    assert list(fails) == [7] and fails[7]["error"]["code"] == "duplicate_id"
    manifest = check_manifest(out, 6)
    assert manifest["failures"] == 1 and manifest["format"] == "openai-batch"
    assert [(e["records"], e["failures"]) for e in manifest["retries"]] == [(1, 1)]


HOSTILE = ["a\nb", "nul\x00byte", "$(touch pwned)", "`touch pwned2`", "../../escape",
           "\x1b[31mred\x1b[0m\x07", "cr\rtab\t", "é中文🙂", "'quote\"", "x" * 500]


def test_hostile_custom_ids_go_into_json_only(sim: str, tmp_path: Path) -> None:
    """custom_ids with a newline, NUL, $(...), backquotes, a path, terminal escapes: written
    back exactly, as JSON escapes; no file is named after one and nothing raw reaches the
    terminal. A lone surrogate (JSON's \\ud800), in the id or the body, fails its line."""
    lines = [json.dumps(request(cid)) for cid in HOSTILE]
    lines += [json.dumps(request("$(touch pwned)", "again")),
              json.dumps(request("\ud800")), json.dumps(request("s", "\udfff"))]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(line + "\n" for line in lines))
    before = set(tmp_path.parent.rglob("*"))
    result = subprocess.run(cli(str(inp), str(tmp_path / "out"), "--url", sim),
                            capture_output=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 103, result.stderr
    out = tmp_path / "out"
    assert sorted(r["custom_id"] for r in records(out)) == sorted(HOSTILE)
    shard = (out / "shard-000000.jsonl").read_bytes()
    assert shard.count(b"\n") == len(HOSTILE) and b"\x00" not in shard and b"\x1b" not in shard
    fails = failures(out)
    assert (fails[11]["custom_id"], fails[11]["error"]["code"]) == ("$(touch pwned)",
                                                                    "duplicate_id")
    assert "id '$(touch pwned)' appears earlier" in fails[11]["error"]["message"]
    assert fails[12]["custom_id"] == "line-12" and "'custom_id' holds a lone surrogate" in \
        fails[12]["error"]["message"]
    assert "lone surrogate" in fails[13]["error"]["message"]
    made = set(tmp_path.parent.rglob("*")) - before
    assert {p.relative_to(tmp_path).as_posix() for p in made if p.is_file()} == {
        "out/.lock", "out/manifest.json", "out/shard-000000.jsonl", "out/failures-000000.jsonl",
        "out/failures.jsonl"}
    assert not any(tmp_path.rglob("pwned*")) and not (tmp_path.parent / "escape").exists()
    shown = result.stdout + result.stderr
    assert b"\x1b" not in shown and b"\x00" not in shown and b"\x07" not in shown
    assert b"pwned" not in shown and b"escape" not in shown, shown
