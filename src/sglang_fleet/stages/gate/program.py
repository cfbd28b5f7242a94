"""The gate's host program, ``check_server``, run on the host for one server: the gate's full
checks, or one of its waits (health within the startup budget, a smoke generation). The gate
and the service stage's restart waves both run it. ``check_together`` runs the full checks of
a host's servers at once (``check_servers``), for the gate of each to read.

    ok, lines = check(profile, launch, "--health-only", budget=1800)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pyinfra import logger
from pyinfra.api.operation import operation
from pyinfra.context import host, state

from sglang_fleet.config import connection
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import MAMBA_STRATEGY_DESTS, Launch, model_path
from sglang_fleet.fleet.inventory import ANY_ADDRESS
from sglang_fleet.ops import Ops, preview, result_line, run
from sglang_fleet.ops.host_programs import program
from sglang_fleet.paths import CURRENT, env_file, gate_record
from sglang_fleet.remote.terminal import printable
from sglang_fleet.stages.gate.host.check_server import RESULT_MARK
from sglang_fleet.stages.gate.host.check_servers import DONE_MARK

HOST = "sglang_fleet.stages.gate.host"
CHECKER = f"{HOST}.check_server"  # the gate on the host: see python()
TOGETHER = f"{HOST}.check_servers"  # check_server for several servers at once



@dataclass
class GateResult:
    """What the gate of one unit found, for the operations after it: the operations are all
    built before any runs, so the gate writes here when it runs and they read it then
    (``last_good.restore_unit`` and ``gate_failed`` its error, ``host_capacity`` what it
    measured, ``resize`` the size it found, ``serving`` what ``restored`` found after it).

        result = GateResult(); result.error = "soak: 3 of 32 failed"; result.failed()  # True
    """

    error: str | None = None
    measured: dict[str, Any] | None = None  # the GATE line's "measured", once it passed
    resize: int | None = None  # the mamba cache size for the target: restart once with it
    serving: str = ""  # what serves once the last good release is back, as checked
    checked: tuple[bool, list[str]] | None = None  # check_server's, run with the host's others

    def failed(self) -> bool:
        return self.error is not None

    def gated(self) -> bool:
        """The gate ran and judged (passed or failed); never in pyinfra's preview."""
        return self.measured is not None or self.failed()

    def resizing(self) -> bool:
        """The gate found fewer running requests than the target and a size that fits; true
        until a gate fails."""
        return self.resize is not None and self.error is None


def url(profile: Profile, launch: Launch) -> str:
    """Where the gate on the host reaches the server: its loopback when it listens on any
    address (the same set ``fleet`` uses for the address routers reach); ``grpc://`` for a
    server in gRPC mode."""
    address = profile.server.host
    scheme = "grpc" if connection.grpc(profile) else "http"
    return f"{scheme}://{'127.0.0.1' if address in ANY_ADDRESS else address}:{launch.port}"


def python(profile: Profile, release_python: str | None = None) -> str:
    """The Python that runs check_server: the system's (it needs the standard library only),
    or, for a server in gRPC mode, the serving release's (``release_python``, else the
    current one's), whose environment has SGLang's gRPC and tokenizer packages."""
    if not connection.grpc(profile):
        return "python3"
    return release_python or f"{CURRENT}/bin/python"


def expectations(launch: Launch) -> dict[str, Any]:
    """What /server_info must report for this launch (SGLang resolves the rest itself)."""
    args = launch.args
    expect: dict[str, Any] = {"model_path": args["model_path"], "version": launch.version,
                              "served_model_name": args.get("served_model_name")}
    if args.get("speculative_algorithm"):
        expect["speculative_algorithm"] = args["speculative_algorithm"]
    for dest in MAMBA_STRATEGY_DESTS:
        if args.get(dest) not in (None, "auto"):
            expect[dest] = args[dest]
    if args.get("max_running_requests") is not None:
        expect["max_running_requests"] = args["max_running_requests"]
    return expect


def gate_flags(profile: Profile, launch: Launch, job: str, soak: int | None) -> list[str]:
    """check_server's flags for the gate's full checks of a launch (beyond ``arguments``')."""
    target = profile.memory.target_running_requests
    return ["--expect", json.dumps(expectations(launch)), *(["--job", job] if job else []),
            "--record", gate_record(launch.unit),
            *(["--soak-requests", str(soak)] if soak is not None else []),
            *(["--target", str(target)] if target else [])]


def arguments(profile: Profile, launch: Launch, *flags: str,
              budget: int | None = None) -> list[str]:
    """check_server's arguments for one launch: the server, then ``flags``."""
    grpc = ["--model-dir", model_path(profile),
            *(["--reasoning-parser", profile.parsers.reasoning] if profile.parsers.reasoning
              else [])] if connection.grpc(profile) else []
    return ["--unit", launch.unit, "--url", url(profile, launch), "--env-file",
            env_file(launch.unit), "--model", profile.model.served_name, *grpc,
            *(["--budget", str(budget)] if budget is not None else []), *flags]


def show_lines(lines: list[str], label: str = "") -> None:
    """check_server's human lines (after ``label``), not its result line (for result_of)."""
    for line in lines:
        if not line.startswith(f"{RESULT_MARK} "):
            logger.info(f"{host.print_prefix}{label}{printable(line)}")


def check(profile: Profile, launch: Launch, *flags: str, budget: int | None = None,
          show: bool = True, label: str = "") -> tuple[bool, list[str]]:
    """Run check_server on the host for one launch; show its human lines (after ``label``)."""
    argv = program(python(profile), CHECKER, *arguments(profile, launch, *flags, budget=budget))
    ok, output = run(shlex.join(argv))  # the gate itself, not a read of state: no fact for it
    lines = list(output.stdout_lines)
    if show:
        show_lines(lines, label)
    return ok, lines


def check_all(profile: Profile, launches: Sequence[Launch], budget: int,
              flags: Callable[[Launch], list[str]], release_python: str | None = None
              ) -> list[tuple[bool, list[str]]]:
    """check_server for each of ``launches`` at once (``check_servers``), with ``flags`` of
    each; show each server's lines after its unit's name; ``(passed, lines)`` of each, in order.
    ``release_python``: the Python of the release they run, before ``current`` names it.

        check_all(profile, launches, 1800, lambda launch: ["--health-only"])
    """
    each = [arguments(profile, launch, *flags(launch), budget=budget) for launch in launches]
    argv = program(python(profile, release_python), TOGETHER, "--servers", json.dumps(each))
    _, output = run(shlex.join(argv))  # the gate itself, not a read of state: no fact for it
    errors = output.stderr_lines
    why = f"check_servers cut short: {errors[-1]}" if errors else "check_servers cut short"
    found = split(launches, list(output.stdout_lines), why)
    for launch, (_, lines) in zip(launches, found, strict=True):
        show_lines(lines, f"{launch.unit}: ")
    return found


class Checked(Protocol):
    """Where ``check_together`` leaves a server's check for its gate (GateResult)."""

    checked: tuple[bool, list[str]] | None


def split(launches: Sequence[Launch], lines: list[str],
          why: str = "check_servers cut short") -> list[tuple[bool, list[str]]]:
    """check_servers' output, one ``(passed, lines)`` per launch in order: each server's lines
    end at its ``CHECKED`` line. A server with no such line (the program cut short) failed,
    with what it printed and a result saying so (``why``: the program's last error line).

        split([launch], ["health: ...", 'GATE {"ok": true}', 'CHECKED {"exit": 0}'])
        # [(True, ['health: ...', 'GATE {"ok": true}'])]
    """
    found: list[tuple[bool, list[str]]] = []
    own: list[str] = []
    for line in lines:
        if line.startswith(f"{DONE_MARK} ") and len(found) < len(launches):
            done = result_line([line], DONE_MARK) or {}
            found.append((done.get("exit") == 0, own))
            own = []
        else:
            own.append(line)
    for launch in launches[len(found):]:
        cut = {"ok": False, "error": f"the checks of {launch.unit} ended before they said "
                                    f"whether it passed ({why})"}
        found.append((False, [*own, f"{RESULT_MARK} {json.dumps(cut)}"]))
        own = []
    return found


@operation(is_idempotent=True)
def check_together(profile: Profile, launches: list[Launch], job: str, soak: int | None,
                   budget: int, results: Sequence[Checked]) -> Ops:
    """Run the gate's checks of a host's servers at once (``check_servers``, one process for
    each, started together), leaving each server's in its result for its own gate operation,
    which judges it then.

    + job: ``COMPLETIONS,TOKENS`` for the job estimate, or empty
    + soak: concurrent requests of each soak (None: twice max running requests; 0: none)
    + budget: seconds each server may take to become healthy
    + results: where each launch's check goes (``checked``), in the same order

        check_together(name="Gate checks of 8 servers at once", profile=profile,
                       launches=launches, job="", soak=None, budget=1800, results=results)
    """
    if not state.is_executing:  # it checks the servers the run has just (re)started
        yield from preview(f"the gate's checks of {len(launches)} servers at once, each "
                           "judged by its own gate", changes=False)
        return
    found = check_all(profile, launches, budget,
                      lambda launch: gate_flags(profile, launch, job, soak))
    for result, checked in zip(results, found, strict=True):
        result.checked = checked
    host.noop(f"the gate's checks of {len(launches)} servers ran at once")
    yield from ()


def result_of(lines: list[str]) -> dict[str, Any]:
    """check_server's result: its ``GATE {json}`` line (``RESULT_MARK``), {} without one.

        result_of(['soak: ...', 'GATE {"ok": true, "measured": {...}}'])["ok"]   # True
    """
    return result_line(lines, RESULT_MARK) or {}


def error_of(lines: list[str]) -> str:
    """What check_server found wrong, from its result line (its control characters shown as
    codes: it quotes the server and the journal).

        error_of(['GATE {"ok": false, "error": "sglang.service failed to start: ..."}'])
    """
    return printable(str(result_of(lines).get("error", "gate failed")))
