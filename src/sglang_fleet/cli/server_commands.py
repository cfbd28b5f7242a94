"""``sglang-fleet capacity`` and ``smoke``: what a server says, from its startup log (the
capacity report and advice) or from the server itself (the gate's smoke generation).

    journalctl -u sglang -o cat | sglang-fleet capacity -
    sglang-fleet smoke http://10.0.0.11:30000 --api-key-file key.txt
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_fleet.cli import usage
from sglang_fleet.config import safeyaml, validators
from sglang_fleet.errors import InputError

MAX_KEY_FILE_BYTES = 4096
CAPACITY_PARTIAL = 4  # sglang-fleet capacity: the log ends before the server was up


def cmd_capacity(args: argparse.Namespace) -> int:
    """The capacity report and advice from a startup log (journal text or plain log)."""
    from pathlib import Path

    from sglang_fleet.remote import capacity

    version = args.sglang_version  # a supported release: usage.release
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


def _served_model(url: str, key: str | None) -> str:
    """The first model ``url`` serves, from /v1/models; GateError saying what it answered."""
    from sglang_fleet.stages.gate.host import check_server

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
    from sglang_fleet.stages.gate.host import check_server

    url = args.url.rstrip("/")  # a URL: usage.url
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


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The server commands' parsers, in the order ``--help`` lists them."""
    p = usage.command(
        sub, "capacity", help="capacity report and advice from an SGLang startup log",
        description="The capacity report and advice from a server's startup log (journal "
        "text or a plain log): weights, KV cache and mamba pools, the requests it can run, "
        "and what to change. Exit status: 0 a complete report, 4 a partial one (the log "
        "ends before the server was up), 1 not an SGLang startup log, 2 a usage error.",
        examples=["journalctl -u sglang -o cat | sglang-fleet capacity -",
                  "sglang-fleet capacity server.log --sglang-version 0.5.12 --json"])
    usage.files(p.add_argument("log", help="a log file (journal text or plain log), or - for "
                               "standard input"))
    p.add_argument("--sglang-version", type=usage.release,
                   help="the release that wrote the log (lets the report infer a mamba cap "
                   "that releases before 0.5.17 do not log)")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_capacity)

    p = usage.command(
        sub, "smoke", help="a smoke generation against a running server or router",
        description="One smoke generation, as the deploy's gate makes it, against a running "
        "server or router (the first model its /v1/models lists); changes nothing. Exit "
        "status: 0 a sane answer, 1 anything else, 2 a usage error (a URL that is not one).",
        examples=["sglang-fleet smoke http://10.0.0.11:30000",
                  "sglang-fleet smoke http://10.0.0.10:30080 --api-key-file key.txt --json"])
    p.add_argument("url", type=usage.url("http://10.0.0.11:30000"), metavar="URL",
                   help="the server's or router's base URL, e.g. http://10.0.0.11:30000")
    usage.files(p.add_argument("--api-key-file", help="a file holding the API key"))
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_smoke)
