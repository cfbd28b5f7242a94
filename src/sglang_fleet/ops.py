"""What the stages' custom operations share."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

# A pyinfra operation body: yields commands (strings or FunctionCommands).
Ops = Generator[Any, None, None]


def fail(message: str) -> str:
    """A command that fails with ``message``: pyinfra shows it as the host's error, without the
    traceback an exception raised while executing an operation would print."""
    return f"echo {shlex.quote('error: ' + message)} >&2; exit 1"
