"""``sglang-fleet generate`` and ``results``: the generate package's commands
(sglang_fleet_generate.cli), with this command line's argument types and usage errors, and
the API key file read as every command reads it.

    sglang-fleet generate in.jsonl out/ --url http://10.0.0.10:30080
    sglang-fleet results out/ > records.jsonl
"""

from __future__ import annotations

import argparse

from sglang_fleet.cli import usage
from sglang_fleet.cli.server_commands import api_key_from
from sglang_fleet_generate import cli


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The job commands' parsers, in the order ``--help`` lists them."""
    cli.add_parsers(sub, usage, api_key_from, "sglang-fleet")
