"""The host program download_model against a real S3 implementation (moto's server): one line per
failure (what, which object, the endpoint), exit 1, no traceback; a cut download resumes; object
and file names that would reach outside the model's directory are refused before anything is
written."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from sglang_fleet.stages.weights.host import download_model
from tests.conftest import free_port

DOWNLOADER = "sglang_fleet.stages.weights.host.download_model"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lab", "AWS_SECRET_ACCESS_KEY": "lab-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}
SHARDS = 6
SHARD_BYTES = 24 << 20


def moto_server(port: int, seed: bool = True) -> subprocess.Popen[bytes]:
    """moto's S3 server in its own process (killing it cuts connections like an outage),
    seeded with a model: a config.json and SHARDS shards (``seed``)."""
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                             "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait(port)
        if seed:
            _seed(port)
    except BaseException:  # a server that could not be seeded must not outlive the test
        proc.kill()
        proc.wait()
        raise
    return proc


def _wait(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def _client(url: str) -> Any:
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="lab", aws_secret_access_key="lab-secret")


def _seed(port: int) -> None:
    client = _client(f"http://127.0.0.1:{port}")
    client.create_bucket(Bucket="models")
    client.put_object(Bucket="models", Key="m/config.json", Body=b'{"model_type": "x"}')
    for i in range(SHARDS):
        client.put_object(Bucket="models", Key=f"m/shard-{i}.bin", Body=bytes([i]) * SHARD_BYTES)


@pytest.fixture
def s3() -> Iterator[tuple[subprocess.Popen[bytes], str, int]]:
    port = free_port()
    server = moto_server(port)
    yield server, f"http://127.0.0.1:{port}", port
    server.kill()
    server.wait()


@pytest.fixture(scope="module")
def empty_s3() -> Iterator[str]:
    """An S3 endpoint with an empty bucket ``evil``: each test puts its own prefix there."""
    port = free_port()
    server = moto_server(port, seed=False)
    url = f"http://127.0.0.1:{port}"
    _client(url).create_bucket(Bucket="evil")
    yield url
    server.kill()
    server.wait()


def stage(url: str, dest: Path, source: str = "s3://models/m") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", DOWNLOADER, source, str(dest),
                             "--endpoint-url", url, "--workers", "4"],
                            env={**os.environ, **CREDENTIALS}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = stage(url, tmp_path / "m")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith(f"error: listing of s3://models/m from {url} failed: "
                          "EndpointConnectionError")
    assert "Traceback" not in out + err


def test_cut_download_says_which_object_and_resumes(
        s3: tuple[subprocess.Popen[bytes], str, int], tmp_path: Path) -> None:
    server, url, port = s3
    dest = tmp_path / "m"
    proc = stage(url, dest)
    progress = dest.with_name("m.partial") / ".sglang-fleet-manifest.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.is_file() and len(json.loads(progress.read_text() or "{}")
                                      .get("files", {})) >= 2:
            break
        time.sleep(0.02)
    server.kill()  # S3 goes away in the middle of the shards
    server.wait()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: download of s3://models/m/shard-") and
                         f" from {url} failed: " in line for line in lines), err
    assert "Traceback" not in err
    finished = json.loads(progress.read_text())["files"]
    kept = {name: (dest.with_name("m.partial") / name).stat().st_mtime_ns for name in finished}

    again = moto_server(port)  # the same objects at the same address
    try:
        proc = stage(url, dest)
        out, err = proc.communicate(timeout=300)
    finally:
        again.kill()
        again.wait()
    assert proc.returncode == 0, err
    assert f"{dest}: staged {SHARDS + 1} files" in out
    for name, mtime in kept.items():  # finished files were not fetched again
        assert (dest / name).stat().st_mtime_ns == mtime
    assert (dest / "shard-5.bin").stat().st_size == SHARD_BYTES


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


# Each key's name under the prefix; {tmp} is the test's directory (an absolute name must land
# there should the check be missing: the tests run as root).
BAD_KEYS = ["../../escaped", "/{tmp}/escaped", "a//b", "./a", "a/../../../escaped", "a\\b",
            "a\x00b", download_model.MANIFEST]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_object_names_outside_the_model_are_refused_before_any_write(
        empty_s3: str, tmp_path: Path, bad: str) -> None:
    name = bad.format(tmp=str(tmp_path).lstrip("/"))
    prefix = f"p{BAD_KEYS.index(bad)}-{tmp_path.name}"
    client = _client(empty_s3)
    client.put_object(Bucket="evil", Key=f"{prefix}/config.json", Body=b'{"model_type": "x"}')
    client.put_object(Bucket="evil", Key=f"{prefix}/{name}", Body=b"* * * * * root id\n")
    dest = tmp_path / "models" / "m"
    proc = stage(empty_s3, dest, f"s3://evil/{prefix}")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    [line] = err.strip().splitlines()
    assert line.startswith(f"error: listing of s3://evil/{prefix} from {empty_s3} failed: "
                           f"refused {name!r}: "), err
    assert "nothing was written" in err and "Traceback" not in err
    assert not (tmp_path / "escaped").exists()
    assert _files_under(tmp_path) == []  # not even config.json: the listing is refused whole
    assert not dest.exists()


def test_a_symlink_in_the_partial_directory_is_not_followed(empty_s3: str,
                                                            tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    partial = tmp_path / "models" / "m.partial"
    partial.mkdir(parents=True)
    (partial / "sub").symlink_to(outside)
    prefix = f"link-{tmp_path.name}"
    client = _client(empty_s3)
    client.put_object(Bucket="evil", Key=f"{prefix}/config.json", Body=b"{}")
    client.put_object(Bucket="evil", Key=f"{prefix}/sub/x", Body=b"x")
    proc = stage(empty_s3, tmp_path / "models" / "m", f"s3://evil/{prefix}")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert f"refused 'sub/x': it resolves outside {partial}" in err, err
    assert list(outside.iterdir()) == []


def test_a_good_listing_stages_and_writes_no_symlinked_file(empty_s3: str,
                                                             tmp_path: Path) -> None:
    prefix = f"good-{tmp_path.name}"
    client = _client(empty_s3)
    client.put_object(Bucket="evil", Key=f"{prefix}/config.json", Body=b"{}")
    client.put_object(Bucket="evil", Key=f"{prefix}/sub/dir/w.bin", Body=b"w" * 1000)
    dest = tmp_path / "models" / "m"
    proc = stage(empty_s3, dest, f"s3://evil/{prefix}")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert (dest / "sub" / "dir" / "w.bin").read_bytes() == b"w" * 1000
    manifest = json.loads((dest / download_model.MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["config.json", "sub/dir/w.bin"]


class FakeHub:
    """huggingface_hub as stage_hf uses it: a repository whose file names are ``names``;
    ``snapshot_download`` writes them under local_dir as the hub would."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.downloads: list[dict[str, Any]] = []
        self.constants = types.SimpleNamespace(ENDPOINT="https://huggingface.co")

    def module(self) -> types.ModuleType:
        hub = types.ModuleType("huggingface_hub")
        siblings = [types.SimpleNamespace(rfilename=n, size=2) for n in self.names]
        info = types.SimpleNamespace(sha="c0ffee", siblings=siblings)
        hub.HfApi = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
            model_info=lambda *args, **kwargs: info)
        hub.constants = self.constants  # type: ignore[attr-defined]
        hub.snapshot_download = self.snapshot_download  # type: ignore[attr-defined]
        return hub

    def snapshot_download(self, **kwargs: Any) -> str:
        self.downloads.append(kwargs)
        for name in self.names:
            path = Path(kwargs["local_dir"]) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"{}")
        return str(kwargs["local_dir"])


@pytest.mark.parametrize("bad", ["../../escaped", "/{tmp}/escaped", "a//b",
                                 download_model.MANIFEST])
def test_hub_file_names_outside_the_model_are_refused_before_any_download(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, bad: str) -> None:
    name = bad.format(tmp=str(tmp_path).lstrip("/"))
    hub = FakeHub(["config.json", name])
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub.module())
    partial = tmp_path / "models" / "m.partial"
    partial.mkdir(parents=True)
    with pytest.raises(download_model.StageError) as err:
        download_model.stage_hf("hf://org/m@main", partial, None)
    assert str(err.value).startswith("error: listing of hf://org/m@main from "
                                     f"https://huggingface.co failed: refused {name!r}: ")
    assert hub.downloads == []
    assert not (tmp_path / "escaped").exists()


def test_hub_downloads_the_commit_whose_names_were_checked(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    hub = FakeHub(["config.json", "sub/w.bin"])
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub.module())
    partial = tmp_path / "m.partial"
    partial.mkdir()
    manifest = download_model.stage_hf("hf://org/m@main", partial, None)
    assert [d["revision"] for d in hub.downloads] == ["c0ffee"]
    assert sorted(manifest["files"]) == ["config.json", "sub/w.bin"]


def _staged_by_hand(directory: Path, source: str, config: bytes) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_bytes(config)
    (directory / download_model.MANIFEST).write_text(json.dumps(
        {"source": source, "files": {"config.json": {"size": len(config), "etag": "x"}}},
        indent=1))


def test_a_directory_holding_another_source_is_staged_again(empty_s3: str,
                                                            tmp_path: Path) -> None:
    """The weights of hf://org/model@v1 in the directory s3://…/v1 is staged into are never
    taken for that source's: the downloader says so and stages the source."""
    prefix = f"again-{tmp_path.name}"
    _client(empty_s3).put_object(Bucket="evil", Key=f"{prefix}/config.json", Body=b'{"new": 1}')
    dest = tmp_path / "models" / "m"
    _staged_by_hand(dest, "hf://org/model@v1", b'{"old": 1}')
    proc = stage(empty_s3, dest, f"s3://evil/{prefix}")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert f"{dest}: holds hf://org/model@v1, not s3://evil/{prefix}: staging again" in out
    assert (dest / "config.json").read_bytes() == b'{"new": 1}'
    assert json.loads((dest / download_model.MANIFEST).read_text())["source"] == \
        f"s3://evil/{prefix}"


def test_an_earlier_directory_of_the_same_source_is_linked_not_downloaded(
        empty_s3: str, tmp_path: Path) -> None:
    prefix = f"reuse-{tmp_path.name}"
    source = f"s3://evil/{prefix}"
    _client(empty_s3).put_object(Bucket="evil", Key=f"{prefix}/config.json", Body=b'{"s3": 1}')
    same, other = tmp_path / "models" / "same", tmp_path / "models" / "other"
    _staged_by_hand(same, source + "/", b'{"same": 1}')
    _staged_by_hand(other, "hf://org/model@v1", b'{"other": 1}')
    dest = tmp_path / "models" / "m"
    run = [sys.executable, "-m", DOWNLOADER, source, str(dest), "--endpoint-url", empty_s3]
    done = subprocess.run([*run, "--reuse", str(same)], env={**os.environ, **CREDENTIALS},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{dest}: linked from {same}" in done.stdout
    assert (dest / "config.json").stat().st_ino == (same / "config.json").stat().st_ino
    assert (same / "config.json").read_bytes() == b'{"same": 1}'  # still whole for a rollback
    other_dest = tmp_path / "models" / "n"
    done = subprocess.run([sys.executable, "-m", DOWNLOADER, source, str(other_dest),
                           "--endpoint-url", empty_s3, "--reuse", str(other)],
                          env={**os.environ, **CREDENTIALS}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (other_dest / "config.json").read_bytes() == b'{"s3": 1}'
