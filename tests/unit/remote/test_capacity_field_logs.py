"""The capacity reader on real startup logs pasted in public issue threads (tests/data/logs/,
each citing its thread), and on random cuts of them and of format-string logs: never a
traceback, whatever is cut."""

from __future__ import annotations

import random
import re

import pytest

from sglang_fleet.remote import capacity, readiness
from tests.conftest import DATA
from tests.unit.remote.test_capacity_ranks import startup

LOGS = DATA / "logs"


def field_log(name: str) -> list[str]:
    """A fixture's log lines, without its header (the "# " lines citing the thread)."""
    text = (LOGS / name).read_text()
    return [line for line in text.splitlines() if not line.startswith("# ")]


def test_every_fixture_cites_its_thread() -> None:
    for path in LOGS.glob("*.log"):
        head = path.read_text().splitlines()[:2]
        assert head[0].startswith("# Source: ") and "https://github.com/" in " ".join(head)


def test_npu_tp2_cut_in_capture() -> None:
    """sgl-project/sglang#16526: the old "Load weight end. type=, dtype=" form, tp 2."""
    cap = capacity.parse(field_log("sglang-issue-16526-npu-tp2-crash.log"))
    assert cap.state == capacity.PARTIAL and cap.ranks == ["TP0", "TP1"]
    assert (cap.rank, cap.architecture, cap.weights_gb) == ("TP0", "Qwen3ForCausalLM", 31.01)
    assert (cap.kv_tokens, cap.kv_gb, cap.pool_end_gb) == (143104, 17.48, 11.80)
    assert cap.draft is None and cap.rank_notes == []
    assert cap.missing == ["max_running_requests", "context_len", "available GPU memory"]


def test_deepseek_tp8_of_2024() -> None:
    """sgl-project/sglang#1479: eight ranks, the time alone in the prefix, no mem usage."""
    cap = capacity.parse(field_log("sglang-issue-1479-deepseek-v2.5-tp8-crash.log"))
    assert cap.state == capacity.PARTIAL and len(cap.ranks) == 8 and cap.rank == "TP0"
    assert (cap.architecture, cap.pool_end_gb, cap.weights_gb) == \
        ("DeepseekV2ForCausalLM", 18.66, None)  # the class from TP7, the only rank that has it
    assert cap.draft is None


def test_swa_pools_of_one_rank_add_up() -> None:
    """sgl-project/sglang#15464: two pools a rank; TP2's sum is SGLang's own SWAKVPool total."""
    reader = capacity.Reader()
    for line in field_log("sglang-pr-15464-mimo-v2-flash-swa-tp4.log"):
        reader.line(line)
    tp2 = reader.ranks["TP2"].target()
    assert tp2 is not None and tp2.kv_gb == pytest.approx(77.63) and tp2.pool_end_gb == 22.56
    cap = reader.result()
    assert (cap.rank, cap.kv_tokens, cap.pool_end_gb) == ("TP0", 1496958, 22.59)
    assert cap.draft is None and len(cap.ranks) == 4


def test_draft_pools_on_each_rank_without_load_lines() -> None:
    """noonghunna/club-3090#1261: each rank's second pool, after its target's "Memory pool end",
    is the draft's: both "Memory pool end" lines are not the draft's."""
    cap = capacity.parse(field_log("club-3090-issue-1261-5090-tp2-hybrid-draft.log"))
    assert (cap.rank, cap.kv_tokens, cap.kv_gb, cap.pool_end_gb) == ("TP0", 454112, 6.92, 8.40)
    assert cap.draft is not None and cap.draft.role == "draft"
    assert (cap.draft.kv_tokens, cap.draft.kv_gb, cap.draft.pool_end_gb) == (454112, 2.16, 6.23)
    assert cap.state == capacity.PARTIAL


def test_reference_rank_is_the_lowest_with_figures() -> None:
    """sgl-project/sglang#15909: TP0 logs no pool line in the paste: TP1 speaks."""
    cap = capacity.parse(field_log("sglang-pr-15909-qwen-omni-tp4.log"))
    assert (cap.rank, cap.ranks) == ("TP1", ["TP1", "TP2", "TP3"])
    assert (cap.kv_tokens, cap.kv_gb, cap.pool_end_gb) == (2090351, 47.84, 12.45)


def cuts(lines: list[str], rng: random.Random) -> list[str]:
    """A random mangling: a prefix of the log, lines dropped, one line cut mid-way."""
    out = lines[:rng.randint(0, len(lines))]
    out = [x for x in out if rng.random() > 0.2]
    if out:
        i = rng.randrange(len(out))
        out[i] = out[i][:rng.randint(0, len(out[i]))]
        j = rng.randrange(len(out))  # a figure no GPU has, or no number at all
        out[j] = re.sub(r"\d+", lambda _: rng.choice(["9" * 400, "0", "1.2.3", ""]), out[j])
    return out


SOURCES = [*(p.name for p in sorted(LOGS.glob("*.log"))), "tp8-draft-0.5.12", "tp2-0.5.23"]


@pytest.mark.parametrize("source", SOURCES)
def test_random_cuts_never_raise(source: str) -> None:
    lines = (field_log(source) if source.endswith(".log") else
             startup(source.rsplit("-", 1)[1], int(source[2]), "draft" in source))
    rng = random.Random(source)
    for _ in range(80):
        cut = cuts(lines, rng)
        cap = capacity.parse(cut, rng.choice([None, "0.5.12", "0.5.23"]))
        capacity.report(cap)
        cap.as_json()
        assert cap.state in (capacity.COMPLETE, capacity.PARTIAL, capacity.NOT_A_LOG)
        readiness.parse([readiness.Entry(float(i), x) for i, x in enumerate(cut)])
