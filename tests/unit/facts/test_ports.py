"""Who holds a port: ``ss``/``ps``/``/proc`` output as the PortListeners fact reads it."""

from __future__ import annotations

from sglang_fleet.facts.ports import SEP, Listener, parse, unit_of

# /proc/PID/cgroup as read on Debian 12 (cgroup v2) and on an older v1 host.
V2_UNIT = "0::/system.slice/sglang.service"
V2_TEMPLATE = "0::/system.slice/system-sglang.slice/sglang-1.service/init.scope"
V2_SESSION = "0::/user.slice/user-1000.slice/session-4.scope"
V2_TMUX = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/tmux-spawn-1.scope"
V1 = ("12:pids:/system.slice/sglang-router.service|"
      "1:name=systemd:/system.slice/sglang-router.service")


def test_the_unit_comes_from_the_control_group() -> None:
    assert unit_of(V2_UNIT) == "sglang.service"
    assert unit_of(V2_TEMPLATE) == "sglang-1.service"
    assert unit_of(V2_SESSION) is None
    assert unit_of(V2_TMUX) is None  # a user's manager, not a system service
    assert unit_of(V1.replace("|", "\n")) == "sglang-router.service"


def test_listeners_are_parsed_from_the_fact_lines() -> None:
    line = SEP.join(["4242", "alice", "Mon Nov 30  22:40:01 2026", V2_SESSION,
                     "python3 -m sglang.launch_server --port 30000 "])
    unit = SEP.join(["77", "sglang", "Mon Nov 30 22:41:00 2026", V2_UNIT, "python x"])
    assert parse([line, unit, "", "garbage", SEP.join(["x"] * 5)]) == [
        Listener(4242, "alice", "Mon Nov 30 22:40:01 2026", None,
                 "python3 -m sglang.launch_server --port 30000"),
        Listener(77, "sglang", "Mon Nov 30 22:41:00 2026", "sglang.service", "python x")]
    assert "no systemd unit (started by hand)" in parse([line])[0].describe()
