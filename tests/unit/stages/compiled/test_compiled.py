"""Compile once per fleet: the digest of what kernels were compiled for (which inputs change it,
which do not), the plan (which hosts share, receive or compile) and the operations that share
and receive, in pyinfra's style (facts in, commands out) with a real roll directory."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from sglang_fleet import ops, paths
from sglang_fleet.config.render import render, render_all
from sglang_fleet.facts.nvidia import Gpu, SmiReport
from sglang_fleet.facts.python import parse_deep_gemm
from sglang_fleet.facts.systemd import UnitState
from sglang_fleet.fleet import roll_directory
from sglang_fleet.fleet.roll_directory import RollDirectory
from sglang_fleet.ops.host_programs import program
from sglang_fleet.stages.compiled import deploy as compiled
from sglang_fleet.stages.compiled import exchange, records
from sglang_fleet.stages.compiled.host import cache_archive
from sglang_fleet.stages.compiled.kernel_caches import CACHES
from sglang_fleet.stages.engine.deploy import Release
from tests.conftest import field_profile
from tests.fakes import Host, commands

PROFILE = field_profile(gpus=1)  # one server: sglang.service
RELEASE = Release("sglang", "0.5.23", (), None, None, "/usr/bin/python3")
OLD = Release("sglang", "0.5.22", (), None, None, "/usr/bin/python3")
DG = "sgl-deep-gemm==0.2.3.post2"


def smi(*caps: str) -> SmiReport:
    return SmiReport(tuple(Gpu(i, "NVIDIA B200", 183359, "580.95.05", cap, True)
                           for i, cap in enumerate(caps)), None)


def inputs(overrides: dict[str, Any] | None = None, release: Release = RELEASE,
           deep_gemm: str = DG, arch: str = "10.0", instance: int = 0) -> records.Inputs:
    launch = render(field_profile(overrides or {}), instance=instance)
    found = records.inputs_for([launch], release, deep_gemm, arch)
    assert isinstance(found, records.Inputs), found
    return found


BASE = inputs().digest


# --- the digest ---------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    {"server.port": 31000},
    {"model.served_name": "another-name"},
    {"parsers.reasoning": "deepseek-r1"},
    {"memory.mem_fraction_static": 0.8, "memory.max_running_requests": 48},
    {"memory.context_length": 131072},
    {"speculative.num_steps": 2, "speculative.num_draft_tokens": 3},
    {"mamba.strategy": "no_buffer", "scheduler.radix_cache": False},
    {"env": {"SGLANG_SIM_JIT_SECONDS": "120", "SGLANG_DG_CACHE_DIR": "/elsewhere"}},
    {"extra_args": ["--cuda-graph-backend-decode", "disabled"]},
    {"extra_args": ["--enable-torch-compile"]},
], ids=str)
def test_what_compiles_no_kernel_leaves_the_digest(overrides: dict[str, Any]) -> None:
    assert inputs(overrides).digest == BASE


def test_servers_of_one_host_share_a_digest() -> None:
    eight = {"parallel.instances": 8}
    assert {inputs(eight, instance=i).digest for i in range(8)} == {inputs(eight).digest}
    assert inputs(eight).digest == BASE  # their ports and GPUs compile nothing


@pytest.mark.parametrize("change", [
    {"release": OLD},
    {"deep_gemm": "sgl-deep-gemm==0.2.4"},
    {"deep_gemm": "none"},
    {"arch": "9.0"},
    {"overrides": {"parallel.tp": 2}},
    {"overrides": {"memory.chunked_prefill_size": 16384}},
    {"overrides": {"scheduler.attention_backend": "triton"}},
    {"overrides": {"speculative.algorithm": None, "speculative.num_steps": None,
                   "speculative.eagle_topk": None, "speculative.num_draft_tokens": None}},
    {"overrides": {"model.source": "hf://Qwen/Qwen3.6-27B@v2"}},
    {"overrides": {"extra_args": ["--quantization", "fp8"]}},
    {"overrides": {"extra_args": ["--kv-cache-dtype", "fp8_e4m3"]}},
    {"overrides": {"env": {"SGLANG_JIT_DEEPGEMM_FAST_WARMUP": "1"}}},
    {"overrides": {"env": {"SGLANG_DG_USE_NVRTC": "1"}}},
    {"overrides": {"env": {"DG_JIT_NVCC_COMPILER": "/usr/local/cuda/bin/nvcc"}}},
], ids=str)
def test_what_changes_the_kernels_changes_the_digest(change: dict[str, Any]) -> None:
    assert inputs(**change).digest != BASE


def test_the_digest_holds_what_it_was_compiled_for() -> None:
    found = inputs().as_dict()
    assert found["release"] == RELEASE.id and found["deep_gemm"] == DG
    assert found["gpu_arch"] == "10.0" and found["env"] == {}
    assert found["flags"]["tp_size"] == 1 and found["flags"]["speculative_algorithm"] == "NEXTN"
    assert "port" not in found["flags"] and "speculative_num_steps" not in found["flags"]
    assert len(BASE) == records.DIGEST_CHARS and int(BASE, 16) >= 0


def test_gpu_architecture_is_nvidia_smi_compute_cap() -> None:
    assert records.gpu_arch(smi(*["10.0"] * 8)) == "10.0"
    assert records.gpu_arch(smi("9.0", "10.0")) == "10.0,9.0"
    assert records.gpu_arch(smi()) is None
    assert records.gpu_arch(smi("10.0; rm -rf /")) is None
    assert records.gpu_arch(SmiReport((), "nvidia-smi is not installed")) is None


def test_deep_gemm_is_what_the_venv_installs() -> None:
    assert parse_deep_gemm(["DEEPGEMM sgl-deep-gemm==0.2.3.post2"]) == DG
    assert parse_deep_gemm(["DEEPGEMM sglang-kernel==0.4.1"]) == "sglang-kernel==0.4.1"
    assert parse_deep_gemm(["DEEPGEMM none"]) == "none"
    assert parse_deep_gemm([]) is None
    assert parse_deep_gemm(["DEEPGEMM $(reboot)"]) is None


def test_unknown_inputs_say_why() -> None:
    launches = render_all(PROFILE)
    assert "did not say which DeepGEMM" in str(records.inputs_for(launches, RELEASE, None,
                                                                  "10.0"))
    assert "compute capability" in str(records.inputs_for(launches, RELEASE, DG, None))


def test_differences_name_each_input_that_differs() -> None:
    ours = inputs(arch="9.0").as_dict()
    theirs = inputs({"parallel.tp": 2}).as_dict()
    assert records.differences(ours, theirs, "h1") == [
        "GPU architecture 9.0 here, 10.0 on h1", "--tp-size 1 here, 2 on h1"]


# --- the plan -------------------------------------------------------------------------------

def shared(found: records.Inputs, host: str = "h1", **more: Any) -> dict[str, Any]:
    return {"digest": found.digest, "inputs": found.as_dict(), "host": host, "files": 40,
            "bytes": 4_000_000, "sha256": "0" * 64, "archive_bytes": 1_000_000, **more}


def test_a_host_receives_only_a_cache_of_its_own_digest_that_it_lacks() -> None:
    mine = inputs()
    offer = shared(mine)
    decision = compiled.decide(mine, False, [offer])
    assert decision.offer == offer and "receives the kernels h1 compiled" in decision.why
    assert compiled.decide(mine, True, [offer]).offer is None  # recorded: has them


def test_a_host_whose_inputs_differ_compiles_and_says_why() -> None:
    decision = compiled.decide(inputs(arch="9.0"), False, [shared(inputs())])
    assert decision.offer is None and decision.mismatch
    assert "no host before it compiled for its inputs (GPU architecture 9.0 here, 10.0 on " \
        "h1)" in decision.why


@pytest.mark.parametrize("offers, said, mismatch", [
    ([], "the first host of the roll with its inputs", False),
    ([shared(inputs(), error="the download failed")], "could not share its cache", True),
    ([shared(inputs(), files=0)], "compiled no DeepGEMM kernel", False),
])
def test_a_host_with_nothing_to_receive_compiles(offers: list[dict[str, Any]], said: str,
                                                 mismatch: bool) -> None:
    decision = compiled.decide(inputs(), False, offers)
    assert decision.offer is None and said in decision.why and decision.mismatch is mismatch


def test_the_first_host_with_a_digest_shares_it_with_hosts_still_to_restart() -> None:
    order = ["h1", "h2", "h3"]
    assert compiled.share_problem("h1", order, BASE, []) is None
    assert "shared the kernels" in str(compiled.share_problem("h2", order, BASE,
                                                              [shared(inputs())]))
    assert compiled.share_problem("h2", order, BASE, [shared(inputs(arch="9.0"))]) is None
    assert "no host of the roll after it" in str(compiled.share_problem("h3", order, BASE, []))
    # --batch 3: the whole roll in one batch, every host past its turn
    assert "no host of the roll after it" in str(compiled.share_problem(
        "h1", order, BASE, [], past=set(order)))
    assert compiled.share_problem("h1", order, BASE, [], past={"h1", "h2"}) is None


def test_a_host_shares_only_what_a_host_after_it_said_it_lacks() -> None:
    order, other = ["h1", "h2", "h3"], inputs(arch="9.0").digest
    has = {"h2": {"digest": BASE, "needs": False}, "h3": {"digest": other, "needs": True}}
    assert "every host after it holds these kernels already or compiles for other inputs" in \
        str(compiled.share_problem("h1", order, BASE, [], wants=has))
    assert compiled.share_problem("h1", order, BASE, [], wants={
        **has, "h3": {"digest": BASE, "needs": True}}) is None
    assert compiled.share_problem("h1", order, BASE, [], wants={"h2": has["h2"]}) is None


def test_one_claim_per_digest(tmp_path: Path) -> None:
    roll_dir = RollDirectory(tmp_path)
    assert exchange.claim(roll_dir, BASE) and not exchange.claim(roll_dir, BASE)
    assert oct((tmp_path / "caches").stat().st_mode & 0o777) == "0o700"


# --- the operations -----------------------------------------------------------------------

class CopyHost(Host):
    """A host whose cache_copy program answers ``answers[subcommand]``, and whose file
    transfers write or record what moved."""

    def __init__(self, name: str, facts: dict[str, Any], answers: dict[str, dict[str, Any]],
                 archive: bytes = b"", **data: Any) -> None:
        super().__init__(facts)
        self.name, self.print_prefix, self.data = name, f"[{name}] ", data
        self.answers, self.archive = answers, archive
        self.ran: list[str] = []
        self.uploaded: list[tuple[str, str]] = []

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        self.ran.append(command)
        words, module = shlex.split(command), records.PROGRAM
        sub = words[words.index(module) + 1] if module in words else None
        lines = [f"CACHECOPY {json.dumps(self.answers[sub])}"] if sub in self.answers else []
        return True, CommandOutput([OutputLine("stdout", line) for line in lines])

    def get_file(self, remote: str, out: IO[bytes], **kwargs: Any) -> bool:
        out.write(self.archive)
        return True

    def put_file(self, local: str, remote: str, **kwargs: Any) -> bool:
        self.uploaded.append((local, remote))
        return True


@pytest.fixture
def roll(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[CopyHost], RollDirectory]:
    """A roll of h1, h2, h3 (this process standing for the roll) and the host it runs on."""
    said: list[str] = []
    monkeypatch.setattr(compiled, "logger", type("L", (), {"warning": said.append,
                                                          "info": said.append})())
    roll_dir = RollDirectory(tmp_path / "roll")
    roll_dir.directory.mkdir(mode=0o700)
    roll_dir.plan({"h1": [], "h2": [], "h3": []}, 600)
    monkeypatch.setenv(roll_directory.ENV, str(roll_dir.directory))

    def install(fake: CopyHost) -> RollDirectory:
        fake.said = said  # type: ignore[attr-defined]
        for module in (compiled, records, ops):
            monkeypatch.setattr(module, "host", fake)
        return roll_dir

    return install


def facts(arch: str = "10.0", recorded: bool = False,
          units: dict[str, UnitState] | None = None) -> dict[str, Any]:
    return {"DeepGemm": DG, "NvidiaSmi": smi(arch), "File": {"mode": 644} if recorded else None,
            "UnitStates": units or {}}


LAUNCHES = render_all(PROFILE)
ARCHIVE = b"an archive's bytes"
PACKED = {"ok": True, "files": 40, "bytes": 4_000_000, "archive_bytes": len(ARCHIVE),
          "sha256": hashlib.sha256(ARCHIVE).hexdigest()}


def test_the_first_host_packs_and_the_controller_keeps_its_archive(roll: Any) -> None:
    fake = CopyHost("h1", facts(), {"pack": PACKED}, ARCHIVE)
    roll_dir = roll(fake)
    outgoing = f"{paths.CACHE_COPY}/{BASE}.tar.gz"
    assert commands(compiled.kernels_shared, LAUNCHES, RELEASE) == [
        f"rm -f {outgoing} {outgoing}.part"]
    pack = shlex.split(fake.ran[0])
    assert pack[:5] == program("/usr/bin/python3", records.PROGRAM)[:5]
    assert pack[5:] == ["pack", "--root", paths.CACHE, "--digest", BASE, "--inputs",
                        json.dumps(inputs().as_dict(), sort_keys=True), "--out", outgoing,
                        "--max-entries", "100000", "--max-gib", "4"]  # host data's defaults
    kept = exchange.archive(roll_dir, BASE)
    assert kept.read_bytes() == ARCHIVE and oct(kept.stat().st_mode & 0o777) == "0o600"
    [offer] = exchange.offers(roll_dir)
    assert offer["host"] == "h1" and offer["sha256"] == PACKED["sha256"]
    assert offer["inputs"] == inputs().as_dict() and offer["files"] == 40
    assert exchange.notes(roll_dir, "h1") == [
        "kernels: shared with the hosts after it: 40 files (4 MB)"]


def test_nothing_is_packed_when_every_later_host_is_past_its_turn(roll: Any) -> None:
    fake = CopyHost("h1", facts(), {"pack": PACKED}, ARCHIVE)
    roll_dir = roll(fake)
    roll_dir.give("took", ["h1", "h2", "h3"])  # one batch of three
    assert commands(compiled.kernels_shared, LAUNCHES, RELEASE) == []
    assert fake.ran == [] and exchange.offers(roll_dir) == []
    assert "no host of the roll after it is still to restart" in fake.noops[0]


@pytest.mark.parametrize("recorded, needs", [(False, True), (True, False)])
def test_a_prepared_host_says_which_kernels_it_needs(roll: Any, recorded: bool,
                                                      needs: bool) -> None:
    fake = CopyHost("h2", facts(recorded=recorded), {})
    roll_dir = roll(fake)
    [say] = commands(compiled.kernels_announced, LAUNCHES, RELEASE)
    assert say.function(None, fake, *say.args, **say.kwargs)
    assert exchange.wants(roll_dir) == {"h2": {"digest": BASE, "needs": needs}}
    assert fake.ran == []


def test_nothing_is_packed_when_the_hosts_after_it_have_the_kernels(roll: Any) -> None:
    fake = CopyHost("h1", facts(), {"pack": PACKED}, ARCHIVE)
    roll_dir = roll(fake)
    for name in ("h2", "h3"):
        exchange.want(roll_dir, name, BASE, needs=False)
    assert commands(compiled.kernels_shared, LAUNCHES, RELEASE) == []
    assert fake.ran == [] and "holds these kernels already" in fake.noops[0]


def test_an_archive_that_arrives_changed_is_not_offered(roll: Any) -> None:
    fake = CopyHost("h1", facts(), {"pack": PACKED}, b"other bytes")
    roll_dir = roll(fake)
    [removed] = commands(compiled.kernels_shared, LAUNCHES, RELEASE)  # the host's archive
    assert removed.startswith(f"rm -f {paths.CACHE_COPY}/{BASE}.tar.gz")
    [offer] = exchange.offers(roll_dir)
    assert "arrived with sha256" in offer["error"] and "sha256" not in offer
    assert not exchange.archive(roll_dir, BASE).exists()
    assert any("could not be shared" in s for s in fake.said)  # type: ignore[attr-defined]


def test_a_later_host_with_the_same_digest_receives_before_its_restart(roll: Any) -> None:
    fake = CopyHost("h2", facts(), {"unpack": {"ok": True, "placed": 40, "kept": 0}})
    roll_dir = roll(fake)
    exchange.archive(roll_dir, BASE).write_bytes(ARCHIVE)
    exchange.offer(roll_dir, shared(inputs(), sha256=PACKED["sha256"]))
    incoming = f"{paths.CACHE_COPY}/{BASE}.tar.gz"
    assert commands(compiled.kernels_received, LAUNCHES, RELEASE) == [f"rm -f {incoming}"]
    assert fake.uploaded == [(str(exchange.archive(roll_dir, BASE)), incoming)]
    unpack = shlex.split(fake.ran[-1])
    assert unpack[5:] == ["unpack", "--root", paths.CACHE, "--digest", BASE, "--sha256",
                          PACKED["sha256"], "--archive", incoming, "--user", paths.USER,
                          "--record", records.record_path(RELEASE, BASE), "--source", "h1",
                          "--max-entries", "100000", "--max-gib", "4"]
    [note] = exchange.notes(roll_dir, "h2")
    assert note.startswith("kernels: received from h1: 40 kernels placed, 0 there already")


def test_each_host_shares_and_accepts_within_its_host_data_bound(roll: Any) -> None:
    packer = CopyHost("h1", facts(), {"pack": PACKED}, ARCHIVE, kernel_share_max_gib=8,
                      kernel_share_max_entries=500)
    roll(packer)
    commands(compiled.kernels_shared, LAUNCHES, RELEASE)
    assert shlex.split(packer.ran[0])[-4:] == ["--max-entries", "500", "--max-gib", "8"]
    fake = CopyHost("h2", facts(), {"unpack": {"ok": True, "placed": 40, "kept": 0}},
                    kernel_share_max_gib=2)
    roll_dir = roll(fake)
    exchange.archive(roll_dir, BASE).write_bytes(ARCHIVE)
    exchange.offer(roll_dir, shared(inputs(), bytes=(2 << 30) + 1))  # more than h2 accepts
    assert commands(compiled.kernels_received, LAUNCHES, RELEASE) == []
    assert fake.uploaded == [] and fake.ran == []
    assert exchange.notes(roll_dir, "h2") == [
        "kernels: compiles itself: the kernels from h1 come to more than 2 GiB (host data "
        "kernel_share_max_gib; raise it to share more)"]


def test_a_host_of_another_architecture_compiles_and_the_roll_says_why(roll: Any) -> None:
    fake = CopyHost("h2", facts(arch="9.0"), {})
    roll_dir = roll(fake)
    exchange.offer(roll_dir, shared(inputs()))
    assert commands(compiled.kernels_received, LAUNCHES, RELEASE) == []
    assert fake.uploaded == [] and fake.ran == []
    [note] = exchange.notes(roll_dir, "h2")
    assert "compiles itself" in note and "GPU architecture 9.0 here, 10.0 on h1" in note
    assert any("GPU architecture 9.0 here" in s for s in fake.said)  # type: ignore[attr-defined]


def test_a_refused_archive_leaves_the_host_to_compile(roll: Any) -> None:
    refused = {"ok": False, "error": "the archive's member '../x' has an empty, '.' or '..' "
               "part: nothing was extracted"}
    fake = CopyHost("h2", facts(), {"unpack": refused})
    roll_dir = roll(fake)
    exchange.archive(roll_dir, BASE).write_bytes(ARCHIVE)
    exchange.offer(roll_dir, shared(inputs()))
    commands(compiled.kernels_received, LAUNCHES, RELEASE)
    [note] = exchange.notes(roll_dir, "h2")
    assert "compiles itself: the kernels from h1 were not unpacked" in note and "'../x'" in note


def running(release: Release) -> dict[str, UnitState]:
    launch = LAUNCHES[0]
    argv = (*program(release.python_bin, "sglang_fleet.remote.start_server"), launch.argv[2],
            *launch.argv[3:])
    return {launch.unit: UnitState(launch.unit, "loaded", "active", "running", "", 42, argv)}


@pytest.mark.parametrize("given, noop", [
    (facts(recorded=True), None),
    (facts(units=running(RELEASE)), "run this release with these flags"),
])
def test_a_host_that_has_the_kernels_receives_nothing(roll: Any, given: dict[str, Any],
                                                      noop: str | None) -> None:
    fake = CopyHost("h2", given, {})
    roll_dir = roll(fake)
    exchange.offer(roll_dir, shared(inputs()))
    assert commands(compiled.kernels_received, LAUNCHES, RELEASE) == []
    assert fake.uploaded == []
    if noop:
        assert noop in fake.noops[0]
    else:
        assert "holds the kernels compiled for" in exchange.notes(roll_dir, "h2")[0]


def test_outside_a_roll_nothing_is_shared_or_received(roll: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = CopyHost("h1", facts(), {"pack": PACKED}, ARCHIVE)
    roll(fake)
    monkeypatch.delenv(roll_directory.ENV)
    assert commands(compiled.kernels_shared, LAUNCHES, RELEASE) == []
    assert commands(compiled.kernels_received, LAUNCHES, RELEASE) == []
    assert fake.ran == [] and fake.uploaded == []


def test_the_gate_passed_records_the_digest_once(roll: Any) -> None:
    fake = CopyHost("h1", facts(), {})
    roll(fake)
    [record] = commands(records.kernels_recorded, LAUNCHES, RELEASE)
    words = shlex.split(record)
    assert words[5:9] == ["record", "--digest", BASE, "--inputs"]
    assert json.loads(words[9]) == inputs().as_dict()
    assert words[10:] == ["--record", f"{paths.COMPILED}/{RELEASE.id}-{BASE}.json"]
    fake.facts["File"] = {"mode": 644}
    assert commands(records.kernels_recorded, LAUNCHES, RELEASE) == []


def test_the_program_copies_the_cache_the_release_points_deep_gemm_at() -> None:
    dg = next(c for c in CACHES if c.variable == "SGLANG_DG_CACHE_DIR")
    assert (f"{dg.subdir}/cache",) == cache_archive.COPIED
