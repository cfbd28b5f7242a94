"""What the stages' custom operations share."""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator
from typing import Any

from pyinfra import logger
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import host

# A pyinfra operation body: yields commands (strings or FunctionCommands).
Ops = Generator[Any, None, None]
# How the operation becomes root (`_sudo` and friends, from the call or from host data).
_PRIVILEGE = ("_sudo", "_sudo_user", "_use_sudo_login", "_sudo_password", "_preserve_sudo_env",
              "_su_user", "_use_su_login", "_preserve_su_env", "_su_shell", "_doas", "_doas_user")


def privilege() -> dict[str, Any]:
    """The current operation's way to root (empty when the SSH user is root), for commands an
    operation or a FunctionCommand runs itself; pyinfra applies it only to yielded commands."""
    args: dict[str, Any] = dict(host.current_op_global_arguments or {})
    return {k: v for k, v in args.items() if k in _PRIVILEGE and v}


def run(command: str, **kwargs: Any) -> tuple[bool, CommandOutput]:
    """``host.run_shell_command`` with the operation's privilege: reads root-only state on a
    host reached as a sudo user, as the yielded commands do."""
    return host.run_shell_command(command, **privilege(), **kwargs)


def fail(message: str) -> str:
    """A command that fails with ``message``: pyinfra shows it as the host's error, without the
    traceback an exception raised while executing an operation would print."""
    return f"echo {shlex.quote('error: ' + message)} >&2; exit 1"


def failed(message: str) -> bool:
    """What a FunctionCommand returns to fail the host, with ``message`` said as the host's error
    (pyinfra itself names only the operation).

        return failed("sglang.service: smoke test failed")
    """
    logger.error(f"{host.print_prefix}error: {message}")
    return False


def preview(what: str, changes: bool = True) -> Ops:
    """In pyinfra's preview (its change detection, before "Beginning operation run"; ``-y``
    skips it), what a check of what the run has just done will check (the gate, a smoke
    generation): a line for the host and, when it may change the host, a stand-in command, so
    that the preview counts it as a change. The stand-in never runs: the preview stops at an
    operation's first command, and the run calls the operation again, executing. Such a check
    runs in its body, not in a FunctionCommand, because it changes nothing when it passes (a
    FunctionCommand counts as a change on every run); other operations need no preview.

        if not state.is_executing:
            yield from preview("a smoke generation against sglang.service", changes=False)
            return
    """
    # the line first: the preview stops reading the operation at its first command
    logger.info(f"{host.print_prefix}preview: {what}")
    if changes:
        yield f"true  # {what}"


def result_line(lines: list[str], mark: str) -> dict[str, Any] | None:
    """A host program's last ``MARK <json object>`` line, None when it printed none.

        result_line(["compiling", 'WARMUP {"ok": true}'], "WARMUP")   # {'ok': True}
    """
    for line in reversed(lines):
        if line.startswith(f"{mark} "):
            try:
                found = json.loads(line[len(mark) + 1:])
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None
