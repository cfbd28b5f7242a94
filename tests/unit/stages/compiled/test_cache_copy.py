"""The host program that packs and unpacks compiled kernels
(``stages/compiled/host/cache_copy.py``), run as
the deploy runs it: a cache the service user could have filled with anything, archives built to
attack the root that unpacks them, and the unpack writing as the service user (``nobody`` here
when the tests run as root, else the user running them)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pwd
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.stages.compiled.host import cache_archive

DIGEST = "0123456789abcdef01234567"
KERNEL = "deep_gemm/cache/kernel.gemm_nt_f8f8bf16.5d41402abc4b2a76"
USER = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
UID = pwd.getpwnam(USER).pw_uid

PROGRAM = "sglang_fleet.stages.compiled.host.cache_copy"


def program(*args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", PROGRAM, *args],
                          capture_output=True, text=True, timeout=60)
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("CACHECOPY ")]
    return proc.returncode, json.loads(line[10:])


def service_dir(path: Path) -> Path:
    """A directory the service user owns (as /var/cache/sglang), below ones it may read (as
    /var/cache, 0755: pytest's own temporary directories are root's, 0700)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, UID, -1)
    for parent in path.parents:
        if parent == Path(tempfile.gettempdir()):
            break
        parent.chmod(parent.stat().st_mode | 0o555)
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A compiled cache as DeepGEMM leaves it, with what the service user might add."""
    root = tmp_path / "src"
    kernel = root / KERNEL
    kernel.mkdir(parents=True)
    (kernel / "kernel.cubin").write_bytes(b"\x7fELF cubin")
    (kernel / "kernel.so").write_bytes(b"\x7fELF so")
    (kernel / "kernel.so").chmod(0o755)
    (root / "deep_gemm/cache/.tmp-3f2a").mkdir()  # a build under way
    (root / "deep_gemm/cache/.tmp-3f2a/half").write_bytes(b"half")
    (root / "deep_gemm/locks").mkdir()
    (root / "deep_gemm/locks/GEMM.lock").write_bytes(b"")
    (kernel / "passwd").symlink_to("/etc/passwd")
    (root / "deep_gemm/cache/kernel.linked").symlink_to("/etc")
    os.mkfifo(kernel / "fifo")
    (root / "triton").mkdir()  # another cache: not copied
    (root / "triton/x").write_bytes(b"x")
    return root


BOUND = ["--max-entries", "100", "--max-gib", "1"]  # host data kernel_share_max_*


def packed(cache: Path, tmp_path: Path, bound: list[str] = BOUND) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "root-only" / f"{DIGEST}.tar.gz"
    return program("pack", "--root", str(cache), "--digest", DIGEST, "--inputs",
                   json.dumps({"gpu_arch": "10.0"}), "--out", str(out), *bound)


def pack(cache: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    code, result = packed(cache, tmp_path)
    assert code == 0, result
    return tmp_path / "root-only" / f"{DIGEST}.tar.gz", result


def unpack(archive: Path, into: Path, sha: str | None = None, digest: str = DIGEST,
           bound: list[str] = BOUND) -> tuple[int, dict[str, Any]]:
    sha = sha or hashlib.sha256(archive.read_bytes()).hexdigest()
    return program("unpack", "--root", str(into), "--digest", digest, "--sha256", sha,
                   "--archive", str(archive), "--user", USER, "--record",
                   str(into.parent / "records" / f"r-{digest}.json"), "--source", "h1", *bound)


def test_pack_takes_finished_kernels_only(cache: Path, tmp_path: Path) -> None:
    out, result = pack(cache, tmp_path)
    with tarfile.open(out) as tar:
        names = {m.name: m for m in tar}
    assert sorted(names) == [cache_archive.MANIFEST, "deep_gemm", "deep_gemm/cache", KERNEL,
                             f"{KERNEL}/kernel.cubin", f"{KERNEL}/kernel.so"]
    assert names[f"{KERNEL}/kernel.so"].mode == 0o755 and \
        names[f"{KERNEL}/kernel.cubin"].mode == 0o644
    assert all(m.uid == 0 and m.uname == "" for m in names.values())
    assert result["files"] == 2 and result["sha256"] == hashlib.sha256(
        out.read_bytes()).hexdigest()
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    assert oct(out.parent.stat().st_mode & 0o777) == "0o700"


def test_pack_follows_no_link_to_the_cache(tmp_path: Path) -> None:
    elsewhere = tmp_path / "secrets" / "deep_gemm" / "cache"
    elsewhere.mkdir(parents=True)
    (elsewhere / "shadow").write_bytes(b"root's")
    root = tmp_path / "src"
    root.mkdir()
    (root / "deep_gemm").symlink_to(elsewhere.parent)
    out, result = pack(root, tmp_path)
    with tarfile.open(out) as tar:
        assert tar.getnames() == [cache_archive.MANIFEST]
    assert result["files"] == 0


def test_unpack_places_kernels_as_the_service_user_and_records(cache: Path,
                                                               tmp_path: Path) -> None:
    out, _ = pack(cache, tmp_path)
    into = service_dir(tmp_path / "dst" / "cache")
    code, result = unpack(out, into)
    assert code == 0 and result == {"ok": True, "placed": 1, "kept": 0}
    got = into / KERNEL
    assert (got / "kernel.cubin").read_bytes() == b"\x7fELF cubin"
    assert oct((got / "kernel.so").stat().st_mode & 0o777) == "0o755"
    owners = {p.stat().st_uid for p in [into / "deep_gemm", got, *got.iterdir()]}
    assert owners == {UID}
    assert sorted(p.name for p in into.iterdir()) == ["deep_gemm"]  # no staging left
    record = json.loads((into.parent / "records" / f"r-{DIGEST}.json").read_text())
    assert record["digest"] == DIGEST and record["source"] == "received from h1"
    assert record["inputs"] == {"gpu_arch": "10.0"}
    code, result = unpack(out, into)  # again: the cache has it
    assert code == 0 and result == {"ok": True, "placed": 0, "kept": 1}


def test_unpack_checks_the_sha256_and_the_digest(cache: Path, tmp_path: Path) -> None:
    out, _ = pack(cache, tmp_path)
    into = service_dir(tmp_path / "dst" / "cache")
    code, result = unpack(out, into, sha="f" * 64)
    assert code == 1 and "sha256 is" in result["error"]
    code, result = unpack(out, into, digest="fedcba9876543210fedcba98")
    assert code == 1 and "manifest is for '0123456789abcdef01234567'" in result["error"]
    assert list(into.iterdir()) == [] and not (into.parent / "records").exists()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x",
           link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    return info, data


MANIFEST = member(cache_archive.MANIFEST, data=json.dumps({"digest": DIGEST}).encode())
GOOD = member(f"{KERNEL}/kernel.cubin")


def hostile(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    out = tmp_path / "hostile.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return out


@pytest.mark.parametrize("bad, said", [
    (member("../../etc/cron.d/x"), "has an empty, '.' or '..' part"),
    (member("deep_gemm/cache/../../../etc/passwd"), "has an empty, '.' or '..' part"),
    (member("/etc/passwd"), "is not a relative name"),
    (member("deep_gemm/cache//x"), "has an empty, '.' or '..' part"),
    (member("deep_gemm/cache/a\\..\\b"), "has a control character or a backslash"),
    (member("deep_gemm/cache/a\nb"), "has a control character"),
    (member(f"{KERNEL}/link", tarfile.SYMTYPE, link="/etc/shadow"), "not a regular file"),
    (member(f"{KERNEL}/hard", tarfile.LNKTYPE, link="/etc/shadow"), "not a regular file"),
    (member(f"{KERNEL}/tty", tarfile.CHRTYPE), "not a regular file"),
    (member(f"{KERNEL}/sda", tarfile.BLKTYPE), "not a regular file"),
    (member(f"{KERNEL}/pipe", tarfile.FIFOTYPE), "not a regular file"),
    (member(f"{KERNEL}/sparse", tarfile.GNUTYPE_SPARSE), "not a regular file"),
    (member("triton/x"), "is outside deep_gemm/cache"),
    (member("deep_gemm/cache", data=b"a file"), "is a file where a directory belongs"),
    (member(f"{KERNEL}/kernel.cubin"), "is in the archive twice"),
], ids=lambda v: v if isinstance(v, str) else v[0].name)
def test_unpack_refuses_a_hostile_member_before_writing_anything(
        tmp_path: Path, bad: tuple[tarfile.TarInfo, bytes], said: str) -> None:
    archive = hostile(tmp_path, MANIFEST, GOOD, bad)
    into = service_dir(tmp_path / "dst" / "cache")
    code, result = unpack(archive, into)
    assert code == 1 and said in result["error"] and "nothing was extracted" in result["error"]
    assert list(into.iterdir()) == []


def test_unpack_refuses_a_file_under_a_file(tmp_path: Path) -> None:
    archive = hostile(tmp_path, MANIFEST, member(KERNEL), member(f"{KERNEL}/kernel.cubin"))
    into = service_dir(tmp_path / "dst" / "cache")
    code, result = unpack(archive, into)
    assert code == 1 and "lies under a file of the archive" in result["error"]


def test_unpack_refuses_an_archive_without_a_manifest(tmp_path: Path) -> None:
    into = service_dir(tmp_path / "dst" / "cache")
    code, result = unpack(hostile(tmp_path, GOOD), into)
    assert code == 1 and "has no MANIFEST.json" in result["error"]


def test_unpack_writes_nothing_through_a_link_the_service_user_made(cache: Path,
                                                                    tmp_path: Path) -> None:
    out, _ = pack(cache, tmp_path)
    into = service_dir(tmp_path / "dst" / "cache")
    target = tmp_path / "etc"
    target.mkdir()
    (into / "deep_gemm").symlink_to(target)
    code, result = unpack(out, into)
    assert code == 1 and f"unpacking as {USER}" in result["error"]
    assert list(target.iterdir()) == []
    assert sorted(p.name for p in into.iterdir()) == ["deep_gemm"]  # the staging is gone


def test_pack_shares_nothing_past_its_bound(cache: Path, tmp_path: Path) -> None:
    """Past the entries, or past the bytes (a sparse file of 1 GiB + 1: refused before a byte
    of it is read), the pack stops and says which host data key bounds it."""
    code, result = packed(cache, tmp_path, ["--max-entries", "4", "--max-gib", "1"])
    assert code == 1 and result["error"] == (
        "the kernels under deep_gemm/cache come to more than 4 entries (host data "
        "kernel_share_max_entries; raise it to share more): not shared")
    with open(cache / KERNEL / "kernel.cubin", "r+b") as big:
        big.truncate((1 << 30) + 1)
    code, result = packed(cache, tmp_path)
    assert code == 1 and "more than 1 GiB (host data kernel_share_max_gib" in result["error"]
    assert not (tmp_path / "root-only" / f"{DIGEST}.tar.gz").exists()


def test_unpack_refuses_an_archive_past_its_bound(tmp_path: Path) -> None:
    into = service_dir(tmp_path / "dst" / "cache")
    many = hostile(tmp_path, MANIFEST, *(member(f"{KERNEL}/f{i}") for i in range(5)))
    code, result = unpack(many, into, bound=["--max-entries", "5", "--max-gib", "1"])
    assert code == 1 and result["error"] == (
        f"the archive's member '{KERNEL}/f4' makes it more than 5 entries (host data "
        "kernel_share_max_entries; raise it to share more): nothing was extracted")
    # a member that says it holds 1 GiB + 1: refused at its header, before its bytes
    info = tarfile.TarInfo(f"{KERNEL}/kernel.cubin")
    info.size = (1 << 30) + 1
    manifest = MANIFEST[0].tobuf() + MANIFEST[1] + b"\0" * (-len(MANIFEST[1]) % 512)
    big = tmp_path / "big.tar.gz"
    big.write_bytes(gzip.compress(manifest + info.tobuf() + b"x" * 512))
    code, result = unpack(big, into)
    assert code == 1 and "makes it more than 1 GiB (host data kernel_share_max_gib" in \
        result["error"] and "nothing was extracted" in result["error"]
    assert list(into.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["--digest", "../x"], ["--digest", DIGEST, "--root", "relative/path"],
])
def test_the_program_refuses_arguments_that_are_not_its_forms(args: list[str]) -> None:
    argv = ["record", "--inputs", "{}", "--record", "/tmp/x.json", "--digest", DIGEST, *args]
    if "--root" in args:
        argv = ["pack", "--inputs", "{}", "--out", "/tmp/x.tar.gz", *args]
    proc = subprocess.run([sys.executable, "-m", PROGRAM, *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "error:" in proc.stderr
