"""What apt would do, asked without doing it.

    host.get_fact(AptPurgePlan, packages=["nvidia-open-580"])  # ['nvidia-open-580', ...]
"""

from __future__ import annotations

import re
import shlex

from pyinfra.api.facts import FactBase

_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.:-]*")


class AptPurgePlan(FactBase[list[str]]):
    """The packages ``apt-get purge --autoremove`` of ``packages`` would remove (a simulation:
    nothing changes). Packages another one merely suggests are not kept."""

    default = list

    def command(self, packages: list[str]) -> str:
        names = [p for p in packages if _PACKAGE.fullmatch(p)]  # they reach a shell
        return ("apt-get -s purge --autoremove --allow-change-held-packages "
                f"-o APT::AutoRemove::SuggestsImportant=false {shlex.join(names)} 2>/dev/null "
                "| sed -n 's/^Purg \\([^ ]*\\).*/\\1/p'")

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
