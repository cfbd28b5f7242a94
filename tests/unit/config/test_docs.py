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
    table = docs.TABLE
    assert table.in_doc(text), f"docs/profile.md has no {table.begin} ... {table.end}"
    section = text.split("\n## Profiles\n", 1)[1].split("\n## ", 1)[0]
    assert table.begin in section, "the key table belongs in docs/profile.md's Profiles section"
    assert table.in_doc(text) == table.text(), f"docs/profile.md's key table is stale: {WRITE}"
    assert table.begin not in (ROOT / "README.md").read_text(), "the table moved to docs/profile.md"


def test_the_table_has_a_row_per_key() -> None:
    rows = docs.TABLE.text().splitlines()[2:]
    assert [r.split(" | ")[0].strip("|` ") for r in rows] == \
        [k.name for k in keys.declared(Profile)]


def test_writing_the_table_touches_only_what_is_between_the_markers() -> None:
    table = docs.TABLE
    text = f"before\n{table.begin}\nstale\n{table.end}\nafter\n"
    written = table.with_table(text)
    assert written == f"before\n{table.begin}\n{table.text()}{table.end}\nafter\n"
    assert table.with_table(written) == written


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
    assert capsys.readouterr().out == docs.TABLE.text()
    assert cli.main(["keys", "memory.page_size", "parallel.tp"]) == 0
    assert capsys.readouterr().out == (docs.describe("memory.page_size") + "\n"
                                       + docs.describe("parallel.tp") + "\n")
    assert cli.main(["keys", "memory.pagesize"]) == 1
    assert capsys.readouterr().err == ("error: sglang-fleet keys: memory.pagesize: is not a "
                                       "profile key\n    fix: did you mean memory.page_size?\n")
