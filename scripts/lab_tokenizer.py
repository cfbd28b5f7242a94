"""Write the lab model's tokenizer: ``tokenizer.json`` and ``tokenizer_config.json`` in
lab/models/qwen3.6-27b, as a model directory on the Hub carries them.

A gateway that routes over gRPC tokenizes at the gateway (the worker sends it this tokenizer):
it must turn the simulator's words into one token each and back. So the tokenizer is Qwen's kind
(byte-level BPE, its chat template's control tokens) with a small vocabulary: the 256 byte
symbols, every word the simulator says (``sglang_sim.engine``: WORDS and THINK), bare and after
a space, and the control tokens. ``ignore_merges`` makes a word in the vocabulary one token
without any merge table; anything else falls back to bytes, so no text is unknown.

The ids of the control tokens: ``<|endoftext|>`` is the config's ``eos_token_id`` (248044); the
others follow it as in Qwen's tokenizers. Only ids below the config's vocab_size (248320) are used.

    uv run python scripts/lab_tokenizer.py          # rewrite the two files
    uv run python scripts/lab_tokenizer.py --check  # exit 1 if they differ from what it writes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sglang_sim.engine import THINK, WORDS
from sglang_sim.tokenizer import byte_symbols

MODEL = Path(__file__).resolve().parents[1] / "lab" / "models" / "qwen3.6-27b"
EOS = 248044
CONTROL = {"<|endoftext|>": (EOS, True), "<|im_start|>": (EOS + 1, True),
           "<|im_end|>": (EOS + 2, True), "<think>": (EOS + 24, False),
           "</think>": (EOS + 25, False)}
# Qwen3's template, cut to text messages: thinking opens at the generation prompt unless
# enable_thinking is false, which closes an empty think block instead.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}")


def vocabulary() -> dict[str, int]:
    symbols = byte_symbols()
    vocab = {symbol: i for i, symbol in enumerate(symbols)}
    for word in sorted({*WORDS, *THINK}):
        for piece in (word, " " + word):
            vocab.setdefault("".join(symbols[b] for b in piece.encode()), len(vocab))
    # tokenizers numbers an added token it does not find in the model's vocabulary after the
    # vocabulary, whatever id it is given: the control tokens are in it, at their ids.
    return vocab | {text: tid for text, (tid, _) in CONTROL.items()}


def tokenizer_json() -> dict[str, Any]:
    added = [{"id": tid, "content": text, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": special}
             for text, (tid, special) in CONTROL.items()]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "NFC"}, "pre_tokenizer": byte_level,
            "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                      "vocab": vocabulary(), "merges": []}}


def tokenizer_config() -> dict[str, Any]:
    return {"added_tokens_decoder": {str(tid): {"content": text, "lstrip": False,
                                                "normalized": False, "rstrip": False,
                                                "single_word": False, "special": special}
                                     for text, (tid, special) in CONTROL.items()},
            "bos_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces":
            False, "eos_token": "<|im_end|>", "errors": "replace",
            "model_max_length": 262144, "pad_token": "<|endoftext|>",
            "tokenizer_class": "Qwen2Tokenizer"}


def files() -> dict[str, str]:
    return {name: json.dumps(body, indent=2, ensure_ascii=False) + "\n"
            for name, body in (("tokenizer.json", tokenizer_json()),
                               ("tokenizer_config.json", tokenizer_config()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    check = parser.parse_args().check
    stale = [name for name, text in files().items()
             if not (MODEL / name).exists() or (MODEL / name).read_text() != text]
    if check:
        for name in stale:
            print(f"{MODEL / name}: differs from scripts/lab_tokenizer.py's; run it to rewrite")
        return 1 if stale else 0
    for name, text in files().items():
        (MODEL / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
