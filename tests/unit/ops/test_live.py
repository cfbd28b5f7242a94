"""Long host work says how far it is while it runs: the downloader's and the warm-up's progress
lines (``remote/progress.py``), and pyinfra printing them as they come (``ops/live.py``),
proven with pyinfra's own command line on the ``@local`` connector: each line must be on the
screen while the command still runs (the command waits until the test has seen it)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.remote.progress import Meter, Reporter, duration, size
from sglang_fleet.stages.warmup.host import warm_caches
from sglang_fleet.stages.weights.host import download_model
from tests.conftest import ROOT, free_port
from tests.unit.stages.weights.test_weights import SHARD_BYTES, SHARDS, FakeHub, s3  # noqa: F401

PROGRESS = re.compile(r"weights: (\S+ \S+) of (\S+ \S+) \((\d+)%\), \S+ \S+/s")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_says_bytes_done_of_the_total_the_rate_and_the_time_left() -> None:
    clock = Clock()
    meter = Meter(total=55_560_000_000, done=5_000_000_000, clock=clock)
    clock.now += 10
    meter.add(4_100_000_000)
    assert meter.line() == ("9.10 GB of 55.56 GB (16%), 410 MB/s, about 1 min 53 s left")
    clock.now += 60  # the rate is the last half minute's: a stall shows
    assert meter.line().endswith(", 0 B/s, stalled")
    meter.add(10**12)  # never above the total (a retried part counted twice)
    assert meter.line().startswith("55.56 GB of 55.56 GB (100%)")
    assert "left" not in meter.line()
    assert (size(999), size(1500), duration(59.6), duration(3600 * 26 + 61)) == \
        ("999 B", "2 kB", "1 min 0 s", "26 h 1 min")


def test_a_measured_meter_reads_its_source_at_each_line() -> None:
    clock, done = Clock(), [0]
    meter = Meter(total=1000, measure=lambda: done[0], clock=clock)
    clock.now += 2
    done[0] = 500
    assert meter.line() == "500 B of 1 kB (50%), 250 B/s, about 2 s left"


def test_the_reporter_speaks_on_a_beat_while_the_work_blocks() -> None:
    said: list[str] = []
    two = threading.Event()

    def emit(line: str) -> None:
        said.append(line)
        if len(said) == 2:
            two.set()

    with Reporter(lambda: f"beat {len(said) + 1}", every=0.05, emit=emit):
        assert two.wait(10), "no progress line while the work ran"
    count = len(said)
    time.sleep(0.2)
    assert said[:2] == ["beat 1", "beat 2"] and len(said) == count  # silent once it ended


def test_every_zero_says_nothing() -> None:
    said: list[str] = []
    with Reporter(lambda: "x", every=0, emit=said.append):
        time.sleep(0.1)
    assert said == []


def waiting_emit(ready: Callable[[str], bool]) -> tuple[list[str], threading.Event,
                                                          Callable[[str], None]]:
    said: list[str] = []
    seen = threading.Event()

    def emit(line: str) -> None:
        said.append(line)
        if ready(line):
            seen.set()

    return said, seen, emit


def test_s3_staging_counts_each_chunk_as_it_arrives(
        s3: tuple[subprocess.Popen[bytes], str, int], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first shard downloaded, the staging goes on only once a progress line has counted
    its bytes: boto3's callbacks reach the meter while the transfer runs."""
    _, url, _ = s3
    for key, value in {"AWS_ACCESS_KEY_ID": "lab", "AWS_SECRET_ACCESS_KEY": "lab-secret",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    said, seen, emit = waiting_emit(
        lambda line: bool((m := PROGRESS.match(line)) and m.group(1) != "0 B"))
    download = download_model._download

    def one_then_wait(*args: Any, **kwargs: Any) -> None:
        download(*args, **kwargs)
        assert seen.wait(20), f"no progress line counted the first file: {said[-3:]}"

    monkeypatch.setattr(download_model, "_download", one_then_wait)
    partial = tmp_path / "m.partial"
    partial.mkdir()
    total = SHARDS * SHARD_BYTES + len(b'{"model_type": "x"}')
    manifest = download_model.stage_s3("s3://models/m", partial, url, 4, every=0.05, emit=emit)
    assert len(manifest["files"]) == SHARDS + 1
    assert said[0] == f"weights: s3://models/m: {SHARDS + 1} files, {size(total)}"
    assert any(PROGRESS.match(line) for line in said[1:]), said


def test_hub_staging_measures_the_directory_while_the_hub_downloads(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """huggingface_hub reports nothing a deploy sees: the bytes under the directory do."""
    hub = FakeHub(["config.json", "w.bin"])
    said, seen, emit = waiting_emit(lambda line: "weights: 2 B of 4 B (50%)" in line)

    def slow_download(**kwargs: Any) -> str:
        local = Path(kwargs["local_dir"])
        (local / "config.json").write_bytes(b"{}")  # the first file, then a pause
        assert seen.wait(20), f"no progress line while the hub downloaded: {said[-3:]}"
        (local / "w.bin").write_bytes(b"{}")
        return str(local)

    module = hub.module()
    module.snapshot_download = slow_download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    partial = tmp_path / "m.partial"
    partial.mkdir()
    download_model.stage_hf("hf://org/m@main", partial, None, every=0.05, emit=emit)
    assert said[0] == "weights: hf://org/m@main at commit c0ffee: 2 files, 4 B"


def test_the_downloader_announces_what_it_stages_then_its_last_line(
        s3: tuple[subprocess.Popen[bytes], str, int], tmp_path: Path) -> None:  # noqa: F811
    _, url, _ = s3
    dest = tmp_path / "m"
    done = subprocess.run([sys.executable, "-m", "sglang_fleet.stages.weights.host.download_model",
                           "s3://models/m", str(dest), "--endpoint-url", url,
                           "--progress-seconds", "0.05"], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": "lab",
                                            "AWS_SECRET_ACCESS_KEY": "lab-secret",
                                            "AWS_DEFAULT_REGION": "us-east-1"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"weights: s3://models/m: {SHARDS + 1} files, ")
    assert lines[-1].startswith(f"{dest}: staged {SHARDS + 1} files")
    assert all(PROGRESS.match(line) for line in lines[1:-1]), lines


# The warm-up: a compile whose progress bar redraws itself with \r, and that finishes only once
# the test has seen its progress in the program's output.
ENTRY = textwrap.dedent('''
    import os, sys, time
    go = os.environ["GO_FILE"]
    print("Compiling DeepGEMM kernels: 1/2", end="\\r", flush=True)
    deadline = time.monotonic() + 20
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("Compiling DeepGEMM kernels: 2/2", flush=True)
    sys.exit(0 if os.path.exists(go) else 5)
''')


def test_the_warm_up_says_its_time_and_the_compiles_last_line_while_it_runs(
        tmp_path: Path) -> None:
    (tmp_path / "entry.py").write_text(ENTRY)
    go = tmp_path / "go"
    argv = [sys.executable, "-m", "sglang_fleet.stages.warmup.host.warm_caches",
            "--mode", "compile",
            "--python", sys.executable, "--module", "entry", "--port", str(free_port()),
            "--timeout", "60", "--progress", "0.1", "--", "--model-path", "/m"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={
        "PYTHONPATH": f"{tmp_path}:{Path(warm_caches.__file__).parents[4]}",
        "GO_FILE": str(go)})
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if re.fullmatch(r"warm-up \(compile\): \d+ s of at most 1 min 0 s; last: Compiling "
                        r"DeepGEMM kernels: 1/2", lines[-1]):
            go.touch()
    assert proc.wait(30) == 0, lines
    assert go.exists(), f"no progress line while the compile ran: {lines}"
    assert lines[-1].startswith('WARMUP {"mode": "compile"') and '"ok": true' in lines[-1]
    assert not any(line.startswith("warm-up: ") for line in lines)  # the child's own: kept


# pyinfra itself, through its command line, on this machine.
DEPLOY = textwrap.dedent('''
    import shlex, sys
    from pyinfra.api.operation import operation
    from sglang_fleet.ops.live import LiveCommand

    GO = {go!r}
    SCRIPT = """
    import os, sys, time
    print("weights: 1 of 2 GB", flush=True)
    deadline = time.monotonic() + float(sys.argv[1])
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = os.path.exists(sys.argv[2])
    print("weights: 2 of 2 GB" if seen else "nobody saw it", flush=True)
    sys.exit(0 if seen else 5)
    """

    def command(wait: float) -> str:
        return shlex.join([sys.executable, "-c", SCRIPT, str(wait), GO])

    @operation()
    def work(live: bool, wait: float, fail: bool = False):
        text = command(wait) + (" && echo 'error: download failed' >&2 && exit 1" if fail else "")
        yield LiveCommand(text) if live else text

    work(name="Stage", live={live}, wait={wait})
    work(name="Fail", live={live}, wait=0, fail=True)
''')


def pyinfra_lines(tmp_path: Path, live: bool, wait: float) -> Iterator[tuple[str, bool]]:
    """Run the deploy with pyinfra's command line on @local; each line it prints, and
    whether the go file existed then."""
    go = tmp_path / "go"
    deploy = tmp_path / f"deploy_{live}.py"
    deploy.write_text(DEPLOY.format(go=str(go), live=live, wait=wait))
    proc = subprocess.Popen([str(Path(sys.executable).with_name("pyinfra")), "-y", "@local",
                             str(deploy)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        yield line.rstrip("\n"), go.exists()
        if "[@local] weights: 1 of 2 GB" in line:
            go.touch()
    proc.wait(60)


def test_pyinfra_shows_a_live_commands_lines_while_it_runs(tmp_path: Path) -> None:
    out = list(pyinfra_lines(tmp_path, live=True, wait=30))
    text = "\n".join(line for line, _ in out)
    assert (tmp_path / "go").exists(), text
    assert ("[@local] weights: 2 of 2 GB", True) in out, text  # the command went on
    # a failure's lines are shown once, as they came, not again at the end
    assert text.count("error: download failed") == 1, text


def test_pyinfra_alone_shows_a_commands_lines_only_at_its_end(tmp_path: Path) -> None:
    """Why LiveCommand: a plain command's line is printed only when the command has ended
    (here only because it failed), too late for the command waiting on it."""
    out = list(pyinfra_lines(tmp_path, live=False, wait=2))
    text = "\n".join(line for line, _ in out)
    assert "nobody saw it" in text, text
    assert text.index("weights: 1 of 2 GB") > text.index("Stage"), text
