"""Rolling redeploy through the router: hosts in inventory order, K at a time; every host is
prepared first while all serve (release installed, weights staged, caches warmed), then each
batch is converged with ``sglang_fleet.converge.serve`` (which restarts only what changed) and
gated. A host leaves every router, and drains (its servers' own metrics, with a bound), inside
that run at the first command that would disturb its servers (``cutover``), so it is out only
for the restart and the gate; it is put back and seen healthy by the routers before the next
batch. The first failure stops the roll: the batch goes back to its last good release
(``sglang_fleet.converge.restore``), is put back, and the rest is left untouched.

At fleet scale: ``--batch`` may be a percentage; ``--max-unavailable`` bounds the hosts out of
service at once, counting those already unhealthy (``budget``); ``--tolerate`` lets that many
hosts that do not answer or fail their preparation be skipped, reported, serving as they were;
a journal of what converged lets ``--resume`` go on where a stopped roll stopped (``scale``).

    sglang-fleet roll inventories/b200.py --batch 1 --data sglang.memory.max_running_requests=48
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pyinfra.api.host import Host

from sglang_fleet.fleet.inventory import parse_data
from sglang_fleet.fleet.reach import unreachable
from sglang_fleet.fleet.roll_directory import RollDirectory
from sglang_fleet.fleet.router_api import RouterError
from sglang_fleet.report import status
from sglang_fleet.roll import budget
from sglang_fleet.roll.outcome import Outcome, fleet_lines, hosts_text, table
from sglang_fleet.roll.planning import Plan
from sglang_fleet.roll.runs import Start, Started, pyinfra
from sglang_fleet.roll.scale import Journal
from sglang_fleet.stages.compiled import exchange as compiled_exchange


def say(message: str) -> None:
    print(f"roll: {time.strftime('%H:%M:%S')} {message}", flush=True)


class Roll:
    def __init__(self, plan: Plan, drain_timeout: float, health_timeout: float,
                 run: Start = pyinfra,
                 read_fleet: Callable[[], status.Fleet] | None = None,
                 reach: Callable[[list[Host]], dict[str, str]] = unreachable,
                 max_unavailable: int | None = None, tolerate: int = 0,
                 journal: Journal | None = None) -> None:
        self.plan = plan
        self.max_unavailable = max_unavailable  # hosts out at once (None: the batch's own)
        self.tolerate = tolerate  # hosts that may be skipped (unreachable, failed preparing)
        self.journal = journal  # what converged, for --resume
        self.batches = [list(b) for b in plan.batches]  # without the hosts skipped
        self.skipped: dict[str, str] = {}  # host -> why it was left out
        # Which hosts do not answer over SSH, and the connection's error: a failure's first
        # cause, said before whatever failed after it (a run, a router).
        self.reach = reach
        # What the fleet serves once the roll ends, read as ``status`` reads it.
        self.read_fleet = read_fleet or (lambda: status.collect(
            plan.inventory, parse_data(plan.data), with_routers=False))
        self.drain_timeout = drain_timeout
        self.health_timeout = health_timeout
        self.run = run
        self.hosts = {h.name: h for b in plan.batches for h in b}
        self.outcomes = {name: Outcome(name, "converged by the roll it resumes" if name in
                                       plan.done else "untouched")  # in inventory order
                         for name in [*plan.unit_of, *self.hosts] if name in self.hosts
                         or name in plan.done}
        self.serving = dict(plan.before)  # host -> the URLs it serves at now
        self.out_since: dict[str, float] = {}  # host -> when it left the routers (wall clock)
        self.roll_dir: RollDirectory | None = None  # shared with the runs while the roll lasts
        self.started: list[Started] = []  # runs not yet waited for
        self.settled: set[str] = set(plan.done)  # hosts whose batch ended, or skipped

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

    def nth(self, name: str) -> str:
        """``host K of N NAME``: where the host is in the roll's order."""
        return f"host {list(self.hosts).index(name) + 1} of {len(self.hosts)} {name}"

    def causes(self, names: list[str], otherwise: str) -> None:
        """Each host's first cause of a failure: its SSH error when it does not answer,
        else ``otherwise`` (what failed)."""
        down = self.reach([self.hosts[n] for n in names]) if names else {}
        for name in names:
            self.outcomes[name].cause = down.get(name, otherwise)

    def cause(self) -> str:
        """The roll's first cause of failure, with its host ("" when none)."""
        causes = [o for o in self.outcomes.values() if o.cause]
        failed = [o for o in causes if o.host not in self.skipped] or causes
        return f"{self.nth(failed[0].host)}: {failed[0].cause}" if failed else ""

    def not_touched(self, names: list[str], why: str) -> bool:
        """The hosts ``names`` failed before their turn (nothing that serves changed, none
        left the routers): each says its cause; every host not settled is not touched."""
        self.causes(names, why)
        for name, outcome in self.outcomes.items():
            if name not in self.settled:
                outcome.result = ("not touched: failed before its turn" if name in names else
                                  "not touched: the roll stopped before it")
        for name in names:
            say(f"{self.nth(name)}: {self.outcomes[name].cause}")
        say("stopped before any of it was taken out of the router: the fleet serves as it did")
        return False

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
                for url in router.rejoin(urls.get(name, []), self.health_timeout):
                    say(f"{name}: {url} healthy in {router.url}")
            routers = f"router{'s' if len(self.plan.routers) > 1 else ''}"
            if name not in self.out_since:
                say(f"{name}: back in the {routers} wave by wave (no server out more than "
                    f"{self.outcomes[name].out_text()} s)" if self.outcomes[name].waves else
                    f"{name}: never left the {routers} (nothing on it restarted)")
                continue
            self.came_back(name)
            say(f"{name}: out of the {routers} for {self.outcomes[name].out_text()} s")

    def within_budget(self, names: list[str], say: Callable[[str], None]) -> None:
        """The batch ``names`` may leave only if the hosts then out of service, its own and those
        already unhealthy in a router, stay within the roll's ``max_unavailable`` (by default the
        batch's own and those the roll skipped: every other host must be serving, capacity stays
        N - K); else a RouterError naming them (with their SSH error when they do not answer)."""
        sick = budget.unhealthy(self.plan.routers, self.serving, self.plan.unit_of, names)
        if not sick:
            return
        limit = len(names) + len(set(sick) & set(self.skipped)) \
            if self.max_unavailable is None else self.max_unavailable
        out = len(names) + len(sick)
        if out <= limit:
            say(f"already out of service: {budget.listed(sick)}; with {', '.join(names)} out "
                f"too, {out} of --max-unavailable {limit}")
            return
        reached = [self.hosts[n] for n in list(sick)[:budget.SHOWN] if n in self.hosts]
        ssh = self.reach(reached) if reached else {}
        bound = (f"--max-unavailable {limit}" if self.max_unavailable is not None else
                 "the batch's own hosts and those skipped (--max-unavailable, by default)")
        raise RouterError(f"{budget.listed(sick, ssh)}: taking {', '.join(names)} out too would "
                          f"make {out} hosts unavailable, more than {bound}")

    def batch(self, hosts: list[Host], run: Started, following: list[str]) -> bool:
        """The batch's turn and go: its run (started earlier, and prepared) may change what
        serves and restart; each host leaves the routers at its first restart. Once it passed
        its gate, the following batch gets its turn (its files may change, it restarts
        nothing) while this one goes back into the routers."""
        names = [h.name for h in hosts]
        tic = time.monotonic()
        self.within_budget(names, say)
        if not self.ready(run, names):
            return self.not_touched(names, "its deploy stopped before its turn (its output "
                                    "above)")
        assert self.roll_dir is not None
        self.roll_dir.give("turn", names)
        self.roll_dir.give("go", names)
        for name in names:
            say(f"{self.nth(name)}: its turn (out of the router from its first restart)")
        ok = self.finish(run, names)
        if not ok:
            self.causes(names, "its deploy failed (its output above)")
        if ok and following:
            self.roll_dir.give("turn", following)
        try:
            if ok:
                self.put_back(names, self.plan.after)
        except RouterError as err:
            ok = False
            say(f"{', '.join(names)}: {err}")
            for name in names:
                self.outcomes[name].cause = f"router: {err}"
            for router in self.plan.routers:
                for name in names:
                    self.went_out(name)
                    for url in self.plan.after.get(name, []):
                        router.remove(url)
        for name in names:
            self.outcomes[name].result = "converged" if ok else "failed"
        if not ok:
            self.restore(names)
        if ok and self.journal is not None:
            self.journal.converged(names)
        for name in names:
            self.outcomes[name].seconds = time.monotonic() - tic
            self.came_back(name, still_out=True)  # only if no put_back brought it back
            outcome = self.outcomes[name]
            say(f"{self.nth(name)}: {outcome.result}"
                + (f" (cause: {outcome.cause})" if outcome.cause else ""))
        self.settled.update(names)
        return ok

    def ready(self, run: Started, names: list[str]) -> bool:
        """Whether the batch's run is prepared and waits for its turn: False when it ended
        before (it failed: an unreachable host, a refused check), having changed nothing that
        serves. Its output is shown then."""
        assert self.roll_dir is not None
        while run.running() and not all(self.roll_dir.has(n, "waiting") for n in names):
            time.sleep(0.2)
        if all(self.roll_dir.has(n, "waiting") for n in names):
            return True
        self.finish(run, [])
        return False

    def restore(self, names: list[str]) -> None:
        say(f"{', '.join(names)}: failed; back to the last good release")
        back = self.finish(self.start("restore", names, []), names)
        for name in names:
            self.outcomes[name].result = ("failed, last good release serving again" if back
                                          else "failed, last good release NOT serving")
        if back:
            self.put_back(names, self.plan.before)

    def prepare(self, names: list[str], first: list[str], run: Started | None) -> bool:
        """``names`` at once, while all of them serve, and the first batch in its own run
        meanwhile (``run``, until it waits for its turn; None: it is among ``names``): the
        release installed, the weights staged, the caches warmed, so a host out of the router
        only restarts. A host whose preparation fails is skipped when ``--tolerate`` allows,
        else the roll stops with nothing taken out."""
        tic = time.monotonic()
        if names:
            say(f"{hosts_text(names)}: preparing (release, weights, warm-up) while serving")
            ok = self.finish(self.start("prepare", names, self.plan.data), [])
            assert self.roll_dir is not None
            # A tolerant preparation goes on past a failed host, and each host that prepared
            # says so; otherwise the run stopped at the first failure (each host's SSH error
            # is said, the rest is the run's output).
            failed = [n for n in names if not self.roll_dir.has(n, "prepared")] \
                if self.tolerate else []
            failed = failed or ([] if ok else names)
            self.causes(failed, "its preparation failed (its output above)" if self.tolerate
                        else "")
            if failed and not self.skip({n: self.outcomes[n].cause for n in failed},
                                        "preparing failed"):
                for name in self.outcomes:
                    if name not in self.settled:
                        self.outcomes[name].result = "not touched: preparing failed"
                for name in failed:
                    if self.outcomes[name].cause:
                        say(f"{self.nth(name)}: {self.outcomes[name].cause}")
                over = f" (more hosts to skip than --tolerate {self.tolerate})" \
                    if self.tolerate else ""
                say(f"preparing failed{over}: no host was taken out of the router")
                return False
        # The first batch's run says it is prepared when it waits for its turn; one that
        # ended before then failed (e.g. a host it could not reach), and is not prepared.
        if run is not None and not self.ready(run, first):
            return self.not_touched(first, "its deploy stopped before its turn (its output "
                                    "above)")
        say(f"prepared in {time.monotonic() - tic:.0f} s")
        return True

    def skip(self, reasons: dict[str, str], result: str) -> bool:
        """Leave hosts out of the roll (each serving as it did; a group whole), said and
        reported, if ``--tolerate`` allows that many; else False, nothing skipped."""
        whole = {member: (why if member == name else f"{name} of its group: {why}")
                 for name, why in reasons.items()
                 for member in self.plan.unit_of.get(name, [name]) if member in self.hosts}
        if len({**self.skipped, **whole}) > self.tolerate:
            return False
        for name, why in whole.items():
            self.skipped[name] = why
            self.outcomes[name].result = f"skipped: {result}"
            self.outcomes[name].cause = why
            self.settled.add(name)
            say(f"{self.nth(name)}: skipped, serving as it did ({why})")
        self.batches = [b for b in ([h for h in b if h.name not in self.skipped]
                                    for b in self.batches) if b]
        if self.journal is not None:
            self.journal.skip(whole)
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
        order = [h.name for b in self.batches for h in b]
        if self.plan.done:
            say(f"resuming: {hosts_text(self.plan.done)} converged by the roll it resumes; "
                "not rolled again")
        if not order:
            say("nothing left to roll")
            return self.ended(True)
        say(f"order: {hosts_text(order, ' → ')} ({len(self.batches)} batches); routers: "
            f"{', '.join(r.url for r in self.plan.routers)}")
        # Every host answers over SSH before any run starts: one that does not would fail its
        # run, and is named here as the cause rather than by what fails after it.
        down = self.reach(list(self.hosts.values()))
        if down and not self.skip(down, "unreachable"):
            for name in order:
                self.outcomes[name].result = ("not touched: unreachable" if name in down else
                                              "not touched: the roll stopped before it")
                self.outcomes[name].cause = down.get(name, "")
                if name in down:
                    say(f"{self.nth(name)}: {down[name]}")
            say("stopped before any host was touched: the fleet serves as it did")
            return self.ended(False)
        self.roll_dir = RollDirectory.create()
        self.roll_dir.plan({n: self.serving.get(n, []) for n in order}, self.drain_timeout,
                          units=self.plan.units, batch_instances=self.plan.batch_instances,
                          health_timeout=self.health_timeout)
        try:
            return self.ended(self.run_batches())
        except RouterError as err:
            self.ended(False, str(err))
            raise
        finally:
            self.roll_dir.abort()  # a run still waiting for its turn or go stops there
            for run in list(self.started):
                self.finish(run, [])
            self.unstage()
            self.roll_dir.close()

    def run_batches(self) -> bool:
        if not self.batches:
            return False
        names = [h.name for b in self.batches for h in b]
        if self.tolerate:  # every host prepared in one run, so a failure is one host's
            return self.prepare(names, [], None) and bool(self.batches) and self.cutover(None)
        # The first batch's run prepares its hosts itself, beside the others' preparation;
        # it changes nothing that serves before its turn.
        first = [h.name for h in self.batches[0]]
        say(f"{', '.join(first)}: preparing in its own run, then waiting for its turn")
        run = self.start("serve", first, self.plan.data)
        return self.prepare(names[len(first):], first, run) and self.cutover(run)

    def ended(self, ok: bool, why: str = "") -> bool:
        """The roll's end in its journal: complete when every host converged (a skipped host
        is left for ``--resume``)."""
        ok = ok and not self.skipped
        if self.journal is not None:
            self.journal.end("complete" if ok else f"stopped: {why or self.cause()}")
        return ok

    def cutover(self, first: Started | None) -> bool:
        """Batch after batch; each batch's run starts when the batch before it gets its turn,
        so its facts, uploads and checks are done by the time its own turn comes."""
        batches = self.batches
        runs = [first or self.start("serve", [h.name for h in batches[0]], self.plan.data)]
        for i, hosts in enumerate(batches):
            if i + 1 < len(batches):
                runs.append(self.start("serve", [h.name for h in batches[i + 1]],
                                       self.plan.data))
            following = [h.name for h in batches[i + 1]] if i + 1 < len(batches) else []
            if not self.batch(hosts, runs[i], following):
                return False  # stops at the first failure
        return True

    def report(self) -> str:
        return table(self.outcomes.values())

    def fleet_lines(self) -> list[str]:
        return fleet_lines(self.read_fleet)
