"""The mamba cache size a host remembers for a target (``sizing.record``), read as a fact so
that a deploy renders it before anything starts.

    host.get_fact(RememberedSize, digest=sizing.key(launch, 183359))   # the record's text
"""

from __future__ import annotations

import re

from pyinfra.api.facts import FactBase

from sglang_fleet import paths

_DIGEST = re.compile(r"[0-9a-f]{24}")


class RememberedSize(FactBase[str | None]):
    """The text of the size record for ``digest`` (None: none); ``sizing.remembered`` reads it."""

    def command(self, digest: str) -> str:
        if not _DIGEST.fullmatch(digest):  # the name reaches a shell
            raise ValueError(f"not a size record's key: {digest!r}")
        return f"cat {paths.SIZING}/{digest}.json 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return "\n".join(output) or None
