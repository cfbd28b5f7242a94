"""Packages the product installed, told apart from those the host had: the first stage to touch
a host records its packages (``BASELINE``), and teardown purges only what is not in it.

    packages_baseline(name="Packages before sglang-fleet")     # before any apt change
    packages_purged(name="Engine packages", owned=[], shared=["python3-venv"])
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra.api.operation import operation

from sglang_fleet.ops import Ops, run

BASELINE_DIR = "/var/lib/sglang-fleet"
BASELINE = f"{BASELINE_DIR}/packages-before"


@operation(is_idempotent=True)
def packages_baseline() -> Ops:
    """Record the host's packages once, before the product installs any (for teardown).

        packages_baseline(name="Packages before sglang-fleet")
    """
    ok, _ = run(f"test -f {BASELINE}")
    if not ok:
        yield (f"install -d -m 755 {BASELINE_DIR} && dpkg-query -W -f '${{Package}}\\n' | "
               f"sort > {BASELINE}.new && mv {BASELINE}.new {BASELINE}")


def _lines(command: str) -> list[str]:
    ok, out = run(command)
    return [line.strip() for line in out.stdout_lines if line.strip()] if ok else []


@operation(is_idempotent=True)
def packages_purged(owned: Sequence[str], shared: Sequence[str] = ()) -> Ops:
    """Purge ``owned`` packages if installed, ``shared`` ones only if the baseline shows the
    product installed them, and what they pulled in that nothing else needs now and the host
    did not have before (apt keeps packages another one merely suggests: they go too).

        packages_purged(name="Engine packages", owned=[], shared=["python3-venv"])
    """
    # The second letter of db:Status-Abbrev is the current state ("hi": held and installed).
    installed = {line.split()[0] for line in
                 _lines("dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n'")
                 if len(line.split()) > 1 and line.split()[1][1:2] == "i"}
    baseline = set(_lines(f"cat {BASELINE} 2>/dev/null || true"))
    gone = [p for p in owned if p in installed]
    gone += [p for p in shared if p in installed and baseline and p not in baseline]
    if not gone:
        return
    plan = _lines(f"apt-get -s purge --autoremove --allow-change-held-packages "
                  f"-o APT::AutoRemove::SuggestsImportant=false {' '.join(gone)} "
                  "| sed -n 's/^Purg \\([^ ]*\\).*/\\1/p'")
    pulled_in = [p for p in plan if p not in gone and baseline and p not in baseline]
    names = " ".join([*gone, *pulled_in])
    yield (f"apt-mark unhold {names} >/dev/null; DEBIAN_FRONTEND=noninteractive "
           f"apt-get purge -y -q --allow-change-held-packages {names}")
