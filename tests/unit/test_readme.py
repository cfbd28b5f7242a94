"""The README is short and points the way: at most 150 lines, the two commands as they are, and
every link into docs/ (and every doc) found."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = ROOT / "README.md"
TWO_COMMANDS = ("```sh\n"
                "uv run sglang-fleet demo     # the demo on the lab "
                "(then: uv run sglang-fleet lab down)\n"
                "uv run pytest                # the tests\n"
                "```\n")
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


def test_the_readme_is_at_most_150_lines() -> None:
    assert len(README.read_text().splitlines()) <= 150


def test_the_two_commands_are_the_quick_start() -> None:
    text = README.read_text()
    assert TWO_COMMANDS in text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    assert "\nuv run pytest\n" in (ROOT / ".ci" / "run").read_text()  # the same test command


def test_every_link_of_the_readme_and_the_docs_is_there() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {target}"
               for doc in [README, *(ROOT / "docs").glob("*.md")]
               for target, _ in LINK.findall(doc.read_text())
               if not target.startswith("http") and not (doc.parent / target).exists()]
    assert missing == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {target for target, _ in LINK.findall(README.read_text())}
    docs = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert len(docs) >= 12 and docs <= linked, docs - linked
