"""Errors an operator can act on: each names where the problem is and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra.api.exceptions import PyinfraError


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: ``source`` the file (or data source), ``key`` the dotted
    key path inside it."""

    source: str
    key: str
    message: str
    fix: str

    def __str__(self) -> str:
        source, key = _printable(self.source), _printable(self.key)
        where = f"{source}: {key}" if key else source
        return f"{where}: {self.message}\n    fix: {self.fix}"


def _printable(text: str) -> str:
    """A file name or key as given, unless it holds characters that would break the line."""
    return text if text.isprintable() else repr(text)


class InputError(PyinfraError):
    """Bad input: the CLI prints it and exits 1; pyinfra prints it (no traceback) and stops
    before touching a host."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    @classmethod
    def one(cls, source: str, key: str, message: str, fix: str) -> InputError:
        return cls([Problem(source, key, message, fix)])

    @classmethod
    def raise_any(cls, problems: list[Problem]) -> None:
        if problems:
            raise cls(problems)
