"""The fake pyinfra host the operation tests share: facts by class name, shell answers by
pattern, what ``host.noop`` said; and ``commands`` to read what an operation would run."""

from __future__ import annotations

import re
from inspect import getfullargspec
from typing import Any

from pyinfra.api.command import FunctionCommand
from pyinfra.connectors.util import CommandOutput, OutputLine

from sglang_fleet.stages.engine.deploy import Release

RELEASE = Release("sglang", "0.5.23", (), None, None, "/usr/bin/python3")


class Host:
    """Facts by class name (and their arguments), shell answers by regular expression."""

    name = "h1"
    print_prefix = "[h1] "

    def __init__(self, facts: dict[str, Any] | None = None,
                 shell: dict[str, list[str]] | None = None) -> None:
        self.facts = facts or {}
        self.shell = shell or {}
        self.current_op_global_arguments: dict[str, Any] = {}
        self.noops: list[str] = []

    def get_fact(self, fact: type, **kwargs: Any) -> Any:
        value = self.facts.get(fact.__name__)
        return value(**kwargs) if callable(value) else value

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
        for pattern, lines in self.shell.items():
            if re.search(pattern, command):
                return True, CommandOutput([OutputLine("stdout", line) for line in lines])
        return False, CommandOutput([])

    def noop(self, description: str) -> None:
        self.noops.append(description)


def commands(op: Any, *args: Any, **kwargs: Any) -> list[Any]:
    return list(op._inner(*args, **kwargs))


def executed(fake: Any, op: Any, *args: Any, **kwargs: Any) -> list[Any]:
    """The operation's commands as the run executes them on ``fake``: each FunctionCommand
    called (given ``state, host`` when it takes them) and its answer listed in its place."""
    found: list[Any] = []
    for command in op._inner(*args, **kwargs):
        if isinstance(command, FunctionCommand):
            takes = getfullargspec(command.function).args
            given = (None, fake) if "state" in takes and "host" in takes else ()
            command = command.function(*given, *command.args, **command.kwargs)
        found.append(command)
    return found


def driver_host(offered: list[str], installed: str | None, held: list[str]) -> Host:
    main = "nvidia-driver-580-open"  # what the stage reads the version of
    return Host({"AptVersions": offered, "HeldPackages": held,
                 "DebPackages": {main: [installed]} if installed else {}})
