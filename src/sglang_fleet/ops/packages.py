"""Packages the product installed, told apart from those the host had: the first stage to touch
a host records its packages (``BASELINE``), and teardown purges only what is not in it.

    packages_baseline(name="Packages before sglang-fleet")     # before any apt change
    packages_purged(name="Engine packages", owned=[], shared=["python3-venv"])
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents
from pyinfra.operations import files

from sglang_fleet import paths
from sglang_fleet.facts.apt import AptPurgePlan
from sglang_fleet.ops import Ops

BASELINE = f"{paths.BASELINE_DIR}/packages-before"


@operation(is_idempotent=True)
def packages_baseline() -> Ops:
    """Record the host's packages once, before the product installs any (for teardown).

        packages_baseline(name="Packages before sglang-fleet")
    """
    if host.get_fact(File, path=BASELINE):
        host.noop(f"the host's packages were recorded in {BASELINE}")
    else:
        yield (f"install -d -m 755 {paths.BASELINE_DIR} && dpkg-query -W -f '${{Package}}\\n' | "
               f"sort > {BASELINE}.new && mv {BASELINE}.new {BASELINE}")


@operation(is_idempotent=True)
def packages_purged(owned: Sequence[str], shared: Sequence[str] = ()) -> Ops:
    """Purge ``owned`` packages if installed, ``shared`` ones only if the baseline shows the
    product installed them, and what they pulled in that nothing else needs now and the host
    did not have before (apt keeps packages another one merely suggests: they go too).

        packages_purged(name="Engine packages", owned=[], shared=["python3-venv"])
    """
    installed = host.get_fact(DebPackages) or {}  # held ones included
    baseline = {line.strip() for line in host.get_fact(FileContents, path=BASELINE) or []}
    gone = [p for p in owned if p in installed]
    gone += [p for p in shared if p in installed and baseline and p not in baseline]
    if not gone:
        host.noop("none of them installed by sglang-fleet")
        return
    plan = host.get_fact(AptPurgePlan, packages=gone)
    pulled_in = [p for p in plan if p not in gone and baseline and p not in baseline]
    names = shlex.join([*gone, *pulled_in])  # names apt printed reach the shell quoted
    yield (f"apt-mark unhold {names} >/dev/null; DEBIAN_FRONTEND=noninteractive "
           f"apt-get purge -y -q --allow-change-held-packages {names}")


def remove_baseline() -> None:
    """The record of the host's own packages (last: nothing is left to purge against it)."""
    files.directory(name="Package baseline", path=paths.BASELINE_DIR, present=False)
