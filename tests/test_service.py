"""The unit's ExecStart words and the environment file, as systemd reads them."""

from __future__ import annotations

import pytest

from sglang_fleet import profile
from sglang_fleet.errors import InputError
from sglang_fleet.render import render
from sglang_fleet.service import environment, secret_values, systemd_word
from tests.conftest import FIELD_PROFILE


def test_systemd_words() -> None:
    assert systemd_word("--port") == "--port"
    assert systemd_word("${SGLANG_API_KEY}") == "${SGLANG_API_KEY}"
    assert systemd_word("50%") == "50%%"
    assert systemd_word("$HOME") == '"$$HOME"'
    assert systemd_word('{"a": 1}') == '"{\\"a\\": 1}"'


def test_environment_file_holds_secret_and_caches() -> None:
    launch = render(profile.load(FIELD_PROFILE))
    text = environment(launch, {"SGLANG_API_KEY": "k'ey\"x"})
    assert "SGLANG_API_KEY=\"k'ey\\\"x\"" in text
    assert "HF_HOME='/var/cache/sglang/huggingface'" in text


def test_missing_secret_names_the_data_key() -> None:
    launch = render(profile.load(FIELD_PROFILE))
    with pytest.raises(InputError, match=r"secrets\.sglang-api-key"):
        secret_values(launch, "b200-01", {})
    assert secret_values(launch, "b200-01", {"secrets": {"sglang-api-key": "s"}}) == \
        {"SGLANG_API_KEY": "s"}
