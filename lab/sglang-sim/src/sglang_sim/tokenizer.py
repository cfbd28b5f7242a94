"""The model directory's ``tokenizer.json``, read as far as the gRPC mode needs it: token ids to
text (the prompt a gateway sends as ids) and the simulator's words to token ids (what it
generates). The lab model's tokenizer is byte-level BPE whose vocabulary holds every word the
simulator says (scripts/lab_tokenizer.py), so a word is one token and anything else its bytes.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from pathlib import Path

_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
# \s of the tokenizers crate's regex engine: Unicode White_Space (not Python's str.isspace,
# which also takes \x1c-\x1f)
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                        + "".join(chr(c) for c in range(0x2000, 0x200B)))


def _kind(char: str) -> str:
    """The class GPT-2's split sorts a character into: s(pace), L(etter), N(umber), o(ther)."""
    if char in _WHITESPACE:
        return "s"
    major = unicodedata.category(char)[0]
    return major if major in "LN" else "o"


def pre_tokenize(text: str) -> list[str]:
    r"""GPT-2's byte-level split (ByteLevel with use_regex), every character kept:
    ``'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+``,
    scanned by hand (Python's ``re`` has no ``\p{..}``)."""
    kinds = [_kind(c) for c in text]
    pieces: list[str] = []
    i, n = 0, len(text)
    while i < n:
        contraction = next((c for c in _CONTRACTIONS if text.startswith(c, i)), None)
        if contraction:
            pieces.append(contraction)
            i += len(contraction)
            continue
        start = i
        if text[i] == " " and i + 1 < n and kinds[i + 1] != "s":
            i += 1  # " ?" before a run of letters, numbers or other symbols
        kind = kinds[i]
        end = i
        while end < n and kinds[end] == kind:
            end += 1
        if kind == "s" and end < n and end - i > 1:
            end -= 1  # \s+(?!\S): the last space goes with what follows
        pieces.append(text[start:end])
        i = end
    return pieces


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

    def __init__(self, vocab: dict[str, int], added: dict[str, int], nfc: bool = False) -> None:
        self.vocab = vocab
        self.added = added
        self.nfc = nfc  # the file's normalizer is NFC (applied between the added tokens)
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
                   {t["content"]: int(t["id"]) for t in spec.get("added_tokens", [])},
                   (spec.get("normalizer") or {}).get("type") == "NFC")

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
        for piece in pre_tokenize(unicodedata.normalize("NFC", text) if self.nfc else text):
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
