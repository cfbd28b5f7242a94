"""What preflight needs from a model's ``config.json``.

    architecture("/models/qwen3.6-27b")   # 'Qwen3_5ForConditionalGeneration'

Read as strict UTF-8 with a size limit; every way the file can be wrong is an InputError that
says what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sglang_fleet.config import safeyaml, validators
from sglang_fleet.errors import InputError

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # Hugging Face configs are kilobytes
FIX = "pass the model's config.json (or its directory) with --model-config"


def _load(path: Path) -> Any:
    source = str(path)
    text = safeyaml.read_text(path, source, "the model config", MAX_CONFIG_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError.one(source, "", f"not valid JSON: line {exc.lineno}, column "
                             f"{exc.colno}: {exc.msg}", FIX) from None
    except RecursionError:
        raise InputError.one(source, "", "not valid JSON: nested too deeply", FIX) from None


def _archs_problem(archs: Any) -> str | None:
    if archs is None:
        return "is missing"
    if isinstance(archs, str):
        return f"is the string {archs[:80]!r}, not a list: write [{json.dumps(archs[:80])}]"
    if not isinstance(archs, list):
        return f"must be a list of class names, got {type(archs).__name__}"
    if not archs:
        return "is an empty list"
    if not isinstance(archs[0], str):
        return f"must list class names (strings), got {type(archs[0]).__name__} {archs[0]!r}"
    return validators.identifier_problem(archs[0])


def architecture(path: str | Path) -> str:
    """``architectures[0]`` of a config.json (or of the config.json inside a model directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = _load(path)
    if not isinstance(data, dict):
        raise InputError.one(str(path), "", f"must be a JSON object, got {type(data).__name__}",
                             FIX)
    archs: Any = data.get("architectures")
    wrong = _archs_problem(archs)
    if wrong:
        raise InputError.one(str(path), "architectures", wrong,
                             "a Hugging Face config.json lists the model class in "
                             'architectures, e.g. ["Qwen3_5ForConditionalGeneration"]')
    return str(archs[0])
