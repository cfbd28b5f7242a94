from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_fleet.config import profile, releases
from sglang_fleet.errors import InputError
from tests.conftest import MINIMAL, field_profile

Write = Callable[..., Path]


def problems(path: Path, **kw: object) -> list[str]:
    with pytest.raises(InputError) as exc:
        profile.load(path, **kw)  # type: ignore[arg-type]
    return [str(p) for p in exc.value.problems]


def test_field_profile_loads_with_the_field_setup() -> None:
    p = field_profile()
    assert p.speculative.algorithm in ("NEXTN", "EAGLE")
    assert (p.speculative.num_steps, p.speculative.eagle_topk,
            p.speculative.num_draft_tokens) == (3, 1, 4)
    assert p.mamba.strategy == "extra_buffer"
    assert p.parsers.reasoning == "qwen3"
    assert p.server.metrics is True
    assert p.engine.version == releases.pinned()


def test_defaults_fill_a_minimal_profile(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL))
    assert p.engine.version == releases.pinned()
    assert p.engine.launcher == "sglang.launch_server"
    assert p.mamba.strategy == "auto"
    assert p.server.port == 30000 and p.parallel.tp == 1
    assert p.speculative.algorithm is None


def test_misspelled_key_names_file_key_and_suggestion(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "speculative:\n  num_stepz: 3\n")
    [message] = problems(path)
    assert str(path) in message
    assert "speculative.num_stepz" in message
    assert "did you mean 'num_steps'" in message


def test_misspelled_section_is_suggested(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "memroy:\n  page_size: 1\n"))
    assert "memroy" in message and "did you mean 'memory'" in message


def test_wrong_type(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "parallel:\n  tp: two\n"))
    assert "parallel.tp" in message and "must be an integer" in message and "'two'" in message


def test_bool_is_not_an_integer(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "server:\n  port: true\n"))
    assert "server.port" in message


def test_out_of_range(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "memory:\n  mem_fraction_static: 1.5\n"))
    assert "memory.mem_fraction_static" in message and "at most 1" in message
    [message] = problems(write_profile(MINIMAL + "server:\n  port: 70000\n"))
    assert "server.port" in message


def test_missing_required_key(write_profile: Write) -> None:
    [message] = problems(write_profile("model:\n  source: /models/x\n"))
    assert "model.served_name" in message and "required" in message


def test_unknown_choice(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "mamba:\n  strategy: extra\n"))
    assert "mamba.strategy" in message and "extra_buffer" in message


def test_unpinned_hf_source(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL.replace("@0123abc", "")))
    assert "model.source" in message and "revision" in message


def test_unsupported_release(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "engine:\n  version: '0.4.0'\n"))
    assert "engine.version" in message and "0.5.23" in message


def test_api_key_value_is_refused(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL + "server:\n  api_key_secret: sk-ABCdef123\n"))
    assert "server.api_key_secret" in message and "NAME of a secret" in message


def test_all_problems_reported_at_once(write_profile: Write) -> None:
    found = problems(write_profile(MINIMAL + "parallel:\n  tp: 0\n  dp: x\n"))
    assert len(found) == 2


def test_unreadable_yaml(write_profile: Write) -> None:
    [message] = problems(write_profile("model: [unclosed\n"))
    assert "not valid YAML" in message and "line" in message


def test_missing_file(tmp_path: Path) -> None:
    [message] = problems(tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "cannot read" in message


def test_top_level_must_be_a_mapping(write_profile: Write) -> None:
    [message] = problems(write_profile("- a\n- b\n"))
    assert "mapping" in message


def test_overrides_nested_and_dotted(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "memory:\n  page_size: 1\n")
    p = profile.load(path, overrides={"memory": {"max_running_requests": 64},
                                      "parallel.tp": "2", "env": {"A": "b"}})
    assert p.memory.max_running_requests == 64
    assert p.memory.page_size == 1  # untouched keys keep the file's value
    assert p.parallel.tp == 2  # --data values arrive as strings
    assert p.env == {"A": "b"}
    assert p.source_of("parallel.tp") == "host data"
    assert p.source_of("memory.page_size") == str(path)


def test_override_error_names_the_data_source(write_profile: Write) -> None:
    [message] = problems(write_profile(MINIMAL), overrides={"memory.page_sise": 64},
                         overrides_source="group_data/b200.py")
    assert message.startswith("group_data/b200.py: memory.page_sise")
    assert "did you mean 'page_size'" in message


def test_env_overrides_merge_key_by_key(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "env:\n  A: '1'\n  B: '2'\n")
    p = profile.load(path, overrides={"env.B": "3", "env": {"C": "4"}})
    assert p.env == {"A": "1", "B": "3", "C": "4"}


def test_a_refused_algorithm_is_one_problem_not_two(write_profile: Write) -> None:
    path = write_profile(MINIMAL + "speculative: {algorithm: 'a b', num_steps: 3}\n")
    with pytest.raises(InputError) as exc:
        profile.load(path)
    assert [p.key for p in exc.value.problems] == ["speculative.algorithm"]
