"""Rolling redeploy through the router: hosts in inventory order, K at a time; every host is
prepared first while all serve (release installed, weights staged, caches warmed), then each
batch is converged with ``sglang_fleet.converge.serve`` (which restarts only what changed) and
gated. A host leaves every router, and drains (its servers' own metrics, with a bound), inside
that run at the first command that would disturb its servers (``cutover``), so it is out only
for the restart and the gate; it is put back and seen healthy by the routers before the next
batch. The first failure stops the roll: the batch goes back to its last good release
(``sglang_fleet.converge.restore``), is put back, and the rest is left untouched.

    sglang-fleet roll inventories/b200.py --batch 1 --data sglang.memory.max_running_requests=48
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.context import ctx_state

from sglang_fleet import hostconfig as hostdata
from sglang_fleet.config import preflight, validators
from sglang_fleet.config.render import render_all
from sglang_fleet.errors import InputError, Problem
from sglang_fleet.report import status
from sglang_fleet.rollout import fleet
from sglang_fleet.rollout.cutover import RollDirectory
from sglang_fleet.rollout.router_api import Router, RouterError
from sglang_fleet.stages import compiled_exchange

DEPLOYS = "sglang_fleet.converge"  # pyinfra runs these functions per host, from any directory


@dataclass
class Outcome:
    """What happened to one host."""

    host: str
    result: str = "untouched"
    seconds: float = 0.0
    out_seconds: float | None = None  # out of the routers: from leaving until seen healthy again
    still_out: bool = False  # the roll ended with the host out of the routers
    notes: list[str] = field(default_factory=list)
    # --batch-instances: each wave of its servers that left and came back (URLs, seconds out)
    waves: list[tuple[list[str], float]] = field(default_factory=list)

    def out_text(self) -> str:
        """The seconds out of the routers for the table: the longest any of its servers was
        out (the host whole, or its longest wave); "-" for a host never taken out.

            Outcome("h1", out_seconds=41.63).out_text()   # '41.6'
        """
        spans = [s for _, s in self.waves] + \
            ([self.out_seconds] if self.out_seconds is not None else [])
        if not spans:
            return "-"
        return f"{max(spans):.1f}" + (" still" if self.still_out else "")

    def wave_lines(self) -> list[str]:
        """One line per wave of its servers that left the routers on its own.

            Outcome("h1", waves=[(["http://h1:30000"], 12.3)]).wave_lines()
            # ['wave 1 out of the router 12.3 s: http://h1:30000']
        """
        return [f"wave {i} out of the router {seconds:.1f} s: {', '.join(urls)}"
                for i, (urls, seconds) in enumerate(self.waves, 1)]


@dataclass
class Plan:
    inventory: str
    data: list[str]
    batches: list[list[Host]]
    before: dict[str, list[str]]  # host -> worker URLs now (what the routers know)
    after: dict[str, list[str]]  # host -> worker URLs once converged with the roll's data
    routers: list[Router]
    # host -> unit -> the URLs a router may know it by (with the inventory; with --data)
    units: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    batch_instances: int | None = None  # a host's servers restarted at a time (None: whole)


_DATA_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def parse_data(pairs: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs as pyinfra's ``--data`` reads them."""
    split = [pair.partition("=") for pair in pairs]
    for pair, (key, sep, value) in zip(pairs, split, strict=True):
        shown = pair if len(pair) <= 80 else pair[:77] + "..."
        if not sep or not key:
            raise InputError.one("--data", shown, "not key=value",
                                 "e.g. --data sglang.memory.max_running_requests=48")
        if not _DATA_KEY.fullmatch(key):
            raise InputError.one("--data", shown, f"{key!r} is not a data key (identifiers "
                                 "joined by dots)", "e.g. sglang.memory.page_size")
        wrong = validators.control_char(value) or (
            f"is {len(value)} characters long" if len(value) > validators.MAX_TEXT else None)
        if wrong:
            raise InputError.one("--data", key, f"the value {wrong}", "give a one-line value")
    from pyinfra_cli.util import parse_cli_arg  # see load()

    return {key: parse_cli_arg(value) for key, _, value in split}


def load(inventory: str, data: dict[str, Any]) -> Inventory:
    if not Path(inventory).is_file():
        raise InputError.one(inventory, "", "no such inventory file",
                             "give a pyinfra inventory, e.g. inventories/b200.py")
    # Importing pyinfra_cli patches the whole process with gevent: only where it is needed.
    from pyinfra_cli.inventory import make_inventory

    # Loading an inventory needs a state (pyinfra's API is untyped here).
    ctx_state.set(State(Inventory(([], {})), Config()))  # type: ignore[no-untyped-call]
    try:
        loaded: Inventory = make_inventory(inventory, override_data=data)
    except Exception as exc:  # the inventory is the operator's code: any error in it is theirs
        raise _inventory_error(inventory, exc) from None
    return loaded


def _inventory_error(inventory: str, exc: Exception) -> InputError:
    """What went wrong loading an inventory (pyinfra wraps errors in its files), as input."""
    source = str(getattr(exc, "filename", None) or inventory)
    inner = getattr(exc, "exception", None)  # pyinfra_cli's Unexpected*Error wrap the cause
    exc = inner if isinstance(inner, Exception) else exc
    if isinstance(exc, InputError):
        return exc
    if isinstance(exc, SyntaxError):
        return InputError.one(exc.filename or source, f"line {exc.lineno}",
                              f"not valid Python: {exc.msg}",
                              "fix the syntax there (python3 -m py_compile FILE)")
    try:
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    except Exception:  # pyinfra's own errors can fail to print
        detail = ""
    return InputError.one(source, "", "pyinfra cannot load the inventory: "
                          f"{type(exc).__name__}{': ' + detail if detail else ''}",
                          "fix the inventory or its group data (pyinfra INVENTORY "
                          "debug-inventory shows what pyinfra reads)")


def grouped(errors: dict[str, InputError]) -> InputError:
    """One error per distinct problem, naming every host that has it (a bad ``--data`` value
    is everyone's problem, not the first host's).

        grouped({"a": err_a, "b": err_b})   # "pyinfra data of a, b: sglang.x: ..."
    """
    hosts_of: dict[tuple[str, str, str, str], list[str]] = {}
    for name, err in errors.items():
        for p in err.problems:
            shared = (p.source.replace(name, "\0"), p.key.replace(name, "\0"),
                      p.message.replace(name, "\0"), p.fix.replace(name, "\0"))
            hosts_of.setdefault(shared, []).append(name)
    problems = []
    for (source, key, message, fix), names in hosts_of.items():
        listed = ", ".join(names)
        where = source.replace("\0", listed) if "\0" in source else \
            f"{source} ({'host' if len(names) == 1 else 'hosts'} {listed})"
        problems.append(Problem(where, key.replace("\0", listed),
                                message.replace("\0", listed), fix.replace("\0", listed)))
    return InputError(problems)


def data_warning(data: Sequence[str]) -> str | None:
    """What to say about ``--data``: it changes these hosts, not the inventory.

        data_warning(["sglang.memory.max_running_requests=48"])   # "warning: --data ..."
    """
    if not data:
        return None
    return (f"warning: --data {' '.join(data)} is applied to the hosts but is not in the "
            "inventory: the next plain deploy (deploys/sglang.py) reverts it; to keep it, put "
            "it in the inventory's host or group data")


def plan(inventory: str, data: Sequence[str], batch: int,
         batch_instances: int | None = None) -> Plan:
    if batch < 1:
        raise InputError.one("--batch", "", f"must be at least 1, got {batch}",
                             "hosts converged at a time, e.g. --batch 1")
    if batch_instances is not None and batch_instances < 1:
        raise InputError.one("--batch-instances", "",
                             f"must be at least 1, got {batch_instances}",
                             "a host's servers restarted at a time, e.g. --batch-instances 2, "
                             "or leave it out to restart a host's servers together")
    now, then = load(inventory, {}), load(inventory, parse_data(data))
    hosts = fleet.serving_hosts(then)
    if not hosts:
        raise InputError.one(inventory, "sglang_profile", "no serving hosts",
                             "give hosts a serving profile in their group data")
    after, units, errors = {}, {}, {}
    for host in hosts:  # every host's change is checked before the first one is touched
        try:
            profile = hostdata.profile_for(host)
            launches = render_all(profile)
            preflight.require_host(profile, launches, host.name, hostdata.gpu_count(host))
            after[host.name] = fleet.urls(host, profile, launches)
            units[host.name] = {launch.unit: [url] for launch, url in
                                zip(launches, after[host.name], strict=True)}
        except InputError as err:
            errors[host.name] = err
    if errors:
        raise grouped(errors)
    _fits(batch_instances, after)
    routers = fleet.routers(then)
    for router in routers:
        wrong = validators.url_problem(router.url, allow_http=True)
        if wrong:
            raise InputError.one(f"pyinfra data of {fleet.ROUTERS_GROUP}", "router_url", wrong,
                                 "set router_url = 'http://HOST:PORT' (or leave it out)")
    if not routers:
        raise InputError.one(inventory, fleet.ROUTERS_GROUP,
                             "no router: a roll takes hosts out of the router and puts them "
                             "back", "put the router hosts in a group 'routers' and run "
                             "deploys/router.py")
    before = {h.name: fleet.unit_urls(h) for h in fleet.serving_hosts(now)}
    for name, by_unit in before.items():
        for unit, url in by_unit.items():
            known = units.setdefault(name, {}).setdefault(unit, [])
            known[:0] = [url] if url not in known else []
    return Plan(inventory=inventory, data=list(data),
                batches=[hosts[i:i + batch] for i in range(0, len(hosts), batch)],
                before={name: list(by_unit.values()) for name, by_unit in before.items()},
                after=after,
                routers=[r.api() for r in routers], units=units,
                batch_instances=batch_instances)


def _fits(batch_instances: int | None, after: dict[str, list[str]]) -> None:
    """``--batch-instances`` no larger than the servers of any host of the roll.

        _fits(2, {"b200-01": ["http://10.0.0.11:30000"]})   # InputError: ... runs 1 server
    """
    fewer = {name: len(urls) for name, urls in after.items()
             if batch_instances is not None and len(urls) < batch_instances}
    if fewer:
        hosts = ", ".join(f"{name} runs {n} server{'s' if n > 1 else ''}"
                          for name, n in fewer.items())
        raise InputError.one("--batch-instances", "",
                             f"{batch_instances} is more than a host's servers: {hosts}",
                             f"give at most {min(len(u) for u in after.values())} (the fewest "
                             "servers a host of the roll runs: parallel.instances), or leave it "
                             "out to restart each host's servers together")


def say(message: str) -> None:
    print(f"roll: {time.strftime('%H:%M:%S')} {message}", flush=True)


class Started(Protocol):
    def running(self) -> bool:
        """Whether the run's process is still going."""
        ...

    def wait(self) -> int:
        """Until the run ends (its output shown): its exit status."""
        ...


# Start one pyinfra run: inventory, deploy function, hosts, --data, extra environment.
Start = Callable[[str, str, list[str], Sequence[str], dict[str, str]], Started]


class PyinfraRun:
    """A pyinfra run in its own process. Its output waits in a file (root's, 0600) until it
    is shown by ``wait``: a batch's run starts while the batch before it is still converging,
    and their lines must not mix."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        fd, self.log = tempfile.mkstemp(prefix="sglang-fleet-run-", suffix=".log")
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.shown = 0

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self) -> int:
        with open(self.log, "rb") as log:
            log.seek(self.shown)
            while True:
                ended = self.proc.poll() is not None
                chunk = log.read()
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                    self.shown += len(chunk)
                if ended:
                    break
                time.sleep(0.1)
        Path(self.log).unlink(missing_ok=True)
        return self.proc.returncode


def pyinfra(inventory: str, deploy: str, hosts: list[str], data: Sequence[str],
            env: dict[str, str]) -> Started:
    """One pyinfra run limited to ``hosts`` that stops at the first error (never asks)."""
    argv = [sys.executable, "-m", "pyinfra", "-y", "--fail-percent", "0", inventory,
            f"{DEPLOYS}.{deploy}", *(f"--limit={h}" for h in hosts),
            *(f"--data={d}" for d in data)]
    return PyinfraRun(argv, env)


class Roll:
    def __init__(self, plan: Plan, drain_timeout: float, health_timeout: float,
                 run: Start = pyinfra,
                 read_fleet: Callable[[], status.Fleet] | None = None) -> None:
        self.plan = plan
        # What the fleet serves once the roll ends, read as ``status`` reads it.
        self.read_fleet = read_fleet or (lambda: status.collect(
            plan.inventory, parse_data(plan.data), with_routers=False))
        self.drain_timeout = drain_timeout
        self.health_timeout = health_timeout
        self.run = run
        self.outcomes = {h.name: Outcome(h.name) for b in plan.batches for h in b}
        self.serving = dict(plan.before)  # host -> the URLs it serves at now
        self.out_since: dict[str, float] = {}  # host -> when it left the routers (wall clock)
        self.roll_dir: RollDirectory | None = None  # shared with the runs while the roll lasts
        self.started: list[Started] = []  # runs not yet waited for
        self.settled: set[str] = set()  # hosts whose batch ended (converged or restored)

    def start(self, deploy: str, names: list[str], data: Sequence[str]) -> Started:
        assert self.roll_dir is not None
        started = self.run(self.plan.inventory, deploy, names, data, self.roll_dir.env())
        self.started.append(started)
        return started

    def finish(self, run: Started, names: list[str]) -> bool:
        """Wait for the batch's run; each host that left the routers in it is noted (when,
        and what its drain left)."""
        self.started.remove(run)
        ok = run.wait() == 0
        assert self.roll_dir is not None
        for name in names:
            out = self.roll_dir.out_of_routers(name)
            if out is None:
                continue
            outcome = self.outcomes[name]
            outcome.notes = list(out.notes)  # the record keeps every run's notes
            outcome.waves = [(w.urls, w.back - w.left) for w in out.waves
                             if w.back is not None]
            since = out.still_out()
            if since is not None and name not in self.out_since:
                self.out_since[name] = since
        for name in names:  # a host that never left still says why it compiled itself
            notes = self.outcomes[name].notes
            notes += [n for n in compiled_exchange.notes(self.roll_dir, name) if n not in notes]
        return ok

    def went_out(self, name: str) -> None:
        """The host is out of the routers from now, unless it left earlier."""
        self.out_since.setdefault(name, time.time())

    def came_back(self, name: str, still_out: bool = False) -> None:
        """The host is healthy in every router again (or the batch ends with it out)."""
        since = self.out_since.pop(name, None)
        if since is not None:
            self.outcomes[name].out_seconds = max(time.time() - since, 0.0)
            self.outcomes[name].still_out = still_out

    def put_back(self, names: list[str], urls: dict[str, list[str]]) -> None:
        for name in names:
            self.serving[name] = urls.get(name, [])
            for router in self.plan.routers:
                for url in urls.get(name, []):
                    router.add(url)
                    router.wait_healthy(url, self.health_timeout)
                    say(f"{name}: {url} healthy in {router.url}")
            routers = f"router{'s' if len(self.plan.routers) > 1 else ''}"
            if name not in self.out_since:
                say(f"{name}: back in the {routers} wave by wave (no server out more than "
                    f"{self.outcomes[name].out_text()} s)" if self.outcomes[name].waves else
                    f"{name}: never left the {routers} (nothing on it restarted)")
                continue
            self.came_back(name)
            say(f"{name}: out of the {routers} for {self.outcomes[name].out_text()} s")

    def others_healthy(self, names: list[str]) -> None:
        """Every other host must be serving before this batch leaves: capacity stays N - K."""
        for router in self.plan.routers:
            workers = router.workers()
            for name, urls in self.serving.items():
                sick = [u for u in urls if name not in names
                        and not workers.get(u, {}).get("is_healthy")]
                if sick:
                    raise RouterError(f"{name} ({', '.join(sick)}) is not healthy in "
                                      f"{router.url}: taking {', '.join(names)} out too would "
                                      "leave less than N - batch hosts serving")

    def batch(self, hosts: list[Host], run: Started, following: list[str]) -> bool:
        """The batch's turn and go: its run (started earlier, and prepared) may change what
        serves and restart; each host leaves the routers at its first restart. Once it passed
        its gate, the following batch gets its turn (its files may change, it restarts
        nothing) while this one goes back into the routers."""
        names = [h.name for h in hosts]
        tic = time.monotonic()
        self.others_healthy(names)
        assert self.roll_dir is not None
        self.roll_dir.give("turn", names)
        self.roll_dir.give("go", names)
        say(f"{', '.join(names)}: its turn (out of the router from its first restart)")
        ok = self.finish(run, names)
        if ok and following:
            self.roll_dir.give("turn", following)
        try:
            if ok:
                self.put_back(names, self.plan.after)
        except RouterError as err:
            ok = False
            say(f"{', '.join(names)}: {err}")
            for router in self.plan.routers:
                for name in names:
                    self.went_out(name)
                    for url in self.plan.after.get(name, []):
                        router.remove(url)
        for name in names:
            self.outcomes[name].result = "converged" if ok else "failed"
        if not ok:
            self.restore(names)
        for name in names:
            self.outcomes[name].seconds = time.monotonic() - tic
            self.came_back(name, still_out=True)  # only if no put_back brought it back
        self.settled.update(names)
        return ok

    def restore(self, names: list[str]) -> None:
        say(f"{', '.join(names)}: failed; back to the last good release")
        back = self.finish(self.start("restore", names, []), names)
        for name in names:
            self.outcomes[name].result = ("failed, last good release serving again" if back
                                          else "failed, last good release NOT serving")
        if back:
            self.put_back(names, self.plan.before)

    def prepare(self, names: list[str], first: list[str], run: Started) -> bool:
        """The hosts after the first batch at once, while all of them serve, and the first
        batch in its own run meanwhile (``run``, until it waits for its turn): the release
        installed, the weights staged, the caches warmed, so a host out of the router only
        restarts."""
        tic = time.monotonic()
        if names:
            say(f"{', '.join(names)}: preparing (release, weights, warm-up) while serving")
            if not self.finish(self.start("prepare", names, self.plan.data), []):
                for name in self.outcomes:
                    self.outcomes[name].result = "not touched: preparing failed"
                say("preparing failed: no host was taken out of the router")
                return False
        assert self.roll_dir is not None
        while run.running() and not all(self.roll_dir.has(n, "waiting") for n in first):
            time.sleep(0.2)
        say(f"prepared in {time.monotonic() - tic:.0f} s")
        return True

    def unstage(self) -> None:
        """Hosts a stopped roll left after their turn and before their restart: the last good
        unit and environment files back, without a restart (their servers still run them)."""
        assert self.roll_dir is not None
        stranded = [n for n in self.outcomes if n not in self.settled
                    and self.roll_dir.has(n, "took") and self.roll_dir.out_of_routers(n) is None]
        if not stranded:
            return
        say(f"{', '.join(stranded)}: stopped after its files changed and before its restart; "
            "the last good files go back (no restart)")
        ok = self.finish(self.start("unstage", stranded, self.plan.data), [])
        for name in stranded:
            self.outcomes[name].result = ("not restarted: last good files back" if ok else
                                          "not restarted: last good files NOT back")

    def __call__(self) -> bool:
        order = [h.name for b in self.plan.batches for h in b]
        say(f"order: {' → '.join(order)} ({len(self.plan.batches)} batches); routers: "
            f"{', '.join(r.url for r in self.plan.routers)}")
        self.roll_dir = RollDirectory.create()
        self.roll_dir.plan({n: self.serving.get(n, []) for n in order}, self.drain_timeout,
                          units=self.plan.units, batch_instances=self.plan.batch_instances,
                          health_timeout=self.health_timeout)
        first = [h.name for h in self.plan.batches[0]]
        try:
            # The first batch's run prepares its hosts itself, beside the others' preparation;
            # it changes nothing that serves before its turn.
            say(f"{', '.join(first)}: preparing in its own run, then waiting for its turn")
            run = self.start("serve", first, self.plan.data)
            rest = [n for n in order if n not in first]
            return self.prepare(rest, first, run) and self.cutover(run)
        finally:
            self.roll_dir.abort()  # a run still waiting for its turn or go stops there
            for run in list(self.started):
                self.finish(run, [])
            self.unstage()
            self.roll_dir.close()

    def cutover(self, first: Started) -> bool:
        """Batch after batch; each batch's run starts when the batch before it gets its turn,
        so its facts, uploads and checks are done by the time its own turn comes."""
        batches = self.plan.batches
        runs = [first]
        for i, hosts in enumerate(batches):
            if i + 1 < len(batches):
                runs.append(self.start("serve", [h.name for h in batches[i + 1]],
                                       self.plan.data))
            following = [h.name for h in batches[i + 1]] if i + 1 < len(batches) else []
            if not self.batch(hosts, runs[i], following):
                return False  # stops at the first failure
        return True

    def report(self) -> str:
        rows = [f"{'host':<16}{'result':<44}{'seconds':>8}{'out of router (s)':>20}"]
        for outcome in self.outcomes.values():
            rows.append(f"{outcome.host:<16}{outcome.result:<44}{outcome.seconds:>8.0f}"
                        f"{outcome.out_text():>20}")
            rows += [f"{'':<16}{note}" for note in outcome.wave_lines() + outcome.notes]
        return "\n".join(rows)

    def fleet_lines(self) -> list[str]:
        """The fleet's capacity and job time as it serves once the roll is over (what each
        server's last passed gate measured, read as ``status`` reads it)."""
        try:
            return self.read_fleet().lines()
        except InputError as err:  # checked before the roll; said, should it change since
            return ["fleet: not read: " + "; ".join(f"{p.source}: {p.key}: {p.message}"
                                                   for p in err.problems)]


def _seconds(option: str, value: float) -> None:
    if not math.isfinite(value) or not 0 <= value <= 86400:
        raise InputError.one(option, "", f"must be seconds from 0 to 86400, got {value}",
                             f"e.g. {option} 600")


def main(inventory: str, data: Sequence[str], batch: int, drain_timeout: float,
         health_timeout: float, batch_instances: int | None = None) -> int:
    _seconds("--drain-timeout", drain_timeout)
    _seconds("--health-timeout", health_timeout)
    roll = Roll(plan(inventory, data, batch, batch_instances), drain_timeout, health_timeout)
    warning = data_warning(data)
    if warning:
        say(warning)
    try:
        ok = roll()
    except RouterError as err:
        say(f"stopped: {err}")
        ok = False
    print(roll.report(), flush=True)  # before the fleet is read: it takes a moment
    print("\n".join(roll.fleet_lines()))
    if warning:
        print(f"roll: {warning}", file=sys.stderr)
    if not ok:
        print("roll: stopped at the first failure; hosts after it were not touched",
              file=sys.stderr)
    return 0 if ok else 1
