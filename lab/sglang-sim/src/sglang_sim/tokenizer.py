"""The model directory's ``tokenizer.json``, read as far as the gRPC mode needs it: token ids to
text (the prompt a gateway sends as ids) and the simulator's words to token ids (what it
generates). The lab model's tokenizer is byte-level BPE whose vocabulary holds every word the
simulator says (scripts/lab_tokenizer.py), so a word is one token and anything else its bytes.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

# GPT-2's byte-level pre-tokenizer split (what ByteLevel with use_regex applies), for the
# simulator's own text: contractions, letters, digits, other symbols, whitespace.
_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+")


@functools.cache
def byte_symbols() -> tuple[str, ...]:
    """The printable symbol ByteLevel gives each byte value (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


class Tokenizer:
    """Ids to text and text to ids with the vocabulary of a model directory's tokenizer.json.

        tok = Tokenizer.load("/models/qwen3.6-27b")
        tok.decode(tok.encode("the model serves"))  # "the model serves"
    """

    def __init__(self, vocab: dict[str, int], added: dict[str, int]) -> None:
        self.vocab = vocab
        self.added = added
        self.pieces = {i: piece for piece, i in vocab.items()} | {i: t for t, i in added.items()}
        self.byte_of = {symbol: b for b, symbol in enumerate(byte_symbols())}
        self._added_split = re.compile("|".join(re.escape(t) for t in sorted(added, key=len,
                                                                              reverse=True)))

    @classmethod
    def load(cls, model_path: str) -> Tokenizer | None:
        """The model's tokenizer, or None where the directory holds no tokenizer.json."""
        path = Path(model_path) / "tokenizer.json"
        if not path.is_file():
            return None
        spec = json.loads(path.read_text())
        return cls(dict(spec["model"]["vocab"]),
                   {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])})

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        for control in self._added_split.finditer(text) if self.added else ():
            ids += self._encode_plain(text[start:control.start()])
            ids.append(self.added[control.group()])
            start = control.end()
        return ids + self._encode_plain(text[start:])

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _SPLIT.findall(text):
            symbols = "".join(byte_symbols()[b] for b in piece.encode())
            if symbols in self.vocab:
                ids.append(self.vocab[symbols])
            else:
                ids += [self.vocab[s] for s in symbols]
        return ids

    def decode(self, ids: list[int]) -> str:
        out = bytearray()
        for i in ids:
            piece = self.pieces.get(i, "")
            if piece in self.added:
                out += piece.encode()
            else:
                out += bytes(self.byte_of[s] for s in piece)
        return out.decode(errors="replace")

    def id_of(self, control: str) -> int | None:
        return self.added.get(control)
