from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_fleet.config import flags, preflight, profile, releases
from sglang_fleet.config.render import render
from sglang_fleet.errors import InputError
from tests.conftest import MINIMAL, field_profile

Write = Callable[..., Path]
QWEN = "Qwen3_5ForConditionalGeneration"
MTP = """
speculative:
  algorithm: NEXTN
  num_steps: 3
  eagle_topk: 1
  num_draft_tokens: 4
"""


def run(path: Path, version: str, arch: str | None = QWEN) -> list[str]:
    p = profile.load(path)
    return [str(x) for x in preflight.check(p, render(p, version), arch)]


def test_field_profile_passes_every_release() -> None:
    p = field_profile()
    for version in ("0.5.10", "0.5.12", "0.5.13.post1", "0.5.14", "0.5.19", "0.5.23"):
        assert preflight.check(p, render(p, version), QWEN) == [], version


def test_the_field_failure_on_0_5_12(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba:\n  strategy: no_buffer\n")
    [message] = run(path, "0.5.12")
    assert f"Speculative decoding for {QWEN} is not compatible with radix cache" in message
    assert "use --mamba-scheduler-strategy extra_buffer (mamba.strategy: extra_buffer)" in message


def test_auto_meant_no_buffer_before_0_5_14(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP)
    assert any("not compatible with radix cache" in m for m in run(path, "0.5.13.post1"))
    assert run(path, "0.5.14") == []  # auto resolves to extra_buffer for Qwen3.5 there


def test_no_buffer_on_0_5_23_spelled_for_the_release(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba:\n  strategy: no_buffer\n")
    [message] = run(path, "0.5.23")
    assert "no_buffer do not support overlap schedule" in message
    assert "use --mamba-radix-cache-strategy extra_buffer" in message
    assert "--mamba-scheduler-strategy" not in message


def test_no_buffer_constraints(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + """
mamba: {strategy: no_buffer}
memory: {page_size: 64}
scheduler: {overlap_schedule: false, attention_backend: trtllm_mha}
""")
    found = run(path, "0.5.23")
    assert any("no_buffer only supports page_size=1" in m for m in found)
    assert any("trtllm_mha" in m for m in found)
    assert not any("overlap" in m for m in found)


def test_extra_buffer_with_radix_cache_disabled(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: extra_buffer}\n"
                         "scheduler: {radix_cache: false}\n")
    for version in ("0.5.10", "0.5.12", "0.5.13.post1"):
        [message] = run(path, version)
        assert "not compatible with --disable-radix-cache" in message
        assert "scheduler.radix_cache" in message
    # 0.5.14+ return early when the radix cache is off: it starts.
    for version in ("0.5.14", "0.5.19", "0.5.23"):
        assert run(path, version) == []


def test_extra_buffer_unsupported_architecture(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: extra_buffer}\n")
    [old] = run(path, "0.5.12", "JetNemotronForCausalLM")
    assert "mamba extra_buffer is not supported for JetNemotronForCausalLM model" in old
    assert "--mamba-scheduler-strategy no_buffer" in old
    [new] = run(path, "0.5.23", "JetNemotronForCausalLM")
    assert "extra_buffer is not supported for JetNemotronForCausalLM; use no_buffer." in new


def test_extra_buffer_needs_triton_linear_attention(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: extra_buffer}\n"
                         "scheduler: {linear_attn_backend: flashinfer}\n")
    [message] = run(path, "0.5.23")
    assert "--linear-attn-backend triton" in message


def test_track_interval_rules(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: extra_buffer, track_interval: 3}\n"
                         "memory: {page_size: 2}\n")
    found = run(path, "0.5.23")
    assert any("mamba_track_interval 3 must be greater than or equal to "
               "speculative_num_draft_tokens 4" in m for m in found)
    assert any("mamba_track_interval 3 must be divisible by page_size 2" in m for m in found)


def test_topk_one_forces_draft_tokens(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP.replace("num_draft_tokens: 4", "num_draft_tokens: 6")
                         + "mamba: {strategy: extra_buffer}\n")
    [message] = run(path, "0.5.23")
    assert "speculative.num_draft_tokens" in message
    assert "set speculative.num_draft_tokens: 4" in message


def test_unknown_algorithm(write_profile: Write) -> None:
    spec = MTP.replace("NEXTN", "MTP")
    path = write_profile(MINIMAL + spec + "mamba: {strategy: extra_buffer}\n")
    [message] = run(path, "0.5.23")
    assert "Unknown speculative algorithm name: MTP" in message and "NEXTN" in message


def test_spec_v2_is_not_required_on_0_5_10(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: extra_buffer}\n"
                         "env: {SGLANG_ENABLE_SPEC_V2: '0'}\n")
    assert run(path, "0.5.10") == []


def test_spec_v2_refuses_topk_above_one_on_0_5_10(write_profile: Write) -> None:
    spec = MTP.replace("eagle_topk: 1", "eagle_topk: 2")
    path = write_profile(MINIMAL + spec + "mamba: {strategy: extra_buffer}\n")
    assert run(path, "0.5.10") == []  # rendering keeps spec v2 off for a topk above 1
    forced = write_profile(MINIMAL + spec + "mamba: {strategy: extra_buffer}\n"
                           "env: {SGLANG_ENABLE_SPEC_V2: '1'}\n", "forced.yaml")
    [message] = run(forced, "0.5.10")
    assert "Spec v2 currently only supports topk = 1" in message
    assert run(path, "0.5.11") == []


def test_non_hybrid_model_skips_mamba_rules(write_profile: Write) -> None:
    path = write_profile(MINIMAL + MTP + "mamba: {strategy: no_buffer}\n")
    assert run(path, "0.5.12", "LlamaForCausalLM") == []


def test_architecture_from_model_config(write_profile: Write, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": [QWEN]}))
    p = profile.load(write_profile(MINIMAL))
    assert preflight.resolve_architecture(p, str(config)) == QWEN
    assert preflight.resolve_architecture(p, str(tmp_path)) == QWEN


def test_model_config_errors(tmp_path: Path, write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL))
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "empty.json").write_text("{}")
    for name, text in (("missing.json", "cannot read"), ("bad.json", "not valid JSON"),
                       ("empty.json", "architectures")):
        with pytest.raises(InputError, match=text):
            preflight.resolve_architecture(p, str(tmp_path / name))


@pytest.mark.parametrize("version", sorted(preflight.LATER_CHECKS))
def test_later_checks_table(version: str, write_profile: Write) -> None:
    """The lazy buffer without the overlap schedule passes ServerArgs but dies sizing the pools:
    check() says so, citing the release's file and line; check_server_args() does not."""
    path = write_profile(MINIMAL + f"engine: {{version: '{version}'}}\n"
                         "mamba: {strategy: extra_buffer_lazy}\n"
                         "scheduler: {overlap_schedule: false}\n")
    p = profile.load(path)
    launch = render(p, version)
    assert preflight.check_server_args(p, launch, QWEN) == []
    [problem] = preflight.check(p, launch, QWEN)
    where, text = preflight.LATER_CHECKS[version]
    assert text in problem.message and where in problem.message
    assert problem.key == "scheduler.overlap_schedule"
    ok = write_profile(MINIMAL + f"engine: {{version: '{version}'}}\n"
                       "mamba: {strategy: extra_buffer_lazy}\n", name="ok.yaml")
    q = profile.load(ok)
    assert preflight.check(q, render(q, version), QWEN) == []


def test_releases_with_lazy_have_a_later_check() -> None:
    for version in releases.supported():
        has_lazy = "extra_buffer_lazy" in str(flags.load(version).flags.get(
            "--mamba-radix-cache-strategy") or flags.load(version).flags.get(
            "--mamba-scheduler-strategy"))
        assert has_lazy == (version in preflight.LATER_CHECKS), version
