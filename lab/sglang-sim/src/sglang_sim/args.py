"""Command-line arguments as the imitated SGLang release parses them.

The release is ``SGLANG_SIM_VERSION`` (default: the project's pinned release). Its flag table,
extracted from that release's argparse definitions, rebuilds the parser: unknown, removed,
ambiguous and mistyped flags fail with argparse's own messages and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from decimal import Decimal
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

_REPO_DATA = Path(__file__).resolve().parents[4] / "src" / "sglang_fleet" / "data"


def _data_dir() -> Path:
    packaged = Path(str(resources.files("sglang_sim")))
    if (packaged / "flags").is_dir():
        return packaged
    return _REPO_DATA  # an editable install in the repository's workspace


def default_version() -> str:
    """The release this installation imitates: its own version when that is an SGLang release
    (a lab wheel), else the project's pinned release."""
    try:
        own = metadata.version("sglang-sim")
    except metadata.PackageNotFoundError:
        own = ""
    if own and (_data_dir() / "flags" / f"{own}.json").is_file():
        return own
    return str(json.loads((_data_dir() / "releases.json").read_text())["pinned"])


def version() -> str:
    return os.environ.get("SGLANG_SIM_VERSION") or default_version()


def release_tuple(v: str) -> tuple[int, ...]:
    """'0.5.13.post1' → (0, 5, 13, 1); '0.5.14' → (0, 5, 14, 0)."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", v)
    if not m:
        raise ValueError(f"not an SGLang release: {v}")
    return tuple(int(x or 0) for x in m.groups())


def human_readable_int(value: str) -> int:
    """SGLang's sglang.srt.utils.common.human_readable_int."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'.")
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), "
            "or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive.") from None


def nullable_str(val: str) -> str | None:
    return None if not val or val == "None" else val


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def parse_cuda_graph_backend_arg(raw: str) -> str:
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw: str) -> Any:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    return parsed


# The product copies them too (config/argtypes.py); tests/test_argtypes.py holds the two alike.
_TYPES = {f.__name__: f for f in (int, float, str, json.loads, human_readable_int, nullable_str,
                                  json_list_type, parse_cuda_graph_backend_arg,
                                  parse_cuda_graph_config_arg)}
_SIMPLE_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true",
                   "_StoreFalseAction": "store_false", "_StoreConstAction": "store_const",
                   "_AppendAction": "append", "_AppendConstAction": "append_const",
                   "_CountAction": "count"}


@cache
def table(release: str) -> dict[str, Any]:
    path = _data_dir() / "flags" / f"{release}.json"
    if not path.is_file():
        raise SystemExit(f"sglang-sim: no flag table for SGLang {release} (SGLANG_SIM_VERSION)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def build_parser(release: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    for entry in table(release)["flags"]:
        options = list(entry["options"])
        kw: dict[str, Any] = {"dest": entry["dest"], "default": entry["default"]}
        kind = entry["action"]
        if kind == "BooleanOptionalAction":
            options = [o for o in options if not o.startswith("--no-")]
            kw["action"] = argparse.BooleanOptionalAction
        elif kind in _SIMPLE_ACTIONS:
            kw["action"] = _SIMPLE_ACTIONS[kind]
        elif entry["nargs"] == 0:
            kw.update(action="store_const", const=entry["const"])
        else:
            kw["action"] = "store"
        if kw["action"] in ("store", "append"):
            if entry["type"]:
                kw["type"] = _TYPES[entry["type"]]
            if entry["nargs"] is not None:
                kw["nargs"] = entry["nargs"]
            if entry["choices"] is not None:
                kw["choices"] = entry["choices"]
        elif kw["action"] in ("store_const", "append_const"):
            kw["const"] = entry["const"]
        parser.add_argument(*options, **kw)
    return parser


# ServerArgs.from_cli_args copies these argparse destinations to the dataclass fields.
_FIELD_OF = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
             "data_parallel_size": "dp_size", "expert_parallel_size": "ep_size"}


def parse(argv: list[str], release: str) -> argparse.Namespace:
    """Parse like the release; on a bad flag, argparse prints its message and exits 2."""
    args = build_parser(release).parse_args(argv)
    for dest, name in _FIELD_OF.items():
        if hasattr(args, dest):
            setattr(args, name, getattr(args, dest))
            delattr(args, dest)
    return args
