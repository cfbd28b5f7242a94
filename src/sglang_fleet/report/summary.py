"""The end of a pyinfra run names the hosts that failed and the operation each failed in, after
pyinfra's own results table (which counts failures but does not name them):

    --> 1 host failed: lab2 (NVIDIA driver | Loaded driver is the installed one)

    from sglang_fleet.report import summary
    summary.failed_hosts_at_exit()      # in a deploy; once per run, however often it is called
"""

from __future__ import annotations

import atexit
from typing import Any

from pyinfra import logger
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import state as current_state

_where: dict[str, str] = {}  # host -> the first operation it failed in
_registered: list[Any] = []  # the state watched (one per process)


class _Failures(BaseStateCallback):
    @staticmethod
    def operation_host_error(state: Any, host: Any, op_hash: Any, retry_count: int = 0,
                             max_retries: int = 0) -> None:
        if retry_count >= max_retries:
            names = state.get_op_meta(op_hash).names
            _where.setdefault(host.name, " | ".join(sorted(names)) or "an operation")


def line(failed: list[str], where: dict[str, str]) -> str | None:
    """The summary line, or None when every host succeeded.

        >>> line(["lab2"], {"lab2": "Gate sglang.service"})
        '--> 1 host failed: lab2 (Gate sglang.service)'
    """
    if not failed:
        return None
    names = ", ".join(f"{h} ({where.get(h, 'could not connect')})" for h in sorted(failed))
    return f"--> {len(failed)} host{'s' if len(failed) > 1 else ''} failed: {names}"


def _report() -> None:
    state = _registered[0]
    text = line([h.name for h in state.failed_hosts], _where)
    if text:
        logger.error(text)


def failed_hosts_at_exit() -> None:
    """Watch this run's operations and name its failed hosts when the process ends."""
    if _registered:
        return
    proxy: Any = current_state
    state = proxy._get_module()  # the run's State itself, not pyinfra's context proxy
    state.add_callback_handler(_Failures())
    _registered.append(state)
    atexit.register(_report)
