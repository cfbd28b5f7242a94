#!/usr/bin/env python3
"""The model architectures each SGLang release serves natively, read from its published wheel.

SGLang's ``ModelRegistry`` imports every module of ``sglang.srt.models`` (not subpackages) and
registers ``EntryClass`` (a class or a list of classes) under the class's ``__name__``. This
script reads the same assignments statically (no import, no GPU) and writes
``src/sglang_fleet/data/architectures.json``: release -> sorted architecture names.

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    python3 scripts/extract_architectures.py /tmp/sgl/sglang-0.5.23-*.whl [more wheels ...]

Releases already in the file are kept unless a wheel of the same release is given.
Standard library only.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src/sglang_fleet/data/architectures.json"
MODELS = re.compile(r"^sglang/srt/models/([A-Za-z0-9_]+)\.py$")


def _imported_as(tree: ast.Module) -> dict[str, str]:
    """Local name -> original class name for ``from x import Y as Z``."""
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = alias.name
    return names


def entry_classes(source: str) -> list[str]:
    """The class names a module's top-level ``EntryClass = ...`` registers."""
    tree = ast.parse(source)
    real = _imported_as(tree)
    found: list[str] = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets)):
            continue
        values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
        found = [real.get(v.id, v.id) for v in values if isinstance(v, ast.Name)]
    return found


def release_archs(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        version = re.search(r"^Version: (\S+)$", z.read(meta).decode(), re.M)
        assert version, f"{wheel}: no version in {meta}"
        archs = {a for name in z.namelist() if MODELS.match(name)
                 for a in entry_classes(z.read(name).decode("utf-8-sig"))}
    return version.group(1), sorted(archs)


def main(wheels: list[str]) -> int:
    table: dict[str, list[str]] = json.loads(OUT.read_text()) if OUT.exists() else {}
    for wheel in wheels:
        version, archs = release_archs(Path(wheel))
        table[version] = archs
        print(f"{version}: {len(archs)} architectures", file=sys.stderr)
    OUT.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
