"""The commands a run prints for what comes next: the same command again (to resume after an
interruption), with ``--retry-failures`` (to send the failed lines again), and
``sglang-fleet results`` (every record in one view). Each is the command line as given
(``sys.argv``, the program named ``sglang-fleet``), quoted for a POSIX shell.

    retry_command(["generate", "in.jsonl", "out/", "--url", "http://h:30080", "--redo-changed"])
    # 'sglang-fleet generate in.jsonl out/ --url http://h:30080 --retry-failures'
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sglang_fleet_generate.identity import REDO_FLAG  # refused beside --retry-failures

PROGRAM = "sglang-fleet"
RETRY_FLAG = "--retry-failures"


def as_run(argv: Sequence[str]) -> str:
    """The command line as given (without the program). Example:
    as_run(["generate", "my in.jsonl", "out"]) == "sglang-fleet generate 'my in.jsonl' out"."""
    return shlex.join([PROGRAM, *argv])


def _is_flag(token: str, flag: str) -> bool:
    """Whether argparse read ``token`` as ``flag``: the flag or a prefix of it (argparse takes
    an unambiguous prefix, and refused the command line had the prefix been ambiguous)."""
    return token.startswith("--") and len(token) > 2 and flag.startswith(token)


def retry_command(argv: Sequence[str]) -> str:
    """The command that sends the failed lines again: the one given, with --retry-failures
    (once) and without --redo-changed (the two cannot go together)."""
    end = list(argv).index("--") if "--" in argv else len(argv)  # after it: positionals
    options = [t for t in argv[:end] if not _is_flag(t, REDO_FLAG)]
    if not any(_is_flag(t, RETRY_FLAG) for t in options):
        options.append(RETRY_FLAG)
    return as_run([*options, *argv[end:]])


def results_command(output: str, s3_endpoint: str | None) -> str:
    """Example: results_command("out/", None) == "sglang-fleet results out/"."""
    return as_run(["results", output, *(["--s3-endpoint", s3_endpoint] if s3_endpoint else [])])
