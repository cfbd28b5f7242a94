"""docs/host-data.md's table is the one the declaration (``hostconfig/keys.py``) makes, and
product code reads host data only through that declaration."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TypeGuard

from sglang_fleet.config.keys import declared
from sglang_fleet.hostconfig import HostConfig
from sglang_fleet.hostconfig.table import TABLE
from tests.conftest import ROOT

SRC = ROOT / "src" / "sglang_fleet"
HOSTCONFIG = SRC / "hostconfig"
REGENERATE = "uv run python -m sglang_fleet.hostconfig --write docs/host-data.md"
# ``.data`` that is not a host's: the command line's and a roll's --data pairs, an SSE event's.
NOT_HOST_DATA = {"args.data", "plan.data", "self.plan.data", "made.plan.data", "roll.plan.data",
                 "event.data"}
# Ways into pyinfra's host and group data besides ``host.data``.
DATA_ATTRIBUTES = {"data", "datas", "get_data", "get_host_data", "get_group_data",
                   "get_groups_data", "get_override_data"}
# Keys only checked, never read: the one value their check lets through is the product's.
CHECKED_ONLY = {"nvidia_driver_flavour"}  # "open": anything else is refused


def product_modules() -> list[Path]:
    """Every module of the product but the declaration's package, and the deploy files."""
    return [p for p in [*SRC.rglob("*.py"), *(ROOT / "deploys").glob("*.py")]
            if HOSTCONFIG not in p.parents]


def _reads_data(node: ast.AST) -> TypeGuard[ast.expr]:
    """``X.data`` (and pyinfra's other ways into data), or ``getattr(X, "data")``."""
    if isinstance(node, ast.Attribute):
        return node.attr in DATA_ATTRIBUTES
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "data")


def host_data_reads(path: Path) -> list[str]:
    """``FILE:LINE: EXPRESSION`` for each way into host data in ``path``."""
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(ast.parse(path.read_text()))
            if _reads_data(node) and ast.unparse(node) not in NOT_HOST_DATA]


def test_the_doc_table_is_the_declared_one() -> None:
    doc = (ROOT / "docs" / "host-data.md").read_text()
    assert TABLE.in_doc(doc) is not None, "docs/host-data.md has lost its table's markers"
    assert TABLE.in_doc(doc) == TABLE.text(), (
        "docs/host-data.md's host-data table is not the one src/sglang_fleet/hostconfig/keys.py "
        f"declares; regenerate it: {REGENERATE}")


def test_product_code_reads_host_data_only_through_hostconfig() -> None:
    found = [read for path in product_modules() for read in host_data_reads(path)]
    assert len(product_modules()) > 50  # the scan found the product at all
    assert found == [], (
        "host data read around the declaration: read it as hostconfig.of(host).KEY (declare a "
        "new key in src/sglang_fleet/hostconfig/keys.py, then " + REGENERATE + "); an "
        "attribute named data that is not a host's belongs in NOT_HOST_DATA:\n"
        + "\n".join(found))


def test_every_declared_key_is_read() -> None:
    text = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    names = [k.name for k in declared(HostConfig)]
    assert len(names) > 30, names
    # ``.KEY`` not called: ``cfg.gpu_count``, ``of(host).routers``, not ``fleet.routers(...)``
    unread = [n for n in names
              if n not in CHECKED_ONLY and not re.search(rf"\.{n}\b(?!\s*\()", text)]
    assert unread == [], "declared in hostconfig/keys.py, read by no code"
