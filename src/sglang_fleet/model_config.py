"""What preflight needs from a model's ``config.json``."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_fleet.errors import InputError


def architecture(path: str | Path) -> str:
    """``architectures[0]`` of a config.json (or of the config.json inside a model directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    fix = "pass the model's config.json (or its directory) with --model-config"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError.one(str(path), "", f"cannot read the model config: {exc.strerror}",
                             fix) from None
    except json.JSONDecodeError as exc:
        raise InputError.one(str(path), "", f"not valid JSON: line {exc.lineno}: {exc.msg}",
                             fix) from None
    archs = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InputError.one(str(path), "architectures", "missing or empty",
                             "a Hugging Face config.json lists the model class in architectures")
    return archs[0]
