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


def test_a_unit_restarts_only_when_what_it_runs_changed_else_starts_only_when_down() -> None:
    """``unit_running`` as pyinfra builds it: two operations under ``_if``, the restart when one
    of its changes changed (``any_changed``), the start of a unit found down when none did;
    never both, so a fresh host starts its server once."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.deploy import add_deploy, deploy
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.operation import OperationMeta
    from pyinfra.api.state import State
    from pyinfra.connectors.util import CommandOutput
    from pyinfra.context import ctx_state

    from sglang_fleet.stages.service import deploy as service

    changed, same = OperationMeta("changed", None), OperationMeta("same", None)
    changed.set_complete(True, ["cp"], CommandOutput([]))
    same.set_complete(True, [], CommandOutput([]))

    @deploy("Units")
    def units() -> None:
        service.unit_running(name="Enable and start a.service", unit="a.service",
                             changes=[same, changed])
        service.unit_running(name="Enable and start b.service", unit="b.service", changes=[same])

    inventory = Inventory((["@local"], {}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config(), check_for_changes=False)  # type: ignore[no-untyped-call]
    with ctx_state.use(state):
        connect_all(state)
        add_deploy(state, units)
    host = inventory.get_host("@local")
    runs = {sorted(state.op_meta[h].names)[0].split(" | ")[-1]:
            all(c() for c in state.ops[host][h].global_arguments["_if"])  # type: ignore[union-attr]
            for h in state.get_op_order() if h in state.ops[host]}  # type: ignore[no-untyped-call]
    assert runs == {"Restart a.service (what it runs changed)": True,
                    "Enable and start a.service": False,
                    "Restart b.service (what it runs changed)": False,
                    "Enable and start b.service": True}
