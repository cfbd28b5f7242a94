"""The argparse ``type=`` functions SGLang's flags use, by the name the flag tables record.

Each mirrors SGLang's function of the same name (``sglang/srt/utils/common.py``,
``sglang/srt/model_executor/cuda_graph_config.py``) closely enough that a value is accepted or
rejected, and converted, the same way; argparse names a failing function in its message, so the
names must match too.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(value: str) -> int:
    """'1k' → 1000, '25.6k' → 25600, '1Ki' → 1024, '42' → 42."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'.")
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive.") from None


def nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


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


BY_NAME: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "loads": json.loads,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "json_list_type": json_list_type,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}
