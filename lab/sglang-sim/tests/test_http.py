"""SGLang's HTTP surface: paths, status codes, JSON keys, reasoning split, metrics, API key."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
from conftest import MTP, Launcher, Sim

CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "What is 2+2?"}],
        "max_tokens": 200}


def test_server_info_reports_resolved_arguments(field_sim: Sim) -> None:
    info = field_sim.client().get("/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE"  # SGLang resolves NEXTN to EAGLE
    assert info["mamba_radix_cache_strategy"] == "extra_buffer"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert info["max_running_requests"] == 48
    assert info["version"] == "0.5.23"
    assert info["model_path"].endswith("qwen3.6-27b")
    assert "--speculative-algorithm NEXTN" in info["launch_command"]
    for key in ("startup_time", "status", "max_total_num_tokens"):
        assert key in info
    [state] = info["internal_states"]
    assert 0 < state["effective_max_running_requests_per_dp"] <= 48
    assert "avg_spec_accept_length" in state
    old = field_sim.client().get("/get_server_info").json()
    assert old["speculative_algorithm"] == "EAGLE"


def test_model_info_and_models(field_sim: Sim) -> None:
    c = field_sim.client()
    info = c.get("/model_info").json()
    assert info["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert info["reasoning_parser"] == "qwen3" and info["is_generation"] is True
    assert c.get("/get_model_info").json() == info
    models = c.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["object"] == "model" and card["owned_by"] == "sglang"
    assert card["id"] == info["served_model_name"] and card["max_model_len"] == 262144


def test_chat_splits_reasoning(field_sim: Sim) -> None:
    body = field_sim.client().post("/v1/chat/completions", json=CHAT).json()
    [choice] = body["choices"]
    assert body["object"] == "chat.completion"
    assert choice["message"]["reasoning_content"]
    assert choice["message"]["content"].startswith("4.")
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["reasoning_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_is_deterministic(field_sim: Sim) -> None:
    c = field_sim.client()
    a = c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    b = c.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]
    assert a == b


def test_all_reasoning_content_is_empty_string_on_0_5_23(field_sim: Sim) -> None:
    body = field_sim.client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 8}).json()
    message = body["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning_content"]
    assert body["choices"][0]["finish_reason"] == "length"


def test_all_reasoning_content_is_null_on_0_5_12(sims: Launcher) -> None:
    sim = sims.start(*MTP, "--mamba-scheduler-strategy", "extra_buffer", "--reasoning-parser",
                     "qwen3", env={"SGLANG_SIM_VERSION": "0.5.12"})
    body = sim.client().post("/v1/chat/completions", json={**CHAT, "max_tokens": 8}).json()
    assert body["choices"][0]["message"]["content"] is None
    assert sim.client().get("/server_info").json()["mamba_scheduler_strategy"] == "extra_buffer"
    sim.stop()


def test_thinking_disabled(field_sim: Sim) -> None:
    body = field_sim.client().post("/v1/chat/completions", json={
        **CHAT, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert body["choices"][0]["message"]["reasoning_content"] is None
    assert body["usage"]["reasoning_tokens"] == 0


def test_meta_info_with_speculative_stats(field_sim: Sim) -> None:
    body = field_sim.client().post("/v1/chat/completions",
                                   json={**CHAT, "return_meta_info": True}).json()
    meta = body["choices"][0]["meta_info"]
    assert 1.0 <= meta["spec_accept_length"] <= 4.0
    assert 0.0 <= meta["spec_accept_rate"] <= 1.0 and meta["spec_verify_ct"] > 0


def test_streaming_chat(field_sim: Sim) -> None:
    with field_sim.client().stream("POST", "/v1/chat/completions",
                                   json={**CHAT, "stream": True,
                                         "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    reasoning = "".join(c["choices"][0]["delta"]["reasoning_content"] or ""
                        for c in chunks if c["choices"])
    content = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
    assert reasoning.strip() and content.strip().startswith("4.")
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_completions(field_sim: Sim) -> None:
    c = field_sim.client()
    body = c.post("/v1/completions", json={"model": "m", "prompt": "1 + 2 =",
                                           "max_tokens": 10}).json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"].startswith("3.")
    with c.stream("POST", "/v1/completions",
                  json={"model": "m", "prompt": "hi", "max_tokens": 5, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 3


def test_metrics(field_sim: Sim) -> None:
    field_sim.client().post("/v1/chat/completions", json=CHAT)
    text = field_sim.client().get("/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                 "sglang:token_usage", "sglang:mamba_usage", "sglang:spec_accept_length",
                 "sglang:spec_accept_rate", "sglang:generation_tokens_total",
                 "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_count"):
        assert f"\n{name}{{" in text, name
    assert 'model_name="' in text


def test_metrics_off_without_flag(sims: Launcher) -> None:
    sim = sims.start()
    assert sim.client().get("/metrics").status_code == 404
    sim.stop()


def test_api_key(sims: Launcher) -> None:
    sim = sims.start("--api-key", "s3cret", "--enable-metrics")
    c = sim.client()
    r = c.get("/v1/models")
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    assert c.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert c.get(path).status_code == 200, path
    sim.stop()


def test_queue_beyond_max_running_requests(sims: Launcher) -> None:
    sim = sims.start("--max-running-requests", "2", "--enable-metrics",
                     env={"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "20",
                          "SGLANG_SIM_ANSWER_TOKENS": "20"})
    results: list[int] = []
    story = {**CHAT, "messages": [{"role": "user", "content": "Tell me a story."}]}

    def one() -> None:  # 20 tokens at 20 steps/s: a second each
        results.append(httpx.post(sim.url + "/v1/chat/completions", json=story,
                                  timeout=30).status_code)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    seen: list[tuple[float, float]] = []
    deadline = time.monotonic() + 3  # until all six have arrived (a loaded machine is slow)
    while time.monotonic() < deadline and (not seen or sum(seen[-1]) < 6):
        metrics = sim.client().get("/metrics").text
        assert "sglang:num_running_reqs{" in metrics
        seen.append(tuple(next(float(line.split()[-1]) for line in metrics.splitlines()
                               if line.startswith(f"sglang:{name}{{"))
                          for name in ("num_running_reqs", "num_queue_reqs")))  # type: ignore[arg-type]
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert seen[-1] == (2, 4), seen
    assert results == [200] * 6
    sim.stop()


def test_sigterm_drains_in_flight_requests(sims: Launcher) -> None:
    sim = sims.start(env={"SGLANG_SIM_DECODE_STEPS_PER_SECOND": "10",
                          "SGLANG_SIM_ANSWER_TOKENS": "30"})
    result: dict[str, int] = {}
    story = {**CHAT, "messages": [{"role": "user", "content": "Tell me a story."}]}

    def slow() -> None:  # 30 tokens at 10 steps/s: three seconds
        result["status"] = httpx.post(sim.url + "/v1/chat/completions", json=story,
                                      timeout=30).status_code

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)
    sim.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 503
    thread.join()
    assert result["status"] == 200
    assert sim.proc.wait(20) == 0
    log = sim.output()
    assert "SIGTERM received. signum=None frame=None." in log
    assert "Draining requests and shutting down..." in log
    assert "Gracefully exiting... Remaining number of requests 1." in log


def test_health_503_until_warmup(sims: Launcher) -> None:
    sim = sims.start(env={"SGLANG_SIM_LOAD_SECONDS": "3"}, wait=False)
    time.sleep(1)
    assert sim.proc.poll() is None
    try:
        status = httpx.get(sim.url + "/health", timeout=2).status_code
    except httpx.ConnectError:
        status = 0  # not listening yet, as SGLang is not while loading
    assert status in (0, 503)
    Launcher.wait_healthy(sim)
    assert httpx.get(sim.url + "/ready").status_code == 200
    sim.stop()


def test_no_meta_info_before_0_5_13(sims: Launcher) -> None:
    sim = sims.start(*MTP, "--mamba-scheduler-strategy", "extra_buffer",
                     env={"SGLANG_SIM_VERSION": "0.5.12"})
    body = sim.client().post("/v1/chat/completions",
                             json={**CHAT, "return_meta_info": True}).json()
    assert body["choices"][0]["meta_info"] is None
    sim.stop()
