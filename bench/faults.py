"""The fault matrix: each fault injected on lab hosts, one at a time, each followed by a clean
re-run; a table of the seconds until the deploy named the cause, whether the last good release
serves, and whether a clean re-run converges. Too slow for CI (about 8 minutes); needs root.

    flock /tmp/sglang-lab.lock uv run python bench/faults.py [--only crash-after-n ...]

It boots two lab hosts, deploys them, runs the faults (on lab1 unless the fault is about a
host) and takes the lab down at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sglang_fleet.config.render import staging_dir
from sglang_fleet_lab import hosts, site, state

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OLD_DRIVER, NEW_DRIVER = "580.95.05", "580.105.08"
# Where the lab model is staged (its name carries a digest of the source).
MODEL_DIR = staging_dir(f"s3://{state.S3_BUCKET}/{site.MODEL_PREFIX}")


@dataclass
class Run:
    """One pyinfra run: exit status and every output line with the second it appeared."""

    code: int
    started: float = field(default_factory=time.monotonic)
    lines: list[tuple[float, str]] = field(default_factory=list)

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
        """The first line matching ``pattern`` (seconds after the start, and the line), among
        those that came ``after`` seconds or later."""
        return next(((t, line) for t, line in self.lines
                     if t >= after and re.search(pattern, line)), None)

    def tail(self, n: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-n:])


@dataclass
class Row:
    fault: str
    cause_s: float | None
    cause: str
    last_good: bool | None
    rerun: bool | None


def pyinfra(deploy: str, *data: str, limit: str | None = "lab1",
            watch: Callable[[str], None] | None = None) -> Run:
    """Run a deploy, streaming its output to ``watch`` (a fault injected mid-run)."""
    argv = ["pyinfra", "-y", "inventories/lab.py", deploy,
            *(["--limit", limit] if limit else []), *(f"--data={d}" for d in data)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    run = Run(0)
    tic = run.started
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = ANSI.sub("", raw.rstrip())
        run.lines.append((time.monotonic() - tic, line))
        if watch:
            watch(line)
    run.code = proc.wait()
    return run


def deploy(*data: str, limit: str | None = "lab1",
           watch: Callable[[str], None] | None = None) -> Run:
    return pyinfra("deploys/sglang.py", *data, limit=limit, watch=watch)


def ssh(host: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sglang-fleet", "lab", "ssh", host, command], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def serving(host: str = "lab1") -> bool:
    """The server answers /health_generate and a chat completion."""
    address = state.host_address(int(host[-1]))
    key = state.load().api_key()
    out = ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 30 "
                    f"http://{address}:30000/health_generate; echo; "
                    f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 60 "
                    f"-H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' "
                    "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                    f"\"max_tokens\": 8}}' http://{address}:30000/v1/chat/completions").stdout
    return out.split() == ["200", "200"]


def rerun(limit: str | None = "lab1") -> bool:
    """A clean run (the inventory as it is) succeeds and leaves the servers serving."""
    run = deploy(limit=limit)
    if run.code:
        print(run.tail(), file=sys.stderr)
    names = ["lab1", "lab2"] if limit is None else [limit]
    return run.code == 0 and all(serving(h) for h in names)


def caused(name: str, run: Run, pattern: str, last_good: bool, clean: bool | None,
           after: float = 0.0) -> Row:
    found = run.first(pattern, after)
    if found is None:
        print(f"{name}: no line matches {pattern!r}; the run ended:\n{run.tail()}",
              file=sys.stderr)
    return Row(name, found[0] if found else None,
               found[1].strip()[:90] if found else "(not named)", last_good, clean)


def lab_host(name: str) -> state.Host:
    return next(h for h in state.load().hosts if h.name == name)


def kill_host(name: str) -> None:
    """The host dies: its supervisor, nspawn and guest are killed (no clean shutdown)."""
    host = lab_host(name)
    for pidfile in ("supervisor.pid", "nspawn.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((host.dir / pidfile).read_text()), signal.SIGKILL)
    init = hosts.guests().get(name)
    if init:
        os.kill(init, signal.SIGKILL)


def revive(name: str) -> None:
    """Power the dead host on again, with its disk."""
    lab = state.load()
    host = lab_host(name)
    hosts.stop(host)
    hosts.power_on(host, Path(lab.rootfs), lab)


def when(marker: str, action: Callable[[], None], delay: float = 0.0) -> Callable[[str], None]:
    """A watch that runs ``action`` once, ``delay`` seconds after ``marker`` appears."""
    fired = threading.Event()

    def watch(line: str) -> None:
        if marker in line and not fired.is_set():
            fired.set()
            threading.Timer(delay, action).start()
    return watch


def max_running() -> int | None:
    key = state.load().api_key()
    out = ssh("lab1", f"curl -s -H 'Authorization: Bearer {key}' "
                      f"http://{state.host_address(1)}:30000/server_info").stdout
    try:
        value = json.loads(out).get("max_running_requests")
    except ValueError:
        return None
    return value if isinstance(value, int) else None


def gate_fault(name: str, pattern: str, *data: str) -> Row:
    """A changed value plus a fault in the server's environment: the gate must fail, name the
    cause and put the last good release back."""
    before = max_running()
    run = deploy("sglang.memory.max_running_requests=16", *data)
    back = run.code != 0 and serving() and max_running() == before
    return caused(name, run, pattern, back, rerun())


def startup_crash() -> Row:
    return gate_fault("startup crash",
                      r"failed to start: Scheduler hit an exception: RuntimeError: simulated",
                      "sglang.env.SGLANG_SIM_FAIL_STARTUP=simulated startup failure")


def crash_after_n() -> Row:
    return gate_fault("crash after 3 requests", r"died under the soak",
                      "sglang.env.SGLANG_SIM_CRASH_AFTER=\"3\"")


def hang_loading() -> Row:
    return gate_fault("hang while loading", r"not healthy within 20 s",
                      "sglang.env.SGLANG_SIM_HANG_LOADING=\"1\"", "startup_budget_seconds=20")


def state_cache() -> Row:
    return gate_fault("state cache too small", r"state cache is too small",
                      "sglang.env.SGLANG_SIM_STATE_CACHE_TOO_SMALL=\"1\"")


def bad_release() -> Row:
    """Another release that installs but does not start: the last good one comes back,
    with the ``current`` link on it."""
    current = ssh("lab1", "readlink /opt/sglang/current").stdout.strip()
    run = deploy("sglang.engine.version=0.5.22",
                 "sglang.env.SGLANG_SIM_FAIL_STARTUP=ImportError: simulated bad build")
    restored = pyinfra("deploys/restore.py")
    back = run.code != 0 and restored.code == 0 and serving() and \
        ssh("lab1", "readlink /opt/sglang/current").stdout.strip() == current
    return caused("bad release", run, r"failed to start: .*ImportError", back, rerun())


def uninstallable() -> Row:
    run = deploy("sglang.engine.version=0.5.21")  # not in the wheelhouse
    return caused("uninstallable release", run,
                  r"No solution found|no version of sglang-sim==0\.5\.21",
                  run.code != 0 and serving(), rerun())


def cut_download() -> Row:
    """S3 goes away a moment after staging began; a re-run resumes."""
    ssh("lab1", f"rm -rf {MODEL_DIR} {MODEL_DIR}.partial")
    run = deploy(watch=when("Stage s3://", site.s3_down, delay=1.0))
    site.s3_down()  # in case staging was quicker than the cut
    last_good = run.code != 0 and serving()
    site.s3_up(state.load())
    return caused("cut download", run, r"error: (download|listing) of s3://\S+ from http",
                  last_good, rerun())


def installed_driver(host: str = "lab1") -> str:
    return ssh(host, "dpkg-query -W -f '${Version}' nvidia-driver-580-open").stdout \
        .split("-")[0]


def driver_without_reboot() -> Row:
    other = NEW_DRIVER if installed_driver() == OLD_DRIVER else OLD_DRIVER
    run = deploy(f"nvidia_driver_version={other}", "allow_reboot=False")
    intact = ssh("lab1", "nvidia-smi -L").returncode == 0 and installed_driver() != other
    return caused("driver change, no reboot allowed", run, r"refused, nothing installed",
                  run.code != 0 and intact and serving(), rerun())


def driver_with_reboot() -> Row:
    other = NEW_DRIVER if installed_driver() == OLD_DRIVER else OLD_DRIVER
    run = deploy(f"nvidia_driver_version={other}")
    ok = run.code == 0 and installed_driver() == other and serving()
    row = caused("driver change with reboot", run, r"\[lab1\] back from its reboot", ok,
                 rerun())
    row.cause = "(no fault: converges with one reboot) " + row.cause[:50]
    return row


def dead_in_reboot_wait() -> Row:
    """lab2 dies while rebooting for a driver change: it fails alone after its bounded wait;
    lab1 finishes."""
    other = NEW_DRIVER if installed_driver("lab2") == OLD_DRIVER else OLD_DRIVER
    killed: list[float] = []

    def die() -> None:
        killed.append(time.monotonic())
        kill_host("lab2")

    run = deploy(f"nvidia_driver_version={other}", "reboot_timeout_seconds=60", limit=None,
                 watch=when("[lab2] rebooting", die, delay=2.0))
    alone = run.code != 0 and run.first(r"\[lab1\] health: /health_generate 200") is not None \
        and run.first(r"1 host failed: lab2") is not None and serving("lab1")
    row = caused("host dead in the reboot wait (60 s bound)", run,
                 r"\[lab2\] error: lab2 did not come back", alone, None)
    if killed and row.cause_s is not None:
        row.cause_s -= killed[0] - run.started  # from the moment it died
    revive("lab2")
    row.rerun = rerun(limit=None)
    return row


def killed_mid_deploy() -> Row:
    """lab2 dies while the service stage runs: lab2 fails, lab1 finishes."""
    killed: list[float] = []

    def die() -> None:
        killed.append(time.monotonic())
        kill_host("lab2")

    run = deploy("sglang.memory.max_running_requests=24", limit=None,
                 watch=when("Starting operation: SGLang service", die, delay=1.0))
    alone = run.code != 0 and run.first(r"\[lab1\] health: /health_generate 200") is not None \
        and run.first(r"1 host failed: lab2") is not None and serving("lab1")
    after = killed[0] - run.started if killed else 0.0
    row = caused("host killed mid-deploy", run, r"\[lab2\].*(rror|onnect|closed|reset|No route)",
                 alone, None, after)
    row.cause_s = None if row.cause_s is None else row.cause_s - after  # from the kill
    revive("lab2")
    row.rerun = rerun(limit=None)
    return row


def restarts_in_a_row() -> Row:
    """An operator restarts the server until systemd refuses; the next deploy recovers it."""
    for _ in range(12):
        if ssh("lab1", "systemctl restart sglang-0.service").returncode:
            break
    down = not serving()
    run = deploy()
    return caused("restarts until start-limit-hit, then deploy", run,
                  r"was found failed \(start-limit-hit", down and run.code == 0 and serving(),
                  rerun())


CASES: dict[str, Callable[[], Row]] = {
    "startup-crash": startup_crash, "crash-after-n": crash_after_n, "hang": hang_loading,
    "state-cache": state_cache, "bad-release": bad_release, "uninstallable": uninstallable,
    "cut-download": cut_download, "driver-no-reboot": driver_without_reboot,
    "driver-reboot": driver_with_reboot, "dead-in-reboot-wait": dead_in_reboot_wait,
    "killed-mid-deploy": killed_mid_deploy, "restarts": restarts_in_a_row,
}


def table(rows: list[Row]) -> str:
    def yn(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    lines = [f"{'fault':<46}{'cause named':>12}  {'last good serves':<18}{'re-run':<8}cause",
             "-" * 150]
    for r in rows:
        seconds = "never" if r.cause_s is None else f"{r.cause_s:.0f} s"
        lines.append(f"{r.fault:<46}{seconds:>12}  {yn(r.last_good):<18}{yn(r.rerun):<8}"
                     f"{r.cause}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="these faults only")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/faults.py: the lab needs root", file=sys.stderr)
        return 2
    rows: list[Row] = []
    try:
        subprocess.run(["sglang-fleet", "lab", "up", "--hosts", "2"], cwd=ROOT, check=True)
        base = deploy(f"nvidia_driver_version={OLD_DRIVER}", limit=None)
        if base.code:
            print(base.tail(60), file=sys.stderr)
            return 1
        for name in args.only or list(CASES):
            tic = time.monotonic()
            rows.append(CASES[name]())
            print(f"faults: {name} done in {time.monotonic() - tic:.0f} s", flush=True)
    finally:
        print(table(rows))
        subprocess.run(["sglang-fleet", "lab", "down"], cwd=ROOT)
    ok = all(r.last_good is not False and r.rerun is not False and r.cause_s is not None
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
