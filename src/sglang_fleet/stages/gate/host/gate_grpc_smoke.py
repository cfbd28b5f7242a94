"""The gate's smoke generation for a server in gRPC mode: the prompt of ``gate_smoke`` through
the model's own chat template and tokenizer (transformers, as SGLang loads it), one streamed
``Generate``, split where the think block ends, held to the HTTP smoke's standard.

    with Scheduler("127.0.0.1:30000") as server:
        s = grpc_smoke(server, "/var/lib/sglang/models/qwen3.6-27b", "qwen3", "0.5.23")
    describe(s)       # "smoke: '4', TTFT 38 ms, 112 tok/s, accept length not reported ..."
"""

from __future__ import annotations

from typing import Any

from .gate_grpc import Scheduler
from .gate_http import GateError
from .gate_smoke import SMOKE_PROMPT

SMOKE_TOKENS = 512
# Where the think block ends for the reasoning parsers SGLang 0.5.23 maps to Qwen3Detector or
# DeepSeekR1Detector (srt/parser/reasoning_parser.py DetectorMap: both "</think>"); the text
# before it is the reasoning. Another parser's output is not split: it is all the answer.
THINK_END = dict.fromkeys(("qwen3", "qwen3-thinking", "dots", "minimax", "nanbeige", "interns1",
                           "deepseek-r1", "step3", "step3p5", "gigachat35"), "</think>")


def prompt_ids(model_dir: str, text: str = SMOKE_PROMPT) -> list[int]:
    """``text`` as the server's tokenizer encodes a chat turn of it."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise GateError(f"a gRPC smoke needs transformers in the release's environment: "
                        f"{exc}") from None
    tokenizer = _tokenizer(AutoTokenizer, model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                        add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def _tokenizer(auto: Any, model_dir: str) -> Any:
    try:
        return auto.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise GateError(f"the model's tokenizer in {model_dir} did not load: "
                        f"{str(exc).splitlines()[0][:200]}") from None


def split(text: str, reasoning_parser: str | None) -> tuple[str, str]:
    """(answer, reasoning) of a decoded completion whose prompt opened the think block.

        >>> split("weighing it\\n</think>\\n\\n4.", "qwen3")
        ('4.', 'weighing it')
        >>> split("still thinking", "qwen3"), split("4", None)
        (('', 'still thinking'), ('4', ''))
    """
    end = THINK_END.get(reasoning_parser or "")
    if end is None:
        return text.strip(), ""
    thought, found, answer = text.partition(end)
    return (answer.strip(), thought.strip()) if found else ("", text.strip())


def grpc_smoke(server: Scheduler, model_dir: str, reasoning_parser: str | None,
               version: str | None) -> dict[str, Any]:
    """One streamed ``Generate`` of the smoke prompt: TTFT, tokens/s and the answer, as
    ``gate_smoke.smoke`` reports them (the accept length is not in gRPC's answer)."""
    from transformers import AutoTokenizer

    tokenizer = _tokenizer(AutoTokenizer, model_dir)
    out = server.generate(prompt_ids(model_dir), SMOKE_TOKENS)
    answer, thought = split(tokenizer.decode(out.output_ids, skip_special_tokens=True),
                            reasoning_parser)
    if not answer and not thought:
        raise GateError(f"smoke generation returned nothing: {server.target} streamed "
                        f"{len(out.output_ids)} tokens that decode to no text")
    sane = "4" in answer or (not answer and bool(thought))
    if not sane:
        raise GateError(f"smoke answer is not sane: {answer[:80]!r}")
    decoding = out.seconds - (out.first_token_s or 0.0)
    return {"answer": answer[:80], "reasoning_chars": len(thought), "sane": sane,
            "ttft_s": round(out.first_token_s or out.seconds, 3),
            "tokens": out.completion_tokens,
            "tokens_per_s": round(out.completion_tokens / max(decoding, 1e-3), 1),
            "accept_length": None, "meta_info": None, "version": version}
