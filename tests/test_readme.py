"""The README's host-data table is the one the declaration (``hostconfig/keys.py``) makes."""

from __future__ import annotations

from sglang_fleet.hostconfig.table import between, table
from tests.conftest import ROOT

REGENERATE = "uv run python -m sglang_fleet.hostconfig --write README.md"


def test_the_readme_table_is_the_declared_one() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Host data\n", 1)[1].split("\n## ", 1)[0]
    assert between(section) is not None, "the Host data section has lost its table's markers"
    assert between(section) == table(), (
        "README.md's host-data table is not the one src/sglang_fleet/hostconfig/keys.py "
        f"declares; regenerate it: {REGENERATE}")
