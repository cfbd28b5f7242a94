"""One server with SGLang's own data parallelism on a lab host: ``--data sglang.parallel.dp=8``
deploys one unit whose server sees all 8 GPUs and runs a DP controller and 8 DP schedulers,
DP rank d on GPU d, and passes the gate with the capacity of all 8 DP ranks (the soak sends
twice that).

    flock /tmp/sglang-lab.lock uv run pytest -n0 -q tests/lab/test_dp.py   # root, ~3 min
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.lab.conftest import booted_lab, pyinfra, ssh

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab() -> Iterator[None]:
    yield from booted_lab("--hosts", "1")


def children(host: str, pid: str) -> dict[str, str]:
    """A process's children on a lab host, by process title."""
    out = ssh(host, f"ps -o pid=,args= --ppid {pid}").stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines() if line.strip()}


def test_one_dp_server_serves_on_all_eight_gpus(lab: None) -> None:
    result = pyinfra("deploys/sglang.py", "--data", "sglang.parallel.dp=8")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    units = ssh("lab1", "systemctl list-units --all --plain --no-legend sglang.service "
                        "'sglang-[0-9]*.service'").stdout
    assert [line.split()[0] for line in units.splitlines() if line.strip()] == \
        ["sglang.service"], units
    pid = ssh("lab1", "systemctl show -p MainPID --value sglang.service").stdout.strip()
    assert "--dp-size 8" in ssh("lab1", f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    environ = ssh("lab1", f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    assert "CUDA_VISIBLE_DEVICES=" not in environ  # one server: every GPU of the host
    assert len(ssh("lab1", "nvidia-smi -L").stdout.splitlines()) == 8
    top = children("lab1", pid)
    assert set(top) == {"sglang::data_parallel_controller", "sglang::detokenizer"}, top
    below = children("lab1", top["sglang::data_parallel_controller"])
    assert set(below) == {f"sglang::scheduler_DP{d}" for d in range(8)}, below
    journal = ssh("lab1", "journalctl -u sglang.service -o cat --no-pager").stdout
    for d in range(8):
        assert f"Launch DP{d} starting at GPU #{d}." in journal
        assert re.search(rf" DP{d}\] max_total_num_tokens=\d+, .*max_running_requests=\d+",
                         journal), journal[-3000:]

    assert "[lab1] health: /health_generate 200" in out
    per_rank = re.search(r"\[lab1\] capacity: .*max running requests (\d+) per DP rank, (\d+) "
                         r"for the server \(8 DP ranks\)", out)
    assert per_rank, out[-5000:]
    total = int(per_rank.group(2))
    assert total == 8 * int(per_rank.group(1))
    assert re.search(rf"\[lab1\] soak: {2 * total} concurrent requests, all answered in "
                     r"[\d.]+ s; sglang\.service still serving", out), out[-5000:]
