"""``sglang-fleet``: render and check serving profiles, smoke-test servers, roll a fleet through
its router, and run the lab.

Exit status: 0 fine, 1 a problem in the input (the message names file, key and fix),
2 a usage error, 3 an internal error (a bug: one line, and the file holding the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence

from sglang_fleet.config import preflight, profile, releases, safeyaml, sizing, validators
from sglang_fleet.config.render import Launch, render
from sglang_fleet.errors import InputError, Problem

INTERNAL_ERROR = 3
MAX_KEY_FILE_BYTES = 4096
# The lab's commands: its own package (a workspace member), never imported by the product's.
LAB_PACKAGE = "lab/fleet-lab"
LAB_COMMANDS = {"lab": "simulated B200 hosts on this machine (needs root; the lab package)",
                "demo": "lab up, deploy, router, smoke: the whole product on lab hosts "
                        "(the lab package)"}


def _load(args: argparse.Namespace) -> tuple[profile.Profile, Launch]:
    """The profile and its first server's launch as a first start on a host of ``--gpus`` runs
    it (a target's size is the host's)."""
    prof = profile.load(args.profile, allow_insecure_urls=args.allow_insecure_urls)
    prof = sizing.apply(prof.for_gpus(args.gpus, f"a host of --gpus {args.gpus}"), None)
    return prof, render(prof, args.sglang_version)


def _gpus(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1024:
        raise argparse.ArgumentTypeError(f"must be a number of GPUs from 1 to 1024, got {text!r}")
    return int(text)


def cmd_render(args: argparse.Namespace) -> int:
    _, launch = _load(args)
    if args.format == "json":
        print(json.dumps(launch.as_json(), indent=2))
    else:
        print(launch.as_shell())
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    prof, launch = _load(args)
    arch = preflight.resolve_architecture(prof, args.model_config)
    source = args.model_config or prof.model.config  # the profile's architecture: by render
    wrong = releases.architecture_problem(arch, launch.version) if arch and source else None
    if wrong and not any(w.startswith("--model-impl") for w in prof.extra_args):
        raise InputError.one(str(source), "architectures", wrong,
                             "check the model's config.json, or pin a release that serves it")
    preflight.require(prof, launch, arch)
    print(f"{args.profile}: ok for SGLang {launch.version}"
          + (f" ({arch})" if arch else " (no architecture known: hybrid-model rules skipped)"))
    return 0


CAPACITY_PARTIAL = 4  # sglang-fleet capacity: the log ends before the server was up


def cmd_capacity(args: argparse.Namespace) -> int:
    """The capacity report and advice from a startup log (journal text or plain log).
    Exit status: 0 a complete report, CAPACITY_PARTIAL a partial one, 1 no SGLang startup line
    (or an unreadable log, or a release that is not supported)."""
    from pathlib import Path

    from sglang_fleet.remote import capacity

    version = args.sglang_version
    if version is not None and (problem := releases.version_problem(version)):
        raise InputError.one("--sglang-version", "", problem, "give the release that wrote "
                             "the log, or leave the option out")
    try:
        text = sys.stdin.read() if args.log == "-" else \
            Path(args.log).read_text(errors="replace")
    except OSError as exc:
        print(f"sglang-fleet capacity: cannot read {args.log}: {exc.strerror}; give a log file "
              "or - for standard input (e.g. journalctl -u sglang -o cat | sglang-fleet "
              "capacity -)", file=sys.stderr)
        return 1
    cap = capacity.parse(text.splitlines(), version)
    status = {capacity.COMPLETE: 0, capacity.PARTIAL: CAPACITY_PARTIAL}.get(cap.state, 1)
    if args.json:
        print(json.dumps({**cap.as_json(), "advice": capacity.advice(cap)}, indent=2))
        return status
    if cap.state == capacity.NOT_A_LOG:
        print(f"{args.log}: not an SGLang startup log: none of the lines the report reads "
              "(Load weight end, KV Cache is allocated, Memory pool end, max_total_num_tokens=)",
              file=sys.stderr)
        return 1
    for line in capacity.report(cap):
        print(line)
    return status


def api_key_from(path: str) -> str:
    """The API key in ``path``: one line of printable ASCII, nothing else (InputError if not)."""
    source, fix = path, "put the key alone on the file's one line"
    text = safeyaml.read_text(path, source, "the API key file", MAX_KEY_FILE_BYTES)
    lines = text.removesuffix("\n").removesuffix("\r").split("\n")
    if len(lines) > 1:
        raise InputError.one(source, "", f"holds {len(lines)} lines; the key must be the only "
                             "line", fix)
    key = lines[0]
    if not key.strip():
        raise InputError.one(source, "", "is empty", fix)
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        wrong = validators.control_char(key) or "holds spaces or characters outside printable " \
            "ASCII, which an HTTP Authorization header cannot carry"
        raise InputError.one(source, "", wrong, fix)
    return key


def smoke_url(url: str) -> str:
    """The base URL of a server or router, without a trailing slash (InputError if unusable)."""
    wrong = validators.url_problem(url, allow_http=True)
    if wrong:
        example = "http://10.0.0.11:30000"
        if wrong.startswith("is ") or "://" not in url:
            fix = f"give the server's base URL with its scheme, e.g. {example}"
        else:
            fix = f"e.g. {example}"
        raise InputError.one("smoke", "URL", wrong, fix)
    return url.rstrip("/")


def _served_model(url: str, key: str | None) -> str:
    """The first model ``url`` serves, from /v1/models; GateError saying what it answered."""
    from sglang_fleet.remote import check_server

    status, raw = check_server.request(f"{url}/v1/models", key)
    if status == 401:
        raise check_server.GateError(f"{url}/v1/models answered 401 (an API key is needed: "
                                   "--api-key-file, or the key there is not this server's)")
    if status != 200:
        raise check_server.GateError(f"{url}/v1/models {check_server.answered(status, raw)}")
    try:
        data = json.loads(raw)
    except ValueError:
        raise check_server.GateError(f"{url}/v1/models answered 200 but not JSON: "
                                   f"{raw[:80]!r} (is it an SGLang server or router?)") from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list):
        raise check_server.GateError(f"{url}/v1/models answered JSON without a model list "
                                   "(is it an SGLang server or router?)")
    if not models:
        raise check_server.GateError(f"{url}/v1/models lists no model (a router without "
                                   "healthy workers?)")
    model = models[0].get("id") if isinstance(models[0], dict) else None
    if not isinstance(model, str) or validators.text_problem(model, 256):
        raise check_server.GateError(f"{url}/v1/models lists a model without a usable id")
    return model


def cmd_smoke(args: argparse.Namespace) -> int:
    """The gate's smoke generation against a running server (or router); changes nothing."""
    from sglang_fleet.remote import check_server

    url = smoke_url(args.url)
    key = api_key_from(args.api_key_file) if args.api_key_file is not None else None
    report: dict[str, object] = {"url": url, "ok": False}
    try:
        report["model"] = model = _served_model(url, key)
        report["smoke"] = result = check_server.smoke(url, key, model)
        report["ok"] = True
        if not args.json:
            print(f"{url} ({model}): " + check_server.describe(result))
    except check_server.GateError as err:
        report["error"] = str(err)
        if not args.json:
            print(f"error: {err}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def cmd_roll(args: argparse.Namespace) -> int:
    """Rolling redeploy through the router (see sglang_fleet.rollout.roll)."""
    from sglang_fleet.rollout import roll

    return roll.main(args.inventory, args.data, args.batch, args.drain_timeout,
                     args.health_timeout, args.batch_instances)


def cmd_status(args: argparse.Namespace) -> int:
    """One row per server instance and router of an inventory (see sglang_fleet.report.status)."""
    from sglang_fleet.report import status

    fleet = status.collect(args.inventory)
    if args.json:
        print(json.dumps(fleet.as_json(), indent=2))
    else:
        print("\n".join([status.table(fleet.rows), "", *fleet.lines()]))
    return 0


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    insecure_help = ("accept a plain http:// engine.index_url (as host data "
                     "allow_insecure_urls does for a deploy)")
    gpus_help = ("the host's GPU count, which parallel.instances: auto divides into servers "
                 "(default 8, a B200 host); the first server's launch is shown")
    version_help = f"SGLang release to render for (default: the profile's pin; known: " \
                   f"{releases.supported()[0]} … {releases.supported()[-1]})"

    p = sub.add_parser("render", help="print the launch command and environment of a profile")
    p.add_argument("profile", help="a profile YAML file, or a shipped profile's name, e.g. "
                   "qwen3.6-27b-mtp")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    p.add_argument("--gpus", type=_gpus, default=8, help=gpus_help)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="validate a profile and apply SGLang's startup rules")
    p.add_argument("profile", help="a profile YAML file, or a shipped profile's name")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--allow-insecure-urls", action="store_true", help=insecure_help)
    p.add_argument("--model-config", help="the model's config.json (or its directory)")
    p.add_argument("--gpus", type=_gpus, default=8, help=gpus_help)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("capacity", help="capacity report and advice from an SGLang startup log",
                       description="Exit status: 0 a complete report, 4 a partial one (the log "
                       "ends before the server was up), 1 not an SGLang startup log.")
    p.add_argument("log", help="a log file (journal text or plain log), or - for standard input")
    p.add_argument("--sglang-version", help="the release that wrote the log (lets the report "
                   "infer a mamba cap that releases before 0.5.17 do not log)")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_capacity)

    p = sub.add_parser("smoke", help="a smoke generation against a running server or router")
    p.add_argument("url", help="e.g. http://10.0.0.11:30000")
    p.add_argument("--api-key-file", help="a file holding the API key")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_smoke)

    p = sub.add_parser("roll", help="rolling redeploy through the router, stopping at the "
                       "first failure and putting that host's last good release back")
    p.add_argument("inventory", help="a pyinfra inventory, e.g. inventories/b200.py")
    p.add_argument("--batch", type=int, default=1, help="hosts at a time (default 1)")
    p.add_argument("--batch-instances", type=int, default=None, metavar="K",
                   help="a host's servers restarted K at a time (after the first, alone), "
                   "only those out of the router, so the host keeps serving (default: the "
                   "host leaves the router whole)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="pyinfra data for the deploy, e.g. sglang.memory.page_size=64")
    p.add_argument("--drain-timeout", type=float, default=600,
                   help="seconds to wait for a host's requests in flight (default 600)")
    p.add_argument("--health-timeout", type=float, default=300,
                   help="seconds for the router to see a host healthy again (default 300)")
    p.set_defaults(func=cmd_roll)

    p = sub.add_parser("status", help="one row per server and router of an inventory: unit, "
                       "release, health, load, GPU memory and health, router (read-only)")
    p.add_argument("inventory", help="a pyinfra inventory, e.g. inventories/b200.py")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("generate", help="resumable batch generation through a router or server")
    p.add_argument("input", help="JSONL of chat requests or OpenAI Batch lines: a path, "
                   "s3://bucket/key, or - for standard input")
    p.add_argument("output", help="a directory or s3://bucket/prefix/ for shards and manifest")
    p.add_argument("--url", required=True, help="the router or server, e.g. http://10.0.0.10:30080")
    p.add_argument("--api-key-file", help="a file holding the API key")
    p.add_argument("--model", help="model name to send (default: the server's /v1/models)")
    p.add_argument("--concurrency", type=int, default=64,
                   help="requests in flight when the fleet cannot be sized (default 64)")
    p.add_argument("--shard-size", type=int, default=1000, help="lines per shard (default 1000)")
    p.add_argument("--retries", type=int, default=8,
                   help="retries on connection errors, 429, 502, 503, 504 (default 8)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per request (3600)")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: boto3's, AWS_ENDPOINT_URL)")
    p.add_argument("--ca-bundle", metavar="PATH", help="PEM file of the CAs that an https:// "
                   "--url is checked against (default: SSL_CERT_FILE, else certifi's)")
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

    p = sub.add_parser("results", help="a generate job's final records, each id once, as JSONL "
                       "(read-only)", description="Exit status: 0 every record printed, 1 an "
                       "error (or a job not complete yet: its committed records are printed).")
    p.add_argument("output", help="the generate job's directory or s3://bucket/prefix/")
    p.add_argument("--failed", action="store_true",
                   help="print the lines still without a record instead")
    p.add_argument("--s3-endpoint", help="S3 endpoint URL (default: boto3's, AWS_ENDPOINT_URL)")
    p.set_defaults(func=cmd_results)

    for name, what in LAB_COMMANDS.items():  # listed here, parsed by the lab (run_lab)
        sub.add_parser(name, help=what, add_help=False)
    return parser


def run_lab(argv: list[str]) -> int:
    """``sglang-fleet lab …`` and ``demo``: the lab package's commands, imported only for them
    (the product does not depend on the lab); without the lab, one line on how to install it.

        run_lab(["lab", "status"])  # the lab's hosts, or: the lab is not installed ...
    """
    try:
        from sglang_fleet_lab import cli as lab_cli
    except ModuleNotFoundError as exc:
        if exc.name != "sglang_fleet_lab":  # the lab is there but broken: a bug, said as one
            raise
        print(f"sglang-fleet {argv[0]}: the lab is not installed; it is its own package, "
              f"{LAB_PACKAGE}: run uv sync in a checkout (it is in the dev group), or "
              f"pip install ./{LAB_PACKAGE}", file=sys.stderr)
        return 2
    return lab_cli.main(argv)


def report_problems(problems: list[Problem]) -> None:
    """``error: SOURCE: KEY: what is wrong`` and its ``fix:`` line, for each problem."""
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)


def report_internal_error(exc: BaseException) -> int:
    """A bug: one line on stderr, the traceback in a file (never a bare traceback)."""
    summary = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    try:
        with tempfile.NamedTemporaryFile("w", prefix="sglang-fleet-crash-", suffix=".txt",
                                         delete=False) as out:
            traceback.print_exception(exc, file=out)
        where = f"traceback in {out.name}"
    except OSError as err:
        where = f"and the traceback could not be saved: {err.strerror}"
    print(f"internal error (a bug in sglang-fleet, please report it): {summary}; {where}",
          file=sys.stderr)
    return INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lab = bool(argv) and argv[0] in LAB_COMMANDS
    args = None if lab else _parser().parse_args(argv)
    if args is not None:
        args.argv = argv  # as given: the commands printed back (resume, retry) repeat it
    try:
        code: int = run_lab(argv) if args is None else args.func(args)
    except InputError as exc:
        report_problems(exc.problems)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): not a bug, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # every other exception is a bug: say so in one line
        return report_internal_error(exc)
    return code

