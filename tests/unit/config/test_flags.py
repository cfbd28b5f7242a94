from __future__ import annotations

import pytest

from sglang_fleet.config import flags, releases


def test_every_supported_release_has_a_table() -> None:
    for version in releases.supported():
        table = flags.load(version)
        assert table.get("--model-path") is not None
        assert "EAGLE" in table.speculative_names
        assert "NEXTN" in table.speculative_names | table.speculative_aliases
        assert table.parse(["--model-path", "/m"])["model_path"] == "/m"  # every type is known


def test_human_readable_int_like_sglang() -> None:
    table = flags.load("0.5.23")
    assert table.parse(["--model-path", "/m", "--context-length", "25.6k"])["context_length"] == \
        25600
    with pytest.raises(flags.ArgvError, match="Decimals are not allowed with IEC suffixes"):
        table.parse(["--model-path", "/m", "--context-length", "1.5Ki"])


@pytest.mark.parametrize(("version", "present", "absent"), [
    ("0.5.13.post1", "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
    ("0.5.14", "--mamba-radix-cache-strategy", None),
    ("0.5.20", "--mamba-radix-cache-strategy", "--mamba-scheduler-strategy"),
])
def test_strategy_flag_history(version: str, present: str, absent: str | None) -> None:
    table = flags.load(version)
    assert table.get(present) is not None
    if absent:
        assert table.get(absent) is None
    if version == "0.5.14":
        alias = table.get("--mamba-scheduler-strategy")
        assert alias is not None and alias.alias_of == "--mamba-radix-cache-strategy"


def test_parser_rejects_like_sglang() -> None:
    table = flags.load("0.5.23")
    base = ["--model-path", "/m"]
    with pytest.raises(flags.ArgvError, match="ambiguous option: --cuda-graph-max-bs could match"):
        table.parse([*base, "--cuda-graph-max-bs", "8"])
    with pytest.raises(flags.ArgvError, match="unrecognized arguments: --mamba-scheduler-strategy"):
        table.parse([*base, "--mamba-scheduler-strategy", "extra_buffer"])
    with pytest.raises(flags.ArgvError, match="invalid choice: 'bogus'"):
        table.parse([*base, "--mamba-radix-cache-strategy", "bogus"])


def test_parser_accepts_prefixes_like_sglang() -> None:
    args = flags.load("0.5.23").parse(["--model-path", "/m", "--speculative-algo", "NEXTN"])
    assert args["speculative_algorithm"] == "NEXTN"


def test_option_for_prefers_current_spelling() -> None:
    assert flags.load("0.5.19").option_for("mamba_radix_cache_strategy") == \
        "--mamba-radix-cache-strategy"
    assert flags.load("0.5.12").option_for("mamba_scheduler_strategy") == \
        "--mamba-scheduler-strategy"


def test_unknown_release() -> None:
    with pytest.raises(KeyError):
        flags.load("0.0.1")
