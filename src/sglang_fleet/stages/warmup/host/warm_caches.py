"""Fill a release's kernel caches while the old server still serves (standard library only),
run as the service user on GPUs no server uses, with the service's cache environment:

- ``compile``: the release's own precompile entry point (``sglang.compile_deep_gemm``);
- ``full``: a warm-up start of the new release itself, one generation, then a clean stop.

    /usr/bin/env PYTHONPATH=/opt/sglang/tools/pythonpath python3 \\
        -m sglang_fleet.stages.warmup.host.warm_caches \\
        --mode compile --python /opt/.../bin/python \\
        --module sglang.compile_deep_gemm --port 31000 --timeout 1800 -- --model-path ... --tp 1

The child runs through the service's launcher (``start_server``): the keys of the warm-up's
root-only environment file (``SGLANG_API_KEY``, ``SGLANG_ADMIN_API_KEY``: one-off, new each
warm-up) reach SGLang in-process, never its command line, and are masked in what it prints.
The full warm-up's own requests present the client key. A precompile gets the admin key alone:
``compile_deep_gemm`` asks its own server without a key (0.5.23
``launch_server_process_and_send_one_request``); SGLang refuses that once a client key is set,
and with an admin key alone opens its generation endpoints but no admin one
(``srt/utils/auth.py`` ``decide_request_auth``).

Prints the child's output prefixed ``warm-up:`` (with ``--progress SECONDS``, a line every
SECONDS instead), then one line ``WARMUP <json>``; exit 0 when the caches were filled.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import IO, Any

from sglang_fleet.remote import start_server  # the launcher the child runs through
from sglang_fleet.remote.progress import Reporter, duration

TAIL = 20  # lines of the child's output shown when it fails
PROMPT = "What is 2+2? Answer with the number only."
GRPC_FLAG, GRPC_PORT_FLAG = "--smg-grpc-mode", "--smg-http-sidecar-port"


def over_http(flags: list[str]) -> list[str]:
    """``flags`` without gRPC mode: the warm-up server is asked over HTTP, and the mode changes
    the front end, not a kernel.

    >>> over_http(["--tp", "1", "--smg-grpc-mode", "--smg-http-sidecar-port", "30100"])
    ['--tp', '1']
    """
    kept: list[str] = []
    words = iter(flags)
    for flag in words:
        if flag == GRPC_PORT_FLAG:
            next(words, None)  # its value
        elif flag != GRPC_FLAG:
            kept.append(flag)
    return kept


def child_argv(args: argparse.Namespace) -> list[str]:
    """The entry point with the server's flags, through the launcher, over HTTP on loopback."""
    flags = [*over_http(args.flags), "--host", "127.0.0.1", "--port", str(args.port)]
    if args.mode == "compile":
        flags += ["--timeout", str(args.timeout)]
    return [args.python, "-m", start_server.__name__, args.module, *flags]


def child_env(mode: str) -> dict[str, str]:
    """This environment, without the client key for a precompile (its requests carry none)."""
    return {k: v for k, v in os.environ.items()
            if not (mode == "compile" and k == start_server.API_KEY)}


def lines(stream: IO[bytes]) -> Iterator[str]:
    """The child's lines as they come, a carriage return ending one too: a progress bar
    (tqdm's, on a pipe) redraws itself with ``\\r`` and would be one line until it ends."""
    pending = b""
    while chunk := os.read(stream.fileno(), 65536):
        *done, pending = re.split(rb"\r\n|\r|\n", pending + chunk)
        yield from (line.decode(errors="replace") for line in done if line.strip())
    if pending.strip():
        yield pending.decode(errors="replace")


def _relay(stream: IO[bytes], tail: list[str], quiet: bool) -> None:
    for line in lines(stream):
        tail.append(line)
        del tail[:-TAIL]
        if not quiet:
            print(f"warm-up: {line[:240]}", flush=True)


def progress_line(args: argparse.Namespace, elapsed: float, tail: list[str]) -> str:
    """``warm-up (compile): 2 min 10 s of at most 30 min 0 s; last: DeepGEMM ... 450/1000``."""
    last = f"; last: {tail[-1].strip()[:160]}" if tail else "; nothing printed yet"
    return (f"warm-up ({args.mode}): {duration(elapsed)} of at most {duration(args.timeout)}"
            f"{last}")


def _key_header() -> dict[str, str]:
    key = os.environ.get(start_server.API_KEY)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=_key_header()),
                                    timeout=timeout) as resp:
            return int(resp.status)
    except (urllib.error.URLError, OSError):
        return 0


def _generate(base: str) -> None:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **_key_header()})
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()


def serve_once(proc: subprocess.Popen[bytes], port: int, deadline: float) -> str | None:
    """Full warm-up: wait for /health_generate, generate once; what went wrong, or None."""
    base = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the warm-up server exited with status {proc.returncode} before it was ready"
        if _get(f"{base}/health_generate", 10) == 200:
            try:
                _generate(base)
            except (urllib.error.URLError, OSError) as err:
                return f"the warm-up generation failed: {err}"
            return None
        time.sleep(1)
    return "the warm-up server was not ready within the budget"


def stop(proc: subprocess.Popen[bytes], grace: float = 60) -> None:
    """SIGTERM to the whole process group (SGLang's schedulers too), SIGKILL after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def warm(args: argparse.Namespace) -> dict[str, Any]:
    argv = child_argv(args)
    tic = time.monotonic()
    deadline = tic + args.timeout
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=child_env(args.mode), start_new_session=True)
    tail: list[str] = []
    assert proc.stdout is not None
    quiet = args.progress > 0
    relay = threading.Thread(target=_relay, args=(proc.stdout, tail, quiet), daemon=True)
    relay.start()
    reporter = Reporter(lambda: progress_line(args, time.monotonic() - tic, tail),
                        args.progress if quiet else 0)
    try:
        with reporter:
            if args.mode == "full":
                error = serve_once(proc, args.port, deadline)
            else:
                try:
                    code = proc.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    code = None
                error = None if code == 0 else (
                    "the precompile did not finish within the budget" if code is None
                    else f"the precompile exited with status {code}")
    finally:
        stop(proc)
        relay.join(5)
    result: dict[str, Any] = {"mode": args.mode, "seconds": round(time.monotonic() - tic, 1),
                              "ok": error is None}
    if error:
        result["error"] = error
        result["tail"] = tail[-TAIL:]
    return result


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warm_caches")
    p.add_argument("--mode", choices=("compile", "full"), required=True)
    p.add_argument("--python", required=True, help="the release's python")
    p.add_argument("--module", required=True, help="the entry point, run as python -m MODULE")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--progress", type=float, default=0, metavar="SECONDS",
                   help="a progress line every SECONDS instead of the child's output")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the server's flags")
    args = p.parse_args(argv)
    args.flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    return args


def main(argv: list[str] | None = None) -> int:
    result = warm(parse(sys.argv[1:] if argv is None else argv))
    print("WARMUP " + json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
