"""Resumable batch generation through an SGLang router or server, without the deploy (no
pyinfra): the commands ``sglang-fleet generate`` and ``results`` run, here as
``sglang-fleet-generate generate`` and ``results``.

    sglang-fleet-generate generate in.jsonl out/ --url http://10.0.0.10:30080
    sglang-fleet-generate results out/ > records.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

PROG = "sglang-fleet-generate"
MAX_KEY_FILE_BYTES = 4096


def generate(args: argparse.Namespace) -> int:
    """Resumable batch generation through a router or a server (see sglang_fleet_generate).
    Ctrl-C and SIGTERM stop it cleanly (exit 130 and 143), saying how to resume."""
    from sglang_fleet_generate.errors import GenerateError
    from sglang_fleet_generate.interrupt import sigterm_stops
    from sglang_fleet_generate.job import run
    from sglang_fleet_generate.job_state import Options

    # The smoke test's rules: a stray CR or space in the key would reach the failures file in
    # the HTTP library's error about the header.
    key = args.read_key(args.api_key_file) if args.api_key_file is not None else None
    try:
        with sigterm_stops():
            return run(Options(args.input, args.output, args.url.rstrip("/"), key, args.model,
                               args.concurrency, args.shard_size, args.retries, args.timeout,
                               json_status=args.json, s3_endpoint=args.s3_endpoint,
                               retry_failures=args.retry_failures,
                               redo_changed=args.redo_changed, ca_bundle=args.ca_bundle,
                               worker=args.worker, allow_mixed=args.allow_mixed),
                       args.argv)
    except OSError as exc:
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
    except KeyboardInterrupt as exc:
        return _interrupted(exc, args.argv, args.json)
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def _interrupted(exc: KeyboardInterrupt, argv: list[str], json_lines: bool) -> int:
    """Which signal stopped the job and the command that resumes it; 128 + the signal."""
    from sglang_fleet_generate.commands import as_run
    from sglang_fleet_generate.interrupt import signal_of

    sig, resume = signal_of(exc), as_run(argv)
    if json_lines:
        print(json.dumps({"event": "interrupted", "signal": sig.name, "resume_command": resume}),
              flush=True)
    print(f"interrupted ({sig.name}): run the same command again to resume:\n  {resume}",
          file=sys.stderr)
    return 128 + sig.value


def results(args: argparse.Namespace) -> int:
    """A generate job's records, each id once, as JSONL on stdout (or its failed lines)."""
    from sglang_fleet_generate.errors import GenerateError
    from sglang_fleet_generate.results import show

    try:
        return show(args.output, args.failed, args.s3_endpoint)
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def worker(text: str) -> tuple[int, int]:
    """``--worker K/N``. Example: worker("2/8") == (2, 8)."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit()) or not 0 <= int(k) < int(n) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r}: write K/N with 0 <= K < N, e.g. 0/4 for "
                                         "the first of four workers")
    return int(k), int(n)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser], usage: Any,
                read_key: Callable[[str], str], prog: str) -> None:
    """The ``generate`` and ``results`` parsers, in the order ``--help`` lists them, built
    with a command line's conventions: ``usage`` gives the command and the argument types
    (``sglang-fleet``'s usage module, or ``Plain``), ``read_key`` reads --api-key-file, and
    ``prog`` is the program the examples name."""
    s3_help = "S3 endpoint URL (default: boto3's, AWS_ENDPOINT_URL)"
    s3_url = usage.url("https://s3.example.com")
    p = usage.command(
        sub, "generate", help="resumable batch generation through a router or server",
        description="A batch generation job through a router (or one server): JSONL of chat "
        "requests or OpenAI Batch lines in, records in shards and a manifest out, locally or "
        "on S3. Run the same command again to resume. Exit status: 0 every line has a "
        "record, 100 + the failed lines (at most 255), 1 an error, 2 a usage error, 130 or "
        "143 when Ctrl-C or SIGTERM stopped it (it says how to resume).",
        examples=[f"{prog} generate in.jsonl out/ --url http://10.0.0.10:30080",
                  f"{prog} generate s3://data/in.jsonl s3://data/run-1/ --url "
                  "http://10.0.0.10:30080 --api-key-file key.txt --worker 0/4 --json"])
    usage.files(p.add_argument("input", help="JSONL of chat requests or OpenAI Batch lines: "
                               "a path, s3://bucket/key, or - for standard input"))
    usage.files(p.add_argument("output", help="a directory or s3://bucket/prefix/ for shards "
                               "and manifest"))
    p.add_argument("--url", required=True, type=usage.url("http://10.0.0.10:30080"),
                   help="the router or server, e.g. http://10.0.0.10:30080")
    usage.files(p.add_argument("--api-key-file", help="a file holding the API key"))
    p.add_argument("--model", help="model name to send (default: the server's /v1/models)")
    p.add_argument("--concurrency", type=usage.count(1, "--concurrency 64"), default=64,
                   help="requests in flight when the fleet cannot be sized (default 64)")
    p.add_argument("--shard-size", type=usage.count(1, "--shard-size 1000"), default=1000,
                   help="lines per shard (default 1000)")
    p.add_argument("--retries", type=usage.count(0, "--retries 8"), default=8,
                   help="retries on connection errors, 429, 502, 503, 504 (default 8)")
    p.add_argument("--timeout", type=usage.seconds(1, None, "--timeout 3600"), default=3600,
                   help="seconds per request (3600)")
    p.add_argument("--s3-endpoint", type=s3_url, help=s3_help)
    usage.files(p.add_argument("--ca-bundle", metavar="PATH", help="PEM file of the CAs that "
                               "an https:// --url is checked against (default: SSL_CERT_FILE, "
                               "else certifi's)"))
    p.add_argument("--json", action="store_true", help="JSON status lines instead of a bar")
    p.add_argument("--retry-failures", action="store_true",
                   help="on a finished job: send its failed lines again (a new retry-RRR shard)")
    p.add_argument("--redo-changed", action="store_true",
                   help="discard and redo the finished shards whose input lines changed "
                   "(default: refuse the run, naming the first one)")
    p.add_argument("--worker", type=worker, metavar="K/N", help="run worker K (from 0) of N "
                   "on one job: the shards i with i %% N == K (e.g. a Slurm array's "
                   "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="go on although the fleet's fingerprint (model, revision, SGLang "
                   "release, sampling and speculative settings) differs from the job's records'")
    p.set_defaults(func=generate, read_key=read_key)

    p = usage.command(
        sub, "results", help="a generate job's final records, each id once, as JSONL "
        "(read-only)",
        description="A generate job's final records, each id once, as JSONL on standard "
        "output (or, with --failed, the input lines still without a record). Exit status: 0 "
        "every record printed, 1 an error (or a job not complete yet: its committed records "
        "are printed), 2 a usage error.",
        examples=[f"{prog} results out/ > records.jsonl",
                  f"{prog} results s3://data/run-1/ --failed > failed.jsonl"])
    usage.files(p.add_argument("output", help="the generate job's directory or "
                               "s3://bucket/prefix/"))
    p.add_argument("--failed", action="store_true",
                   help="print the lines still without a record instead")
    p.add_argument("--s3-endpoint", type=s3_url, help=s3_help)
    p.set_defaults(func=results)


def _typed(kind: Callable[[str], Any], problem: Callable[[Any], str | None],
           example: str) -> Callable[[str], Any]:
    """An argparse type: ``kind`` of the text, refused (exit 2) when ``problem`` finds one."""
    def read(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. {example})") \
                from None
        wrong = problem(value)
        if wrong:  # never the text itself: a URL may hold user:password@
            raise argparse.ArgumentTypeError(f"{wrong} (e.g. {example})")
        return value

    return read


class Plain:
    """This command line's conventions (``sglang-fleet`` has its own, with the same names):
    argparse's help and usage errors, and values checked as the job checks them."""

    @staticmethod
    def command(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, *,
                help: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description,
                              epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    @staticmethod
    def files(action: argparse.Action) -> argparse.Action:
        return action

    @staticmethod
    def count(low: int, example: str) -> Callable[[str], Any]:
        return _typed(int, lambda v: f"must be at least {low}, got {v}" if v < low else None,
                      example)

    @staticmethod
    def seconds(low: float, high: None, example: str) -> Callable[[str], Any]:
        return _typed(float, lambda v: None if math.isfinite(v) and v >= low else
                      f"must be seconds of at least {low:g}, got {v}", example)

    @staticmethod
    def url(example: str) -> Callable[[str], Any]:
        from sglang_fleet_generate.text import url_problem

        return _typed(str, lambda v: url_problem(v, allow_http=True), example)


def read_key(path: str) -> str:
    """The API key in ``path``: one line of printable ASCII, nothing else (GenerateError)."""
    from sglang_fleet_generate.errors import GenerateError

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise GenerateError(f"{path}: {exc.strerror or exc}") from None
    key = data.removesuffix(b"\n").removesuffix(b"\r")
    if not key or len(data) > MAX_KEY_FILE_BYTES or any(b <= 0x20 or b >= 0x7F for b in key):
        raise GenerateError(f"{path}: the API key must be the file's only line, printable "
                            "ASCII without spaces\n    fix: put the key alone on the file's "
                            "one line")
    return key.decode()


def main(argv: Sequence[str] | None = None) -> int:
    """``sglang-fleet-generate generate|results ...``, with ``sglang-fleet``'s exit status."""
    from sglang_fleet_generate import commands
    from sglang_fleet_generate.errors import GenerateError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parsers(parser.add_subparsers(dest="command", required=True), Plain, read_key, PROG)
    args = parser.parse_args(argv)
    args.argv = argv  # as given: the commands a run prints (resume, retry) repeat it
    commands.PROGRAM = PROG  # ... and name this program
    try:
        code: int = args.func(args)
    except GenerateError as exc:  # the API key file
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code
