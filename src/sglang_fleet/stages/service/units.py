"""A server unit's deliberate start, and what to say of the state a deploy finds it in: the
service's own operations, a group's restart (``group_restart``) and a restore alike."""

from __future__ import annotations


def start_command(unit: str) -> str:
    """A deliberate (re)start: the failed state and the start limit are cleared first, so
    deploys, rolls and restores never spend the crash budget (nor find it spent).

        start_command("sglang.service")
        # '(systemctl reset-failed sglang.service 2>/dev/null || true) && systemctl restart ...'
    """
    return f"(systemctl reset-failed {unit} 2>/dev/null || true) && systemctl restart {unit}"


def found_down(unit: str, condition: dict[str, str]) -> str | None:
    """What to say when a deploy finds the unit down by itself (None when it is not).

        >>> found_down("sglang.service", {"ActiveState": "failed", "Result":
        ...            "start-limit-hit", "NRestarts": "5"})
        'sglang.service was found failed (start-limit-hit, 5 automatic restarts): ...'
    """
    restarts = condition.get("NRestarts", "0")
    if condition.get("ActiveState") == "failed":
        return (f"{unit} was found failed ({condition.get('Result')}, {restarts} automatic "
                "restarts): clearing its failed state and start limit, starting it")
    if condition.get("SubState") == "auto-restart":
        return (f"{unit} was found crash-looping ({restarts} automatic restarts so far): "
                "clearing its start limit, starting it")
    return None
