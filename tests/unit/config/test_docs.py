"""docs/profile.md's table of profile keys is the one their declarations make, and one key's help
says what its declaration does."""

from __future__ import annotations

import pytest

from sglang_fleet import cli
from sglang_fleet.config import docs, keys
from sglang_fleet.config.profile import Profile
from tests.conftest import ROOT

WRITE = "uv run python -m sglang_fleet.config.docs --write docs/profile.md"


def test_the_doc_table_is_the_declarations() -> None:
    text = (ROOT / "docs" / "profile.md").read_text()
    assert docs.in_readme(text), f"docs/profile.md has no {docs.BEGIN} ... {docs.END}"
    section = text.split("\n## Profiles\n", 1)[1].split("\n## ", 1)[0]
    assert docs.BEGIN in section, "the key table belongs in docs/profile.md's Profiles section"
    assert docs.in_readme(text) == docs.table(), f"docs/profile.md's key table is stale: {WRITE}"
    assert docs.BEGIN not in (ROOT / "README.md").read_text(), "the table moved to docs/profile.md"


def test_the_table_has_a_row_per_key() -> None:
    rows = docs.table().splitlines()[2:]
    assert [r.split(" | ")[0].strip("|` ") for r in rows] == \
        [k.name for k in keys.declared(Profile)]


def test_writing_the_table_touches_only_what_is_between_the_markers() -> None:
    text = f"before\n{docs.BEGIN}\nstale\n{docs.END}\nafter\n"
    written = docs.with_table(text)
    assert written == f"before\n{docs.BEGIN}\n{docs.table()}{docs.END}\nafter\n"
    assert docs.with_table(written) == written


def test_one_key_s_help() -> None:
    assert docs.describe("scheduler.radix_cache") == (
        "scheduler.radix_cache: true/false, default true (SGLang --disable-radix-cache when "
        "false)\n  Reuse the KV cache of shared prompt prefixes.")
    assert "write: e.g. 48" in docs.describe("memory.max_running_requests")
    assert docs.describe("model.source").startswith("model.source: string, default required")


def test_an_unknown_key_is_refused_with_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert docs.main(["memory.pagesize"]) == 2
    assert "did you mean memory.page_size?" in capsys.readouterr().err


def test_sglang_fleet_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys"]) == 0
    assert capsys.readouterr().out == docs.table()
    assert cli.main(["keys", "memory.page_size", "parallel.tp"]) == 0
    assert capsys.readouterr().out == (docs.describe("memory.page_size") + "\n"
                                       + docs.describe("parallel.tp") + "\n")
    assert cli.main(["keys", "memory.pagesize"]) == 1
    assert capsys.readouterr().err == ("error: sglang-fleet keys: memory.pagesize: is not a "
                                       "profile key\n    fix: did you mean memory.page_size?\n")
