"""Two multi-node groups on the lab (``inventories/lab_multinode.py`` on four hosts): lab1 and
lab2 serve one server of the shipped profile at tp 16 (group ``lab-tp16``: rank 0 on lab1, rank
1 on lab2, 8 GPUs each), lab3 and lab4 another (group ``lab-tp16-b``: rank 0 on lab3). The
groups' deploy and gate, the router holding the two rank 0s alone, a rank killed and its group
restarting whole by itself while the other serves on, a rank that never starts failing the
gate by name, a roll of both groups under load without a failed request (and never a rank >= 1
in the router, never both groups out of it), and teardown rank 0 first in each group."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import httpx
import pytest

from tests.lab.conftest import (
    ADMIN_KEY_FILE,
    KEY_FILE,
    ROUTER,
    address,
    booted_lab,
    connects,
    run,
    ssh,
    url,
)
from tests.lab.load import Background, Load

pytestmark = pytest.mark.lab
INVENTORY = "inventories/lab_multinode.py"
GROUPS = {"lab-tp16": ("lab1", "lab2"), "lab-tp16-b": ("lab3", "lab4")}  # rank order
# each group's rendezvous port: the lab's hosts share one network (inventories/lab_multinode.py)
DIST_PORT = {"lab-tp16": 20000, "lab-tp16-b": 20001}
HOSTS = tuple(h for members in GROUPS.values() for h in members)
UNIT = "sglang.service"  # a member runs one server
RANK0 = {name: url(members[0], 30000) for name, members in GROUPS.items()}
WORKERS = {u: True for u in RANK0.values()}  # never lab2's or lab4's: dummy health servers
RANK1 = {url(members[1], 30000) for members in GROUPS.values()}
MODEL = "qwen3.6-27b"
RECOVERY_BOUND = 180  # seconds from rank 1's kill until its group serves in the router again
# a rank 1's start made to fail (test_a_rank_that_never_starts_fails_the_gate_by_name)
HELD_BACK = "/etc/systemd/system/sglang.service.d/zz-held-back.conf"


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", str(len(HOSTS)), "--gpus", "8")


def pyinfra(*argv: str) -> tuple[int, str]:
    result = run("pyinfra", "-y", INVENTORY, *argv)
    return result.returncode, result.stdout + result.stderr


def deploy(*data: str) -> tuple[int, str]:
    return pyinfra("deploys/sglang.py", *(a for d in data for a in ("--data", d)))


def pid_and_restarts(host: str) -> tuple[str, int]:
    """The unit's MainPID and NRestarts, in one SSH call (each takes about 2 s here)."""
    out = ssh(host, f"systemctl show -p MainPID -p NRestarts {UNIT}").stdout
    props = dict(line.partition("=")[::2] for line in out.splitlines())
    return props["MainPID"], int(props["NRestarts"])


def key() -> str:
    return KEY_FILE.read_text().strip()


def listed() -> list[dict[str, Any]]:
    """The router's workers as it lists them (draining ones too)."""
    answer = httpx.get(f"{ROUTER}/workers", timeout=10, headers={
        "Authorization": f"Bearer {ADMIN_KEY_FILE.read_text().strip()}"})
    answer.raise_for_status()
    found: list[dict[str, Any]] = answer.json()["workers"]
    return found


def workers() -> dict[str, bool]:
    """The router's workers by URL (healthy or not), without those smg lists as draining."""
    return {w["url"]: w["is_healthy"] for w in listed() if w.get("status") != "draining"}


def chat(base: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key()}"},
                      # past the simulator's 32 reasoning tokens, into the answer
                      json={"model": MODEL, "max_tokens": 96,
                            "messages": [{"role": "user", "content": "What is 2+2?"}]})


def starts_since(host: str, since: float) -> int:
    """How many times sglang.service started since ``since`` (epoch seconds)."""
    out = ssh(host, f"journalctl -u {UNIT} --since @{since:.0f} -o cat --no-pager "
                    f"| grep -c '^Started {UNIT}' || true").stdout
    return int(out.strip() or 0)


@pytest.fixture(scope="module")
def group(lab: None) -> str:
    """Both groups deployed and gated, then the router in front: the deploy's output."""
    code, out = deploy()
    assert code == 0, out[-6000:]
    code, routed = pyinfra("deploys/router.py")
    assert code == 0, routed[-4000:]
    return out


def test_each_group_passes_its_gate_and_the_router_holds_the_rank_0s_alone(group: str) -> None:
    out = group
    for name, (rank0, rank1) in GROUPS.items():
        # rank 1 by its journal's start line, on its own address and port
        # (the start line as the journal has it, after the server's own time prefix)
        assert re.search(rf"\[{rank1}\] {UNIT}: .*Dummy health check server started in "
                         rf"background thread at {re.escape(address(rank1))}:30000", out), \
            out[-6000:]
        # rank 0 by the full gate, once rank 1 was seen started
        assert f"[{rank0}] health: /health_generate 200" in out
        assert re.search(rf"\[{rank0}\] smoke: '4\..*', TTFT \d+ ms", out), out[-4000:]
        assert re.search(rf"\[{rank1}\] health:", out) is None  # its HTTP is never evidence
        for rank, host in enumerate((rank0, rank1)):
            # one SSH call a host (each takes about 2 s here): its launch, then its processes
            argv, _, processes = ssh(host, f"systemctl show -p ExecStart --value {UNIT}; "
                                           "echo '-- processes'; ps -u sglang -o args="
                                     ).stdout.partition("-- processes")
            # each group meets at its own rank 0
            assert re.search(r"--tp-size 16 .*--nnodes 2|--nnodes 2 .*--tp-size 16", argv), argv
            assert f"--node-rank {rank} " in argv, argv
            assert re.search(rf"--dist-init-addr {re.escape(address(rank0))}:{DIST_PORT[name]}\b",
                             argv), argv
            # 16 TP ranks, 8 on each host
            titles = [line.split()[0] for line in processes.splitlines()
                      if line.startswith("sglang::scheduler")]
            assert sorted(titles) == sorted(f"sglang::scheduler_TP{8 * rank + k}"
                                            for k in range(8)), (host, titles)
        # rank 1 answers no API (SGLang's dummy health server): never a worker
        dummy = httpx.get(f"{url(rank1, 30000)}/v1/models", timeout=10)
        assert dummy.status_code == 404 and dummy.json() == {"detail": "Not Found"}
        answered = chat(url(rank0, 30000))
        assert answered.status_code == 200, answered.text

    assert workers() == WORKERS
    answered = chat(ROUTER)
    assert answered.status_code == 200, answered.text
    assert "4" in answered.json()["choices"][0]["message"]["content"], answered.text


def test_a_groups_rendezvous_answers_its_members_alone(group: str) -> None:
    """torch's store (SGLang's rendezvous) listens on every address and checks nothing: the
    unit's allow-list let every allowed network and every local user in (issue 44). Now its
    port answers the members' service user alone."""
    rank0, rank1 = GROUPS["lab-tp16"]
    port = DIST_PORT["lab-tp16"]
    assert connects(rank1, address(rank0), port, user="sglang") == "open"
    # another host (a member of the other group), from its own address: its service user,
    # whom the other group's rules let through (the lab's hosts share one network, so rank 0's
    # output rule sees lab3's processes too, and would reset any other user's connection)
    assert connects("lab3", address(rank0), port, user="sglang",
                    source=address("lab3")) == "dropped"
    # a person on rank 0's own host, over loopback and over the host's address
    ssh(rank0, "id visitor >/dev/null 2>&1 || useradd -m -s /bin/bash visitor")
    assert connects(rank0, "127.0.0.1", port, user="visitor") == "refused"
    assert connects(rank0, address(rank0), port, user="visitor") == "refused"
    table = ssh(rank0, "nft list tables").stdout
    assert f"table inet sglang_fleet_sglang_{address(rank0).replace('.', '_')}" in table, table


def test_a_killed_rank_1_restarts_its_group_alone(group: str) -> None:
    """kill -9 of lab4's server (rank 1 of lab-tp16-b): systemd restarts it (RestartSec), lab3
    loses its peer (gloo's closed connection, at once while idle), crashes and is restarted
    too; they meet again at the rendezvous and the router takes lab3 back by its health
    checks. The other group is not touched and stays healthy in the router all along."""
    hit, other = GROUPS["lab-tp16-b"], GROUPS["lab-tp16"]
    before = {h: pid_and_restarts(h) for h in HOSTS}

    def restarted(host: str) -> bool:
        pid, restarts = pid_and_restarts(host)
        return pid not in ("0", before[host][0]) and restarts > before[host][1]

    tic = time.monotonic()
    assert ssh(hit[1], f"kill -9 {before[hit[1]][0]}").returncode == 0
    recovered = None
    while time.monotonic() - tic < RECOVERY_BOUND + 60:
        now = workers()
        assert now.get(RANK0["lab-tp16"]), now  # the other group serves on
        try:  # serving (over HTTP, cheap) first, then whether it is the restarted group
            answers = now.get(RANK0["lab-tp16-b"]) and \
                chat(RANK0["lab-tp16-b"]).status_code == 200
        except httpx.HTTPError:
            answers = False
        if answers and all(restarted(h) for h in hit):
            recovered = time.monotonic() - tic
            break
        time.sleep(1)
    print(f"rank 1 killed: its group served in the router again after "
          f"{recovered if recovered is None else round(recovered, 1)} s")
    assert recovered is not None and recovered <= RECOVERY_BOUND, recovered
    for host in hit:  # each restarted once, by systemd
        assert pid_and_restarts(host)[1] == before[host][1] + 1, host
    for host in other:  # the other group never restarted
        assert pid_and_restarts(host) == before[host], host
    rank0 = ssh(hit[0], f"journalctl -u {UNIT} -n 400 -o cat --no-pager").stdout
    assert "Connection closed by peer" in rank0  # rank 0 lost its peer, not a stop
    assert "Dummy health check server started" in ssh(
        hit[1], f"journalctl _SYSTEMD_INVOCATION_ID=$(systemctl show -p InvocationID --value "
                f"{UNIT}) -o cat").stdout
    assert workers() == WORKERS
    assert chat(ROUTER).status_code == 200


class Sampler(Background):
    """The router's worker list every ``every`` seconds, in a thread, until stopped: each
    sample (wall clock, the listed workers) or the error reading it."""

    def __init__(self, every: float = 0.5) -> None:
        super().__init__()
        self.every = every
        self.samples: list[tuple[float, list[dict[str, Any]]]] = []
        self.errors: list[str] = []

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.samples.append((time.time(), listed()))
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}")
            self.stopping.wait(self.every)


def serving(sample: list[dict[str, Any]]) -> set[str]:
    """The URLs a sample shows healthy and taking requests (not draining)."""
    return {w["url"] for w in sample if w.get("is_healthy") and w.get("status") != "draining"}


def test_a_roll_of_two_groups_under_load_fails_no_request(group: str) -> None:
    """Each group is one unit of the roll (out of the router together: its rank 0's URL), one
    group a batch: lab-tp16 serves while lab-tp16-b restarts, and the other way round. The
    router's workers, sampled all along: never a rank >= 1, never both groups out."""
    since = time.time()
    with Sampler() as sampler, Load(ROUTER, key(), MODEL, rate=10) as load:
        time.sleep(2)
        rolled = run("sglang-fleet", "roll", INVENTORY, "--data",
                     "sglang.memory.max_running_requests=40", timeout=900)
        time.sleep(2)
    out = rolled.stdout + rolled.stderr
    print("\n".join(line for line in out.splitlines() if " order: " in line))
    print(out[-3500:])
    print(f"roll: {load.sent} requests in {load.seconds:.0f} s, {load.failed} failed")
    shown = None
    for when, sample in sampler.samples:  # the router's changes, as sampled
        now = sorted((w["url"], w.get("is_healthy"), w.get("status")) for w in sample)
        if now != shown:
            print(f"router {time.strftime('%H:%M:%S', time.localtime(when))}: {now}")
            shown = now
    print(f"router: {len(sampler.samples)} samples, {len(sampler.errors)} errors")
    assert rolled.returncode == 0, out[-6000:]
    assert "order: lab1 → lab2 → lab3 → lab4 (2 batches)" in out, out[:2000]
    for host in HOSTS:
        assert re.search(rf"^{host}\s+converged", out, re.M), out[-3000:]
        assert starts_since(host, since) == 1, host  # each group restarted once, whole
    assert load.failed == 0, load.errors[:5]
    assert load.sent / load.seconds >= 8

    assert sampler.errors == [], sampler.errors[:5]
    times = [when for when, _ in sampler.samples]
    assert max(b - a for a, b in pairwise(times)) < 5, "a gap in sampling"
    ranked = [(when, w["url"]) for when, sample in sampler.samples for w in sample
              if w["url"] in RANK1]
    assert ranked == [], ranked[:5]  # a rank >= 1 never in the router, not even draining
    empty = [when for when, sample in sampler.samples if not serving(sample) & set(WORKERS)]
    assert empty == [], f"no group served at {len(empty)} samples, the first at {empty[:1]}"
    for rank0 in WORKERS:  # each group did leave the router at its turn (the samples saw it)
        assert any(rank0 not in serving(sample) for _, sample in sampler.samples), rank0

    assert workers() == WORKERS
    for rank0 in WORKERS:
        info = httpx.get(f"{rank0}/server_info", timeout=10,
                         headers={"Authorization": f"Bearer {key()}"}).json()
        assert info["max_running_requests"] == 40, rank0


def trouble(out: str) -> str:
    """A run's errors and failures, for an assertion's message (its end is a summary table)."""
    return "\n".join(line for line in out.splitlines()
                     if re.search(r"rror|failed|exception", line))[-6000:]


def held_back(host: str, on: bool) -> None:
    """``host``'s sglang.service made to fail before its server starts (or no longer)."""
    if on:
        body = "[Service]\\nExecStartPre=/bin/sh -c 'echo held back by the test >&2; exit 1'"
        ssh(host, f"mkdir -p {HELD_BACK.rsplit('/', 1)[0]} && printf \"{body}\\n\" > "
                  f"{HELD_BACK} && systemctl daemon-reload")
    else:
        ssh(host, f"rm -f {HELD_BACK} && systemctl daemon-reload")


def test_a_rank_that_never_starts_fails_the_gate_by_name(group: str) -> None:
    """A change restarts both groups; lab2's start fails (its server never runs): the gate
    fails naming lab2, rank 1 of lab-tp16, and the deploy fails, while lab-tp16-b passes its
    gate. Without the fault the next deploy serves."""
    held_back("lab2", True)
    try:
        tic = time.monotonic()
        # rank 0's rendezvous gives up after 20 s here, not the inventory's 60 (the restore
        # of the last good release, lab2 still held back, waits those 60 s)
        code, out = deploy("sglang.memory.max_running_requests=24",
                           "sglang.parallel.dist_timeout=20", "startup_budget_seconds=120")
        print(f"a rank that never started: the deploy failed after "
              f"{time.monotonic() - tic:.0f} s")
    finally:
        held_back("lab2", False)
    assert code != 0, out[-6000:]
    assert re.search(r"\[lab1\] .*lab2 \(rank 1 of group lab-tp16\)", out), trouble(out)
    # the other group restarted and passed its gate: only lab-tp16's hosts failed
    assert re.search(r"\[lab3\] soak: .* all answered", out), trouble(out)
    failed = re.search(r"^--> \d+ hosts? failed: (.*)$", out, re.M)
    assert failed and sorted(re.findall(r"(?:^|\), )(lab\d) \(", failed[1])) == ["lab1", "lab2"], \
        trouble(out)
    code, out = deploy()
    assert code == 0, out[-6000:]
    assert re.search(rf"\[lab2\] {UNIT}: .*Dummy health check server started", out)
    deadline = time.monotonic() + 60
    while workers() != WORKERS and time.monotonic() < deadline:
        time.sleep(2)
    assert workers() == WORKERS
    assert chat(ROUTER).status_code == 200


DOWN = re.compile(r"^Stopping |: (Deactivated successfully|Main process exited|Failed with)")


def after_teardown(host: str, since: float) -> tuple[list[dict[str, Any]], str]:
    """sglang.service's journal since ``since`` (epoch seconds; journald's JSON entries), and
    the sglang units systemd still knows (but those it names "not-found inactive": a removed
    unit, until systemd forgets it) and the host's nftables tables left: one SSH call."""
    table = f"sglang_fleet_sglang_{address(host).replace('.', '_')}"
    out = ssh(host, f"journalctl -u {UNIT} --since @{since:.0f} -o json --no-pager; "
                    "echo '-- units'; systemctl list-unit-files --no-legend 'sglang*'; "
                    "systemctl list-units --all --no-legend 'sglang*' "
                    f"| grep -v 'not-found inactive'; nft list tables | grep -w {table}; "
                    "ls /etc/sglang/*.nft 2>/dev/null").stdout
    journal, _, units = out.partition("-- units")
    return [json.loads(line) for line in journal.splitlines() if line.strip()], units


def went_down_at(journal: list[dict[str, Any]]) -> float | None:
    """When sglang.service began to go down (journald's time of the first stop job or exit of
    its unit, epoch seconds): a stop asked for, or its own end. None: it never did."""
    for entry in journal:
        if isinstance(entry.get("MESSAGE"), str) and DOWN.search(entry["MESSAGE"]):
            return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    return None


def test_teardown_stops_rank_0_first_in_each_group_and_leaves_no_unit(group: str) -> None:
    since = time.time()
    code, out = pyinfra("deploys/teardown.py")
    assert code == 0, out[-6000:]
    seen = {host: after_teardown(host, since) for host in HOSTS}
    for name, (rank0, rank1) in GROUPS.items():
        # rank 0 first: its drained stop ends rank 1 with SGLang's ShutdownReq (exit 0), not a
        # lost peer
        first, then = went_down_at(seen[rank0][0]), went_down_at(seen[rank1][0])
        assert first is not None and then is not None and first <= then, (name, first, then)
        assert re.search(rf"{rank0} \(rank 0 of group {name}\): stopping sglang\.service",
                         out), out[-4000:]
        journal = "\n".join(str(e.get("MESSAGE")) for e in seen[rank1][0])
        assert "terminated with 0" in journal and "Connection closed by peer" not in journal, \
            (rank1, journal)
    for host in HOSTS:  # no unit file, nothing running
        assert seen[host][1].strip() == "", (host, seen[host][1])
