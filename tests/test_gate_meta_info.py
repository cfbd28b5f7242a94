"""The gate's accept length: return_meta_info exists from SGLang 0.5.13 (entrypoints/openai/
protocol.py); earlier releases ignore it, which the gate reports instead of printing nothing."""

from __future__ import annotations

from sglang_fleet.remote import check_server as gate_check


def smoke(accept: float | None, meta: bool | None, version: str | None) -> dict[str, object]:
    return {"answer": "4", "ttft_s": 0.1, "tokens_per_s": 50.0, "accept_length": accept,
            "meta_info": meta, "version": version}


def test_releases_with_and_without_meta_info() -> None:
    assert gate_check.meta_info_reported("0.5.12.post1") is False
    assert gate_check.meta_info_reported("0.5.13") is True
    assert gate_check.meta_info_reported(None) is None


def test_describe_says_why_there_is_no_accept_length() -> None:
    line = gate_check.describe(smoke(None, False, "0.5.12"))
    assert line.endswith("accept length not reported by this release (SGLang 0.5.12: "
                         "return_meta_info arrived in 0.5.13)")
    assert "accept length 2.85" in gate_check.describe(smoke(2.85, True, "0.5.23"))
    assert "not reported by this server" in gate_check.describe(smoke(None, None, None))
    assert "accept length" not in gate_check.describe(smoke(None, True, "0.5.23"))
