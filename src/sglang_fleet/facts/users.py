"""The host's people: accounts that can log in, read from the user database as ``login`` reads
it (``getent passwd``: /etc/passwd, LDAP, SSSD alike).

    host.get_fact(LoginUsers)   # ['alice', 'bob']
"""

from __future__ import annotations

from pyinfra.api.facts import FactBase

# login.defs' UID_MIN; systemd's dynamic users start at 61184 and nobody is 65534: neither is a
# person (systemd's "Users, Groups, UIDs and GIDs on systemd Systems").
PEOPLE = range(1000, 60001)
NO_LOGIN = ("nologin", "false", "sync", "shutdown", "halt")


def login_users(lines: list[str]) -> list[str]:
    """The accounts of ``getent passwd`` lines that are people: a UID in login.defs' range and
    a shell that logs in.

    >>> login_users(["root:x:0:0::/root:/bin/bash", "alice:x:1000:1000::/home/alice:/bin/bash",
    ...              "svc:x:1001:1001::/:/usr/sbin/nologin", "bad line"])
    ['alice']
    """
    found = []
    for line in lines:
        fields = line.strip().split(":")
        if len(fields) < 7 or not fields[2].isdigit():
            continue
        shell = fields[6].rsplit("/", 1)[-1]
        if int(fields[2]) in PEOPLE and shell and shell not in NO_LOGIN:
            found.append(fields[0])
    return sorted(set(found))


class LoginUsers(FactBase[list[str]]):
    """The host's accounts that are people (``login_users``)."""

    def command(self) -> str:
        return "getent passwd || cat /etc/passwd"

    def process(self, output: list[str]) -> list[str]:
        return login_users(output)
