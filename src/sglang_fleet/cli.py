"""``sglang-fleet``: render and check serving profiles, smoke-test servers, roll a fleet through
its router, and run the lab.

Exit status: 0 fine, 1 a problem in the input (the message names file, key and fix),
2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from sglang_fleet import preflight, profile, releases
from sglang_fleet.errors import InputError
from sglang_fleet.render import Launch, render


def _load(args: argparse.Namespace) -> tuple[profile.Profile, Launch]:
    prof = profile.load(args.profile)
    return prof, render(prof, args.sglang_version)


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
    preflight.require(prof, launch, arch)
    print(f"{args.profile}: ok for SGLang {launch.version}"
          + (f" ({arch})" if arch else " (no architecture known: hybrid-model rules skipped)"))
    return 0


def cmd_lab_up(args: argparse.Namespace) -> int:
    from sglang_fleet.lab import manage

    if args.hosts < 1 or args.hosts > 200 or args.gpus < 1:
        print("sglang-fleet lab up: --hosts must be 1..200 and --gpus at least 1",
              file=sys.stderr)
        return 2
    manage.up(args.hosts, args.gpus, args.hgx)
    return 0


def cmd_lab_down(args: argparse.Namespace) -> int:
    from sglang_fleet.lab import manage

    manage.down()
    return 0


def cmd_lab_status(args: argparse.Namespace) -> int:
    from sglang_fleet.lab import manage

    hosts = manage.status()
    if args.json:
        print(json.dumps(hosts, indent=2))
    elif not hosts:
        print("no lab (sglang-fleet lab up)")
    for h in [] if args.json else hosts:
        state = "running" if h["running"] else "stopped"
        print(f"{h['name']:<8}{h['address']:<14}{h['gpus']} GPU{'s' if h['gpus'] > 1 else ''}"
              f"{' HGX' if h['hgx'] else ''}  {state}")
    return 0


def cmd_lab_ssh(args: argparse.Namespace) -> int:
    from sglang_fleet.lab import manage

    return manage.ssh(args.host, args.command)


def cmd_smoke(args: argparse.Namespace) -> int:
    """The gate's smoke generation against a running server (or router); changes nothing."""
    from pathlib import Path

    from sglang_fleet import gate_check

    key = None
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            print(f"error: {args.api_key_file}: {exc.strerror}", file=sys.stderr)
            return 1
    url = args.url.rstrip("/")
    report: dict[str, object] = {"url": url, "ok": False}
    status, raw = gate_check.request(f"{url}/v1/models", key)
    try:
        if status != 200:
            raise gate_check.GateError(f"{url}/v1/models answered {status or 'nothing'}"
                                       + (" (an API key is needed)" if status == 401 else ""))
        model = json.loads(raw)["data"][0]["id"]
        report["model"] = model
        report["smoke"] = result = gate_check.smoke(url, key, model)
        if not result["sane"]:
            raise gate_check.GateError(f"smoke answer is not sane: {result['answer']!r}")
        report["ok"] = True
        if not args.json:
            print(f"{url} ({model}): " + gate_check.describe(result))
    except gate_check.GateError as err:
        report["error"] = str(err)
        if not args.json:
            print(f"error: {err}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def cmd_roll(args: argparse.Namespace) -> int:
    """Rolling redeploy through the router (see sglang_fleet.roll)."""
    from sglang_fleet import roll

    return roll.main(args.inventory, args.data, args.batch, args.drain_timeout,
                     args.health_timeout)


def cmd_demo(args: argparse.Namespace) -> int:
    """Lab up, the whole deploy, then a smoke generation against every host."""
    import subprocess
    from pathlib import Path

    from sglang_fleet import gate_check
    from sglang_fleet.lab import manage, state

    root = Path(__file__).resolve().parents[2]
    lab = manage.up(args.hosts, args.gpus, False)
    for deploy in ("deploys/sglang.py", "deploys/router.py"):
        if subprocess.run(["pyinfra", "-y", "inventories/lab.py", deploy], cwd=root).returncode:
            print(f"demo: {deploy} failed (see above)", file=sys.stderr)
            return 1
    key = lab.api_key()
    model = profile.load(root / "profiles" / "qwen3.6-27b-mtp.yaml").model.served_name
    hosts = state.load().hosts
    targets = [(h.name, f"http://{h.address}:30000") for h in hosts]
    targets.append(("router", f"http://{hosts[0].address}:30080"))
    print(f"\n{'server':<8}{'answer':<24}{'TTFT':>8}{'tok/s':>8}{'accept':>8}")
    for name, url in targets:
        s = gate_check.smoke(url, key, model)
        accept = f"{s['accept_length']:.2f}" if s["accept_length"] else "-"
        print(f"{name:<8}{s['answer'][:22]!r:<24}{s['ttft_s'] * 1000:>6.0f}ms"
              f"{s['tokens_per_s']:>8.0f}{accept:>8}")
    print("\nnext: sglang-fleet roll inventories/lab.py --data "
          "sglang.memory.max_running_requests=40; "
          "sglang-fleet lab down")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Resumable batch generation through a router or a server (see sglang_fleet.generate)."""
    from pathlib import Path

    from sglang_fleet.generate import Options, run
    from sglang_fleet.generate.errors import GenerateError

    try:
        key = Path(args.api_key_file).read_text().strip() if args.api_key_file else None
        return run(Options(args.input, args.output, args.url.rstrip("/"), key, args.model,
                           args.concurrency, args.shard_size, args.retries, args.timeout,
                           json_status=args.json, s3_endpoint=args.s3_endpoint))
    except OSError as exc:
        print(f"error: {exc.filename}: {exc.strerror}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume", file=sys.stderr)
        return 130
    except GenerateError as exc:
        print(f"error: {exc}", file=sys.stderr)
    return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    version_help = f"SGLang release to render for (default: the profile's pin; known: " \
                   f"{releases.supported()[0]} … {releases.supported()[-1]})"

    p = sub.add_parser("render", help="print the launch command and environment of a profile")
    p.add_argument("profile", help="a profile YAML file, e.g. profiles/qwen3.6-27b-mtp.yaml")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="validate a profile and apply SGLang's startup rules")
    p.add_argument("profile")
    p.add_argument("--sglang-version", help=version_help)
    p.add_argument("--model-config", help="the model's config.json (or its directory)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("smoke", help="a smoke generation against a running server or router")
    p.add_argument("url", help="e.g. http://10.0.0.11:30000")
    p.add_argument("--api-key-file", help="a file holding the API key")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.set_defaults(func=cmd_smoke)

    p = sub.add_parser("roll", help="rolling redeploy through the router, stopping at the "
                       "first failure and putting that host's last good release back")
    p.add_argument("inventory", help="a pyinfra inventory, e.g. inventories/b200.py")
    p.add_argument("--batch", type=int, default=1, help="hosts at a time (default 1)")
    p.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                   help="pyinfra data for the deploy, e.g. sglang.memory.page_size=64")
    p.add_argument("--drain-timeout", type=float, default=600,
                   help="seconds to wait for a host's requests in flight (default 600)")
    p.add_argument("--health-timeout", type=float, default=300,
                   help="seconds for the router to see a host healthy again (default 300)")
    p.set_defaults(func=cmd_roll)

    p = sub.add_parser("demo", help="lab up, deploy, router, smoke: the whole product on lab hosts")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--gpus", type=int, default=8)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("generate", help="resumable batch generation through a router or server")
    p.add_argument("input", help="JSONL of chat requests: a path or s3://bucket/key")
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
    p.add_argument("--json", action="store_true", help="JSON status lines instead of a bar")
    p.set_defaults(func=cmd_generate)

    lab = sub.add_parser("lab", help="simulated B200 hosts on this machine (needs root)")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    p = lab_sub.add_parser("up", help="boot fresh lab hosts and the site around them")
    p.add_argument("--hosts", type=int, default=3, help="how many hosts (default 3)")
    p.add_argument("--gpus", type=int, default=8, help="B200s per host (default 8)")
    p.add_argument("--hgx", action="store_true", help="hosts are HGX boards (NVSwitch fabric)")
    p.set_defaults(func=cmd_lab_up)
    p = lab_sub.add_parser("down", help="stop every host and service, unmount everything")
    p.set_defaults(func=cmd_lab_down)
    p = lab_sub.add_parser("status", help="the lab's hosts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_lab_status)
    p = lab_sub.add_parser("ssh", help="a shell (or a command) on a lab host")
    p.add_argument("host")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_lab_ssh)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
