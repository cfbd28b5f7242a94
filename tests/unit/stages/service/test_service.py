"""The unit's ExecStart words and the environment file, as systemd reads them."""

from __future__ import annotations

import pytest

from sglang_fleet.config.render import render
from sglang_fleet.errors import InputError
from sglang_fleet.ops.host_programs import program
from sglang_fleet.ops.unitfile import systemd_word
from sglang_fleet.stages.engine.deploy import Release
from sglang_fleet.stages.service.deploy import LAUNCHER, environment, exec_start, secret_values
from tests.conftest import field_profile

KEY = "k'ey\"x-0123456789abcdef"
RELEASE = Release("sglang", "0.5.23", (), None, None, "/usr/bin/python3")


def test_systemd_words() -> None:
    assert systemd_word("--port") == "--port"
    assert systemd_word("${SGLANG_API_KEY}") == '"$${SGLANG_API_KEY}"'
    assert systemd_word("50%") == "50%%"
    assert systemd_word("$HOME") == '"$$HOME"'
    assert systemd_word('{"a": 1}') == '"{\\"a\\": 1}"'
    assert systemd_word("a\nb") == '"a\\x0ab"'


def test_exec_start_runs_the_launcher_and_carries_no_key() -> None:
    launch = render(field_profile())
    words = exec_start(launch, RELEASE).split()
    assert words[:6] == [*program(RELEASE.python_bin, LAUNCHER), "sglang.launch_server"]
    assert "--api-key" not in words and "--admin-api-key" not in words
    assert launch.secrets == {"SGLANG_API_KEY": "sglang-api-key"}


def test_environment_file_holds_secret_and_caches() -> None:
    launch = render(field_profile())
    text = environment(launch, {"SGLANG_API_KEY": KEY})
    assert "SGLANG_API_KEY=\"k'ey\\\"x-0123456789abcdef\"" in text
    assert "HF_HOME='/var/cache/sglang/huggingface'" in text


def test_missing_or_malformed_secret_names_the_data_key() -> None:
    launch = render(field_profile())
    with pytest.raises(InputError, match=r"secrets\.sglang-api-key"):
        secret_values(launch, "b200-01", {})
    for bad in ("short", "has space in it 0123456789", "new\nline0123456789abcdef", "$(id)" * 5):
        with pytest.raises(InputError, match=r"secrets\.sglang-api-key: must be 16 to 512"):
            secret_values(launch, "b200-01", {"sglang-api-key": bad})
    assert secret_values(launch, "b200-01", {"sglang-api-key": "s" * 16}) == \
        {"SGLANG_API_KEY": "s" * 16}
