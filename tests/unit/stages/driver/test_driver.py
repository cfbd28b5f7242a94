"""The driver stage's reboot: pyinfra's own ``server.reboot``, its wait said with the host's
name, and a host that does not come back failing alone with a plain message."""

from __future__ import annotations

import logging
from typing import Any

import gevent  # type: ignore[import-untyped]
import pytest
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.operations import server

from sglang_fleet.ops import Ops
from sglang_fleet.stages.driver import deploy as driver


def steps(commands: Any) -> list[str]:
    """What each command runs: the shell text, or the Python function's qualified name (the
    one inside the stage's wait wrapper)."""
    return [str(c) if isinstance(c, StringCommand) else
            (c.args[0] if c.args and isinstance(c.args[0], FunctionCommand) else c)
            .function.__qualname__ for c in commands]


def test_the_reboot_is_pyinfras_own() -> None:
    assert steps(driver.reboot_and_wait(900)) == \
        steps(server.reboot._inner(delay=5, interval=2, reboot_timeout=900))


@operation()
def _without_the_reboot(timeout: int) -> Ops:
    # Its Python steps only: the reboot command itself never runs here.
    for command in driver.reboot_and_wait(timeout, delay=0, interval=0.01):
        if isinstance(command, FunctionCommand):
            yield command


def test_a_host_not_back_in_time_fails_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A real host (this one, whose uptime never drops) run by pyinfra's own executor: the
    wait gives up, the host fails (the only one here, so the run ends) with the message and no
    traceback."""
    from pyinfra.api.config import Config
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.inventory import Inventory
    from pyinfra.api.operation import add_op
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    inventory = Inventory((["@local"], {}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    with ctx_state.use(state), caplog.at_level(logging.INFO):
        connect_all(state)
        add_op(state, _without_the_reboot, 0)
        with pytest.raises(PyinfraError, match="No hosts remaining"):
            run_ops(state)
    assert [h.name for h in state.failed_hosts] == ["@local"]
    assert "[@local] waiting for @local to come back from its reboot: 0 s left" in caplog.text
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
              and "did not come back" in r.getMessage()]
    assert said.startswith("[@local] error: @local did not come back from its reboot (")
    assert said.endswith("; the wait is reboot_timeout_seconds): this host fails, the others "
                         "carry on")
    assert "Traceback" not in caplog.text and "back from its reboot after" not in caplog.text


class Silent:
    """A host that does not answer while it reboots: each try to connect hangs."""

    name, print_prefix, connected = "h1", "[h1] ", False

    def __init__(self) -> None:
        self.connector_data: dict[str, Any] = {}
        self.facts = {"Uptime": 1000}

    def get_fact(self, fact: type) -> Any:
        return self.facts[fact.__name__]

    def connect(self, show_errors: bool = True) -> None:
        gevent.sleep(30)

    def disconnect(self) -> None:
        pass


def test_the_wait_ends_on_time_when_each_try_hangs(caplog: pytest.LogCaptureFixture) -> None:
    """pyinfra counts tries; the stage bounds the wait by the clock: a silent host fails after
    reboot_timeout_seconds, not after as many hung tries."""
    host, ran = Silent(), []
    for command in driver.reboot_and_wait(1, delay=0, interval=1):
        if isinstance(command, FunctionCommand):  # never the reboot command itself
            ran.append(command.execute(None, host, {}))  # type: ignore[arg-type]
            if ran[-1] is False:
                break
    assert ran == [None, None, False]
    assert "[h1] error: h1 did not come back from its reboot (waited 1 s; the wait is " \
        "reboot_timeout_seconds): this host fails, the others carry on" in caplog.text
