"""A crashed server comes back, a stopped one does not: the unit's restart and stop lines, the
cause a crash leaves in the journal (for the gate and ``status``), read from the simulator's own
deaths, and the rows ``status`` shows for a unit that restarted or spent its start limit."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx

from sglang_fleet.facts import systemd
from sglang_fleet.remote import crash
from sglang_fleet.report import status, status_view
from tests.conftest import MODEL, free_port, one_gpu_env, wait_for_health
from tests.unit.stages.service.test_service_recovery import unit_text

# What journalctl -u sglang -o cat shows of a scheduler exception in 0.5.23 (the simulator's
# lines; SGLang's formats: managers/scheduler.py:6372, tokenizer_manager.py:4074,
# utils/common.py:2524), then systemd's own lines and the restarted server's first lines.
SCHEDULER_EXCEPTION = """\
[2026-12-01 10:33:21 TP0] Prefill batch, #new-seq: 1, #new-token: 5, #cached-token: 0
[2026-12-01 10:33:21 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/sglang/releases/r/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", \
line 6368, in run_scheduler_process
    scheduler.run_event_loop()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.

[2026-12-01 10:33:21] SIGQUIT received. signum=None, frame=None. It usually means \
one child failed.
[2026-12-01 10:33:21] kill_process_tree called: parent_pid=31375, include_parent=True, \
pid=31375
sglang.service: Main process exited, code=killed, status=9/KILL
sglang.service: Deactivated successfully.
sglang.service: Scheduled restart job, restart counter is at 1.
Started sglang.service - SGLang server for qwen3.6-27b.
[2026-12-01 10:34:00] server_args={'model_path': '/var/lib/sglang/models/m'}
[2026-12-01 10:34:02 TP0] Load weight begin. avail mem=178.50 GB
""".splitlines()


def test_the_cause_of_a_scheduler_exception_is_its_exception_line() -> None:
    assert crash.cause(SCHEDULER_EXCEPTION) == (
        "Scheduler hit an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 2.00 GiB.")


def test_the_cause_is_the_last_crashs_not_an_earlier_one() -> None:
    """A unit's journal: a scheduler exception, the restart, then a kill -9 of the new server."""
    later = [*SCHEDULER_EXCEPTION,
             "[2026-12-01 10:34:09] The server is fired up and ready to roll!",
             "sglang.service: Deactivated successfully.",
             "sglang.service: Scheduled restart job, restart counter is at 2.",
             "Stopped sglang.service - SGLang server for qwen3.6-27b.",
             "Starting sglang.service - SGLang server for qwen3.6-27b...",
             "Started sglang.service - SGLang server for qwen3.6-27b."]
    # as systemd 252 logs a kill -9 that SuccessExitStatus=SIGKILL counts clean (lab host)
    assert crash.cause(later) == "killed by SIGKILL, no error logged (the OOM killer, or kill -9)"
    # a crash loop that spent its start limit: the last crash's own cause
    failed = [*SCHEDULER_EXCEPTION[:-2], "[2026-12-01 10:34:02 TP0] Scheduler hit an exception: "
              "Traceback (most recent call last):", '  File "m.py", line 9, in load',
              "ValueError: bad weights", "sglang.service: Deactivated successfully.",
              "sglang.service: Scheduled restart job, restart counter is at 5.",
              "Stopped sglang.service - SGLang server for qwen3.6-27b.",
              "sglang.service: Start request repeated too quickly.",
              "sglang.service: Failed with result 'start-limit-hit'.",
              "Failed to start sglang.service - SGLang server for qwen3.6-27b."]
    assert crash.cause(failed) == "Scheduler hit an exception: ValueError: bad weights"


def test_the_cause_while_a_crash_waits_out_restart_sec() -> None:
    """systemd logs 'Scheduled restart job' only when RestartSec is over: before that, the
    latest invocation's own end is the one to explain."""
    second = [*SCHEDULER_EXCEPTION, "[2026-12-01 10:35:00 TP0] Scheduler hit an exception: "
              "Traceback (most recent call last):", '  File "s.py", line 1, in step',
              "RuntimeError: NCCL error", "sglang.service: Deactivated successfully."]
    assert crash.cause(second) == "Scheduler hit an exception: RuntimeError: NCCL error"


def test_a_traceback_of_a_running_server_is_no_crash() -> None:
    running = [*SCHEDULER_EXCEPTION, "[2026-12-01 10:35:00] Error in request:",
               "Traceback (most recent call last):", '  File "h.py", line 1, in handle',
               "ValueError: bad request"]
    assert crash.cause(running) == ("Scheduler hit an exception: torch.OutOfMemoryError: "
                                    "CUDA out of memory. Tried to allocate 2.00 GiB.")


def test_chained_tracebacks_and_other_ranks() -> None:
    chained = ["[2026-12-01 10:33:21 TP1] Scheduler hit an exception: Traceback (most recent "
               "call last):", '  File "a.py", line 1, in f', "KeyError: 'x'", "",
               "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):", '  File "b.py", line 2, in g',
               "triton.runtime.errors.OutOfResources: out of resource: shared memory",
               "[2026-12-01 10:33:22 TP0] Scheduler hit an exception: Traceback (most recent "
               "call last):", '  File "c.py", line 3, in h', "RuntimeError: NCCL timeout"]
    # the first rank's first exception: the others' follow from it
    assert crash.cause(chained) == "Scheduler hit an exception: KeyError: 'x'"
    odd = ["Traceback (most recent call last):", '  File "b.py", line 2, in g',
           "triton.runtime.errors.OutOfResources: out of resource: shared memory",
           "sglang.service: Main process exited, code=exited, status=1/FAILURE"]
    assert crash.cause(odd) == \
        "triton.runtime.errors.OutOfResources: out of resource: shared memory"


def test_the_oom_killer_is_named_before_what_it_caused() -> None:
    child = ["[2026-12-01 10:33:21] Subprocess scheduler_0 (pid=9) crashed with exit code -9. "
             "Triggering SIGQUIT for cleanup...",
             "sglang.service: A process of this unit has been killed by the OOM killer.",
             "sglang.service: Failed with result 'oom-kill'."]
    assert crash.cause(child) == "A process of this unit has been killed by the OOM killer."
    # the gate's journal of one invocation has no systemd lines: SGLang's own cause
    assert str(crash.cause(SCHEDULER_EXCEPTION[:9])).startswith(
        "Scheduler hit an exception: torch.")


def test_the_cause_of_other_ends() -> None:
    child = ["[2026-12-01 10:33:21] Subprocess detokenizer (pid=77) crashed with exit code -9. "
             "Triggering SIGQUIT for cleanup...", "[2026-12-01 10:33:21] SIGQUIT received. ...",
             "sglang.service: Main process exited, code=killed, status=9/KILL"]
    assert crash.cause(child) == ("Subprocess detokenizer (pid=77) crashed with exit code -9. "
                                  "Triggering SIGQUIT for cleanup...")
    hang = ["[2026-12-01 10:33:21 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, "
            "self.soft=False)", "", ""]
    assert crash.cause(hang) == \
        "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"
    killed = ["[2026-12-01 10:33:21 TP0] Prefill batch, #new-seq: 1",
              "sglang.service: A process of this unit has been killed by the OOM killer.",
              "sglang.service: Main process exited, code=killed, status=9/KILL"]
    assert crash.cause(killed) == "A process of this unit has been killed by the OOM killer."
    assert crash.cause(killed[-1:]) == "Main process exited, code=killed, status=9/KILL"
    server = ["Traceback (most recent call last):", '  File "x.py", line 3, in <module>',
              "ImportError: cannot import name 'x' from 'sgl_kernel'",
              "sglang.service: Main process exited, code=exited, status=1/FAILURE"]
    assert crash.cause(server) == "ImportError: cannot import name 'x' from 'sgl_kernel'"
    assert crash.cause(["[2026-12-01 10:33:21] The server is fired up and ready to roll!"]) \
        is None
    assert crash.cause([]) is None


def test_the_unit_restarts_every_crash_and_stops_the_server_alone() -> None:
    for unit in (unit_text(255), unit_text(252)):
        assert unit["Restart"] == "on-failure"
        # a crash (a SIGKILL of itself, the OOM killer) restarts although SIGKILL is a
        # success: the clean end of 0.5.10 - 0.5.18 after their drain
        assert unit["RestartForceExitStatus"] == "SIGKILL"
        assert unit["SuccessExitStatus"] == "SIGKILL"
        # SIGTERM to the server only: its children have no SIGTERM handler and would die
        # under the drain (lab/sglang-sim/tests/test_fault_injection.py shows the requests lost)
        assert unit["KillMode"] == "mixed" and unit["KillSignal"] == "SIGTERM"
        assert unit["SendSIGKILL"] == "yes"


def _simulator(tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, Path]:
    port, log = free_port(), tmp / "sim.log"
    full = one_gpu_env(tmp, **{"SGLANG_SIM_CAPTURE_SECONDS": "0", **env})
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_sim.launch_server", "--model-path",
             str(MODEL), "--host", "127.0.0.1",
             "--port", str(port)], env=full, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}", log


def test_the_causes_of_the_simulators_deaths(tmp_path: Path) -> None:
    """The simulator dies as SGLang does (its own tests cite the sources); the reader finds
    the cause in what it printed, whichever way it died."""
    proc, _, log = _simulator(tmp_path, {"SGLANG_SIM_FAIL_STARTUP": "CUDA out of memory"})
    assert proc.wait(30) == -signal.SIGKILL
    assert crash.cause(log.read_text().splitlines()) == \
        "Scheduler hit an exception: RuntimeError: CUDA out of memory"

    proc, url, log = _simulator(tmp_path, {"SGLANG_SIM_CRASH_AFTER": "1"})
    try:
        wait_for_health(url)
        for _ in range(2):
            try:
                httpx.post(f"{url}/v1/chat/completions", timeout=10, json={
                    "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            except httpx.HTTPError:
                break
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        proc.kill()
    assert crash.cause(log.read_text().splitlines()) == \
        "Scheduler hit an exception: RuntimeError: simulated crash after 1 requests"


def test_units_say_their_restarts_and_result() -> None:
    show = ["Id=sglang.service", "LoadState=loaded", "ActiveState=failed", "SubState=failed",
            "ActiveEnterTimestamp=Mon 2026-11-30 23:01:02 UTC", "ExecMainPID=0", "ExecStart=",
            "NRestarts=5", "Result=start-limit-hit"]
    unit = systemd.parse_units(show)["sglang.service"]
    assert (unit.restarts, unit.result) == (5, "start-limit-hit")
    assert "NRestarts" in systemd.PROPERTIES and "Result" in systemd.PROPERTIES
    assert systemd.LastCrash().process(SCHEDULER_EXCEPTION).startswith(  # type: ignore[union-attr]
        "Scheduler hit an exception: torch.OutOfMemoryError")
    assert "journalctl -u sglang-1.service " in systemd.LastCrash().command("sglang-1.service")


def test_status_shows_restarts_and_the_last_crash() -> None:
    row = status.Row("server", "gpu1", "http://127.0.0.1:30000", unit="sglang.service")
    show = ["Id=sglang.service", "LoadState=loaded", "ActiveState=failed", "SubState=failed",
            "ActiveEnterTimestamp=", "ExecMainPID=0", "ExecStart=", "NRestarts=5",
            "Result=start-limit-hit"]
    status._fill_unit(row, systemd.parse_units(show)["sglang.service"])
    row.last_crash = "Scheduler hit an exception: RuntimeError: boom"
    cells = dict(zip(status_view.COLUMNS, status_view.cells(row), strict=True))
    assert cells["state"] == "failed (start-limit-hit)" and cells["restarts"] == "5"
    assert cells["notes"] == "last crash: Scheduler hit an exception: RuntimeError: boom"
    healthy = status.Row("server", "gpu1", "http://127.0.0.1:30000", unit="sglang.service")
    status._fill_unit(healthy, systemd.parse_units(SHOW_RUNNING)["sglang.service"])
    cells = dict(zip(status_view.COLUMNS, status_view.cells(healthy), strict=True))
    assert (cells["state"], cells["restarts"], cells["notes"]) == ("active/running", "0", "")


SHOW_RUNNING = ["Id=sglang.service", "LoadState=loaded", "ActiveState=active",
                "SubState=running", "ActiveEnterTimestamp=Mon 2026-11-30 23:01:02 UTC",
                "ExecMainPID=4121", "ExecStart=", "NRestarts=0", "Result=success"]


def test_a_hostile_line_costs_its_length_not_its_square() -> None:
    """A server controls its log lines: a word of a million letters before the cause. A
    pattern that tries ``\\w+`` from every letter takes hours on it (24K letters took 3.6 s),
    so this test ends only when the search is linear; pytest's timeout fails it otherwise.
    bench/crash_regex.py prints the times."""
    word = "a" * 1_000_000
    lines = [f"{word} x", f"{word} watchdog timeou", f"{word} Scheduler hit an exception: "
             "RuntimeError: boom"]
    assert crash.cause(lines) == "Scheduler hit an exception: RuntimeError: boom"
    assert crash.cause([f"{word} Scheduler watchdog timeout (12.0 s)"]) == \
        f"{word} Scheduler watchdog timeout (12.0 s)"
