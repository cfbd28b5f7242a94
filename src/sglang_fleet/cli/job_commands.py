"""``sglang-fleet generate`` and ``results``: a resumable batch generation job through a router
or a server, and its records.

    sglang-fleet generate in.jsonl out/ --url http://10.0.0.10:30080
    sglang-fleet results out/ > records.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_fleet.cli import usage
from sglang_fleet.cli.server_commands import api_key_from


def cmd_generate(args: argparse.Namespace) -> int:
    """Resumable batch generation through a router or a server (see sglang_fleet.generate).
    Ctrl-C and SIGTERM stop it cleanly (exit 130 and 143), saying how to resume."""
    from sglang_fleet.generate import Options, run
    from sglang_fleet.generate.errors import GenerateError
    from sglang_fleet.generate.interrupt import sigterm_stops

    # The smoke test's rules: a stray CR or space in the key would reach the failures file in
    # the HTTP library's error about the header.
    key = api_key_from(args.api_key_file) if args.api_key_file is not None else None
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
    from sglang_fleet.generate.commands import as_run
    from sglang_fleet.generate.interrupt import signal_of

    sig, resume = signal_of(exc), as_run(argv)
    if json_lines:
        print(json.dumps({"event": "interrupted", "signal": sig.name, "resume_command": resume}),
              flush=True)
    print(f"interrupted ({sig.name}): run the same command again to resume:\n  {resume}",
          file=sys.stderr)
    return 128 + sig.value


def cmd_results(args: argparse.Namespace) -> int:
    """A generate job's records, each id once, as JSONL on stdout (or its failed lines)."""
    from sglang_fleet.generate.errors import GenerateError
    from sglang_fleet.generate.results import show

    try:
        return show(args.output, args.failed, args.s3_endpoint)
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def _worker(text: str) -> tuple[int, int]:
    """``--worker K/N``. Example: _worker("2/8") == (2, 8)."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit()) or not 0 <= int(k) < int(n) <= 100_000:
        raise argparse.ArgumentTypeError(f"{text!r}: write K/N with 0 <= K < N, e.g. 0/4 for "
                                         "the first of four workers")
    return int(k), int(n)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The job commands' parsers, in the order ``--help`` lists them."""
    s3_help = "S3 endpoint URL (default: boto3's, AWS_ENDPOINT_URL)"
    s3_url = usage.url("https://s3.example.com")
    p = usage.command(
        sub, "generate", help="resumable batch generation through a router or server",
        description="A batch generation job through a router (or one server): JSONL of chat "
        "requests or OpenAI Batch lines in, records in shards and a manifest out, locally or "
        "on S3. Run the same command again to resume. Exit status: 0 every line has a "
        "record, 100 + the failed lines (at most 255), 1 an error, 2 a usage error, 130 or "
        "143 when Ctrl-C or SIGTERM stopped it (it says how to resume).",
        examples=["sglang-fleet generate in.jsonl out/ --url http://10.0.0.10:30080",
                  "sglang-fleet generate s3://data/in.jsonl s3://data/run-1/ --url "
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
    p.add_argument("--worker", type=_worker, metavar="K/N", help="run worker K (from 0) of N "
                   "on one job: the shards i with i %% N == K (e.g. a Slurm array's "
                   "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--allow-mixed", action="store_true",
                   help="go on although the fleet's fingerprint (model, revision, SGLang "
                   "release, sampling and speculative settings) differs from the job's records'")
    p.set_defaults(func=cmd_generate)

    p = usage.command(
        sub, "results", help="a generate job's final records, each id once, as JSONL "
        "(read-only)",
        description="A generate job's final records, each id once, as JSONL on standard "
        "output (or, with --failed, the input lines still without a record). Exit status: 0 "
        "every record printed, 1 an error (or a job not complete yet: its committed records "
        "are printed), 2 a usage error.",
        examples=["sglang-fleet results out/ > records.jsonl",
                  "sglang-fleet results s3://data/run-1/ --failed > failed.jsonl"])
    usage.files(p.add_argument("output", help="the generate job's directory or "
                               "s3://bucket/prefix/"))
    p.add_argument("--failed", action="store_true",
                   help="print the lines still without a record instead")
    p.add_argument("--s3-endpoint", type=s3_url, help=s3_help)
    p.set_defaults(func=cmd_results)
