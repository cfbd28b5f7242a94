"""The host-data table of docs/host-data.md, made from the declaration (``keys.py``): one row a
key, in declaration order, between two markers in that file.

    print(table())                                    # python -m sglang_fleet.hostconfig
    Path("docs/host-data.md").write_text(with_table(Path("docs/host-data.md").read_text()))
"""

from __future__ import annotations

from typing import Any

from sglang_fleet.hostconfig.keys import HostConfig
from sglang_fleet.hostconfig.spec import declared, default_of

BEGIN = "<!-- host-data:begin -->"  # as config/docs.py marks the profile keys' table
END = "<!-- host-data:end -->"
HEAD = "| host data | default | meaning |\n| --- | --- | --- |\n"


def _default(value: Any) -> str:
    """A default as the table shows it: ``none``, or the value as one would write it."""
    if value is None:
        return "none"
    if isinstance(value, tuple | list):
        return f"`{list(value)!r}`"
    return f"`{value}`" if isinstance(value, bool | int | str) else f"`{value!r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe would end the cell


def rows() -> list[tuple[str, str, str]]:
    """(key, default, meaning) for every declared key.

        rows()[0]     # ('`sglang_profile`', 'none: required on serving hosts', 'the profile ...')
    """
    found = []
    for f, spec in declared(HostConfig):
        name = f"`{f.name}`" + (" (group)" if spec.group else "")
        shown = spec.shown if spec.shown is not None else _default(default_of(f))
        found.append((name, shown, spec.doc))
    return found


def table() -> str:
    """The markdown table, header and rows, ending with a newline."""
    return HEAD + "".join(f"| {' | '.join(_cell(c) for c in row)} |\n" for row in rows())


def in_readme(text: str) -> str | None:
    """What ``text`` holds between the markers (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def with_table(text: str) -> str:
    """``text`` with the table between the markers replaced by the generated one."""
    if in_readme(text) is None:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table()}{END}{rest.split(END, 1)[1]}"
