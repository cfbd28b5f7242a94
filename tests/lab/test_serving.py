"""deploys/sglang.py on two fresh lab hosts: the whole converge, gated, idempotent, restarting
only on change, refusing bad input before touching a host, and rolling back a failed start."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator

import pytest

from sglang_fleet.config import releases
from sglang_fleet.config.render import staging_dir
from sglang_fleet.ops.host_programs import program
from sglang_fleet_lab.site import MODEL_PREFIX
from sglang_fleet_lab.state import S3_BUCKET
from tests.lab.conftest import KEY_FILE, booted_lab, compile_seconds, pyinfra, ssh, url

pytestmark = pytest.mark.lab
HOSTS = ("lab1", "lab2")
GPUS = 4  # a server on each (instances: auto); two of tp 2 fit too
# Where the lab model (inventories/group_data/lab.py) is staged: its name carries a digest.
LAB_MODEL = staging_dir(f"s3://{S3_BUCKET}/{MODEL_PREFIX}")


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "2", "--gpus", str(GPUS))


def deploy(*data: str, limit: str | None = None) -> tuple[int, str]:
    args = [a for d in data for a in ("--data", d)] + (["--limit", limit] if limit else [])
    result = pyinfra("deploys/sglang.py", *args)
    return result.returncode, result.stdout + result.stderr


def main_pid(host: str) -> str:
    return ssh(host, "systemctl show -p MainPID --value sglang-0.service").stdout.strip()


def server_info(host: str) -> dict[str, object]:
    env = ssh(host, "sed -n 's/^SGLANG_API_KEY=//p' /etc/sglang/sglang-0.env").stdout
    key = env.strip().strip("'\"")
    out = ssh(host, f"curl -s -H 'Authorization: Bearer {key}' "
                    f"{url(host, 30000)}/server_info").stdout
    info: dict[str, object] = json.loads(out)
    return info


def changed_ops(out: str) -> int:
    total = next(line for line in out.splitlines() if "Grand total" in line).split()
    return 0 if total[3] == "-" else int(total[3])


def test_fresh_hosts_converge_and_pass_the_gate(lab: None) -> None:
    code, out = deploy()
    assert code == 0, out[-5000:]
    assert f"Gate | Gate checks of {GPUS} servers at once" in out  # one operation for all
    for host in HOSTS:
        for unit in (f"sglang-{k}.service" for k in range(GPUS)):  # each one's lines named
            line = rf"\[{host}\] {re.escape(unit)}: "
            assert re.search(rf"{line}health: /health_generate 200", out)
            assert re.search(rf"{line}arguments: SGLang 0\.5\.23, EAGLE, model "
                             rf"{re.escape(LAB_MODEL)}: as rendered", out)
            assert re.search(rf"{line}smoke: '4\..*', TTFT \d+ ms, \d+ tok/s, accept length "
                             r"\d\.\d\d", out)
            assert re.search(rf"{line}capacity: KV tokens \d+, mamba slots \d+ .*max running "
                             r"requests \d+, GPU memory free", out)
            assert re.search(rf"{line}advice: max running requests", out)
            assert re.search(rf"{line}soak: \d+ concurrent requests, all answered in [\d.]+ "
                             rf"s; {re.escape(unit)} still serving; \d+ output tokens, [\d,]+ "
                             r"tok/s", out)
        every = f"{GPUS} of {GPUS} servers"
        assert re.search(rf"\[{host}\] host: \d+ running requests on {every}", out)
        assert re.search(rf"\[{host}\] host: [\d,]+ output tok/s, the sum of {every}' "
                         r"measured throughput \(from this run's gate soaks at ", out)
        kept = json.loads(ssh(host, "cat /var/lib/sglang-fleet/gate/sglang-0.json").stdout)
        assert kept["unit"] == "sglang-0.service" and kept["running"] > 0
        assert kept["invocation"] == ssh(host, "systemctl show -p InvocationID --value "
                                               "sglang-0.service").stdout.strip()
        ready_in_parts(host, out)
    staged = ssh("lab1", f"ls {LAB_MODEL}").stdout.split()
    assert "config.json" in staged and len([f for f in staged if f.endswith(".safetensors")]) == 4


def ready_in_parts(host: str, out: str) -> None:
    """The gate's time to ready, from the journal: the simulator loads its weights in 2 s
    (SGLANG_SIM_LOAD_SECONDS) and captures three graphs of 0.5 s (target verify, draft decode,
    draft extend); the same parts in the gate's JSON (its GATE line, run again on the host)."""
    found = re.search(rf"\[{host}\] sglang-0\.service: ready in (\d+\.\d) s: "
                      r"start→weights (\d+\.\d) s, →KV\+mamba (\d+\.\d) s, "
                      r"→graphs (\d+\.\d) s, →ready (\d+\.\d) s, →first generation (\d+\.\d) s",
                      out)
    assert found, out[-3000:]
    # →first generation (last) is the gate's smoke, after the deploy's steps between start and
    # gate and the gate's own first checks: the machine's load, not a bound (a loaded run: 32.1 s)
    total, weights, kv, graphs, ready, first = (float(x) for x in found.groups())
    assert weights >= 2.0 and graphs >= 1.5
    assert abs(total - (weights + kv + graphs + ready)) <= 0.3  # five roundings to 0.1 s
    model = server_info(host)["served_model_name"]
    check = ssh(host, shlex.join(program(
        "python3", "sglang_fleet.stages.gate.host.check_server", "--unit", "sglang-0.service",
        "--url",
        url(host, 30000), "--env-file", "/etc/sglang/sglang-0.env",
        "--model", str(model), "--soak-requests", "0")))
    gate = json.loads(next(line[5:] for line in check.stdout.splitlines()
                           if line.startswith("GATE ")))
    parts = {p["part"]: p["seconds"] for p in gate["time_to_ready"]["parts"]}
    assert gate["time_to_ready"]["seconds"] == pytest.approx(total, abs=0.06)
    assert parts["weights"] == pytest.approx(weights, abs=0.06)
    assert parts["first_generation"] == pytest.approx(first, abs=0.06)  # the first gate's


def test_second_run_changes_nothing(lab: None) -> None:
    pids = {h: main_pid(h) for h in HOSTS}
    code, out = deploy()
    assert code == 0, out[-3000:]
    assert changed_ops(out) == 0, out[-3000:]
    assert {h: main_pid(h) for h in HOSTS} == pids


def test_one_profile_change_restarts_each_server_once(lab: None) -> None:
    pids = {h: main_pid(h) for h in HOSTS}
    before = {h: ssh(h, "journalctl -u sglang-0 -o cat | grep -c 'fired up'").stdout.strip()
              for h in HOSTS}
    code, out = deploy("sglang.memory.max_running_requests=16")
    assert code == 0, out[-3000:]
    for host in HOSTS:
        assert main_pid(host) != pids[host]
        fired = ssh(host, "journalctl -u sglang-0 -o cat | grep -c 'fired up'").stdout.strip()
        assert int(fired) == int(before[host]) + 1  # exactly one restart
        assert server_info(host)["max_running_requests"] == 16
        for unit in (f"sglang-{k}.service" for k in range(GPUS)):  # gated again, each
            assert f"[{host}] {unit}: arguments: SGLang 0.5.23, EAGLE" in out, out[-3000:]


def test_bad_input_fails_in_preflight_and_changes_nothing(lab: None) -> None:
    pids = {h: main_pid(h) for h in HOSTS}
    for data in ("sglang.extra_args=[\"--cuda-graph-max-bs\", \"8\"]",
                 "sglang.mamba.strategy=no_buffer"):
        code, out = deploy("sglang.memory.max_running_requests=16", data)
        assert code == 1, out[-2000:]
        assert "Starting operation" not in out and "Traceback" not in out
    assert "--cuda-graph-max-bs" in out or "no_buffer" in out
    assert {h: main_pid(h) for h in HOSTS} == pids


def test_failed_start_is_shown_and_the_previous_release_keeps_serving(lab: None) -> None:
    code, out = deploy("sglang.memory.max_running_requests=16",
                       "sglang.env.SGLANG_SIM_FAIL_STARTUP=simulated startup failure",
                       limit="lab1")
    assert code != 0
    # "failed to start" is said on seeing the unit down, where running out the startup budget
    # says "not healthy within"; loading runs in SGLang's scheduler, so its exception is the cause
    assert "[lab1] sglang-0.service: error: sglang-0.service failed to start: Scheduler hit an " \
           "exception: RuntimeError: simulated startup failure" in out, out[-3000:]
    assert "the last good release serves again" in out
    assert server_info("lab1")["max_running_requests"] == 16
    assert "SGLANG_SIM_FAIL_STARTUP" not in ssh("lab1", "cat /etc/sglang/sglang-0.env").stdout


def test_api_key_is_enforced_and_never_shown(lab: None) -> None:
    key = KEY_FILE.read_text().strip()
    models = f"{url('lab1', 30000)}/v1/models"
    assert ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' {models}").stdout == "401"
    assert ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer "
                       f"{key}' {models}").stdout == "200"
    unit = ssh("lab1", "systemctl cat sglang-0.service").stdout
    assert key not in unit and "--api-key" not in unit
    assert "-m sglang_fleet.remote.start_server " in unit
    assert ssh("lab1", "stat -c '%U %a' /etc/sglang/sglang-0.env").stdout.strip() == "root 600"
    code, out = deploy("sglang.memory.max_running_requests=16")
    assert code == 0 and key not in out
    security = ssh("lab1", "systemd-analyze security sglang-0.service --no-pager").stdout
    found = re.search(r"exposure level for sglang-0\.service: ([\d.]+)", security)
    assert found and float(found.group(1)) <= 3.0, security[-500:]


def test_every_gpu_serves_and_a_number_of_instances_retires_the_rest(lab: None) -> None:
    # The shipped profile's instances: auto: a server on each of the host's GPUs.
    units = ssh("lab2", "ls /etc/systemd/system/ | grep '^sglang-[0-9]*.service$'").stdout.split()
    assert sorted(units) == sorted(f"sglang-{i}.service" for i in range(GPUS))
    for i in (0, GPUS - 1):
        visible = ssh("lab2", f"cat /proc/$(systemctl show -p MainPID --value sglang-{i}.service)"
                              "/environ | tr '\\0' '\\n' | grep CUDA_VISIBLE_DEVICES").stdout
        assert visible.strip() == f"CUDA_VISIBLE_DEVICES={i}"
    code, out = deploy("sglang.parallel.instances=2", "sglang.parallel.tp=2", limit="lab2")
    assert code == 0, out[-4000:]
    for unit in ("sglang-0.service", "sglang-1.service"):
        assert f"Gate {unit}" in out
        assert ssh("lab2", f"systemctl is-active {unit}").stdout.strip() == "active"
    assert ssh("lab2", "ls /etc/systemd/system/ | grep -c '^sglang-'").stdout.strip() == "2"
    visible = ssh("lab2", "cat /proc/$(systemctl show -p MainPID --value sglang-1.service)"
                          "/environ | tr '\\0' '\\n' | grep CUDA_VISIBLE_DEVICES").stdout
    assert visible.strip() == "CUDA_VISIBLE_DEVICES=2,3"
    code, out = deploy(limit="lab2")  # back to auto: a server per GPU
    assert code == 0, out[-4000:]
    assert ssh("lab2", "ls /etc/systemd/system/ | grep -c '^sglang-'").stdout.strip() == str(GPUS)
    assert ssh("lab2", f"systemctl is-active sglang-{GPUS - 1}.service").stdout.strip() == "active"


def test_smoke_deploy_changes_nothing(lab: None) -> None:
    result = pyinfra("deploys/smoke.py")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    for host in HOSTS:
        assert re.search(rf"\[{host}\] sglang-0\.service: smoke: '4\..*', TTFT \d+ ms", out)
    assert changed_ops(out) == 0


def test_a_new_release_compiles_once_on_a_host_whose_every_gpu_serves(lab: None) -> None:
    """A release whose cold DeepGEMM compile costs 8 s, onto a host whose every GPU serves:
    no spare GPU to warm on, so the first server restarts alone and compiles, and the others
    after it start from the cache it wrote."""
    other = releases.supported()[-2]  # the lab's wheelhouse holds it beside the pinned one
    jit = "sglang.env.SGLANG_SIM_JIT_SECONDS=\"8\""
    code, out = deploy(jit, limit="lab1")  # the pinned release, now with DeepGEMM kernels
    assert code == 0, out[-4000:]
    pid, since = main_pid("lab1"), time.time()
    code, out = deploy(jit, f"sglang.engine.version={other}", limit="lab1")
    assert code == 0, out[-4000:]
    assert "[lab1] warm-up skipped: no GPUs beside the servers'" in out, out[-4000:]
    ready = [float(s) for s in
             re.findall(r"\[lab1\] sglang-\d\.service: ready in ([\d.]+) s", out)]
    assert len(ready) == GPUS and ready[0] >= 8, out[-4000:]  # sglang-0 compiled
    passes = {i: compile_seconds("lab1", f"sglang-{i}", since) for i in range(GPUS)}
    assert passes[0] and sum(passes[0]) >= 8 - 2, passes  # whole seconds, one per shape
    assert all(p and max(p) <= 1 for i, p in passes.items() if i), passes  # found its kernels
    assert main_pid("lab1") != pid and server_info("lab1")["version"] == other
    code, out = deploy(limit="lab1")  # back to the pinned release for what follows
    assert code == 0, out[-4000:]


def test_a_warm_up_runs_sandboxed_with_one_off_keys_on_a_spare_gpu(lab: None) -> None:
    """Two servers on four GPUs: a flag change warms on GPU 2 first, in the service's sandbox
    (systemd takes every property), with keys from a root-only file removed after it: a full
    start asks its server with the client key, a precompile runs with the admin key alone."""
    code, out = deploy("sglang.parallel.instances=2", limit="lab2")
    assert code == 0, out[-4000:]
    for mode, running in (("full", 16), ("compile", 24)):
        code, out = deploy("sglang.parallel.instances=2", f"sglang.warmup={mode}",
                           f"sglang.memory.max_running_requests={running}", limit="lab2")
        assert code == 0, out[-4000:]
        assert f"[lab2] warm-up ({mode}) of " in out and "on GPU 2, port 31000" in out, \
            out[-4000:]
        assert re.search(r"\[lab2\] warm-up .*: [\d.]+ s while sglang-0\.service served", out), \
            out[-4000:]
        assert ssh("lab2", "ls /etc/sglang/ | grep -c warmup || true").stdout.strip() == "0"
    code, out = deploy(limit="lab2")  # back to auto: a server per GPU
    assert code == 0, out[-4000:]
