"""The GPUs, read the way an operator reads them: ``nvidia-smi``."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int


def discover() -> list[Gpu]:
    """CUDA sees no device when nvidia-smi finds none; raise as torch would."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        raise RuntimeError("No CUDA GPUs are available") from None
    if result.returncode != 0:
        raise RuntimeError(f"No CUDA GPUs are available ({result.stdout.strip()}"
                           f"{result.stderr.strip()})")
    gpus = []
    for line in result.stdout.strip().splitlines():
        index, name, memory = (part.strip() for part in line.split(","))
        gpus.append(Gpu(int(index), name, int(memory)))
    if visible is not None:
        wanted = [int(i) for i in visible.split(",") if i.strip()]
        gpus = [g for g in gpus if g.index in wanted]
    if not gpus:
        raise RuntimeError("No CUDA GPUs are available")
    return gpus
