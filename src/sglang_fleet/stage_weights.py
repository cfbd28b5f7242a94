#!/usr/bin/env python3
"""Stage model weights onto a host's local disk, once: runs ON the host (the weights stage
uploads it), with boto3 for S3 and huggingface_hub for the hub.

    stage_weights.py s3://bucket/prefix /var/lib/sglang/models/NAME [--endpoint-url URL]
    stage_weights.py hf://org/name@revision /var/lib/sglang/models/NAME [--token-file F]

Files land in ``DEST.partial`` and are verified (size, and the ETag's MD5 for single-part
objects) before ``DEST.partial`` is renamed to ``DEST``: a partial model is never at DEST, and an
interrupted run resumes with the files it had finished. A manifest in DEST makes re-runs free.
Exit 0 when DEST is complete; anything else prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

MANIFEST = ".sglang-fleet-manifest.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stage_s3(source: str, partial: Path, endpoint: str | None, workers: int) -> dict[str, Any]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    bucket, _, prefix = source[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    s3 = boto3.client("s3", endpoint_url=endpoint)
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/"):
                objects.append((obj["Key"][len(prefix):], obj["Size"], obj["ETag"].strip('"')))
    if not objects:
        raise SystemExit(f"error: {source} holds no objects (check the bucket, prefix and "
                         "credentials)")
    progress_path = partial / MANIFEST
    done: dict[str, Any] = _load(progress_path).get("files", {})
    config = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20,
                            max_concurrency=workers)

    def fetch(item: tuple[str, int, str]) -> tuple[str, dict[str, Any]]:
        name, size, etag = item
        target = partial / name
        if done.get(name) == {"size": size, "etag": etag} and target.is_file():
            return name, done[name]
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".download")
        s3.download_file(bucket, prefix + name, str(tmp), Config=config)
        if tmp.stat().st_size != size:
            raise SystemExit(f"error: {name}: {tmp.stat().st_size} bytes, S3 says {size}")
        if "-" not in etag and _md5(tmp) != etag:
            raise SystemExit(f"error: {name}: MD5 differs from the ETag {etag}")
        tmp.replace(target)
        return name, {"size": size, "etag": etag}

    with concurrent.futures.ThreadPoolExecutor(max(1, workers // 4)) as pool:
        for name, entry in pool.map(fetch, objects):
            done[name] = entry
            progress_path.write_text(json.dumps({"source": source, "files": done}))
    return {"source": source, "files": done}


def stage_hf(source: str, partial: Path, token_file: str | None) -> dict[str, Any]:
    from huggingface_hub import HfApi, snapshot_download

    repo, _, revision = source[len("hf://"):].partition("@")
    token = Path(token_file).read_text().strip() if token_file else None
    snapshot_download(repo_id=repo, revision=revision, local_dir=str(partial), token=token)
    info = HfApi().model_info(repo, revision=revision, files_metadata=True, token=token)
    files = {}
    for sibling in info.siblings or []:
        path = partial / sibling.rfilename
        if sibling.size is not None and path.stat().st_size != sibling.size:
            raise SystemExit(f"error: {sibling.rfilename}: size differs from the hub's")
        files[sibling.rfilename] = {"size": sibling.size, "sha": info.sha}
    return {"source": source, "files": files}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("dest", type=Path)
    ap.add_argument("--endpoint-url")
    ap.add_argument("--token-file")
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    dest: Path = args.dest
    if (dest / MANIFEST).is_file():
        print(f"{dest}: already staged")
        return 0
    partial = dest.with_name(dest.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    tic = time.monotonic()
    if args.source.startswith("s3://"):
        manifest = stage_s3(args.source, partial, args.endpoint_url, args.workers)
    elif args.source.startswith("hf://"):
        manifest = stage_hf(args.source, partial, args.token_file)
    else:
        raise SystemExit(f"error: {args.source}: not an s3:// or hf:// source")
    if not (partial / "config.json").is_file():
        raise SystemExit(f"error: {args.source} has no config.json: not a model directory")
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(partial, dest)
    size = sum(f["size"] or 0 for f in manifest["files"].values())
    seconds = max(time.monotonic() - tic, 1e-3)
    print(f"{dest}: staged {len(manifest['files'])} files, {size / 1e9:.2f} GB in {seconds:.1f} s "
          f"({size / 1e6 / seconds:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
