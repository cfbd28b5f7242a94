"""One check for every command that reads a profile (``check``, ``render``, ``check
--inventory``): every problem of every phase in one run.

    report = check_profile("my-profile.yaml", gpus=8)   # .errors, .warnings, .notes, .launch

The phases: read, validate, size for the GPUs, read config.json's architecture, render, apply
SGLang's startup rules. Each runs on what the earlier found valid: a refused key goes on at
its default, and a later problem about it is not said (it would be about the default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sglang_fleet.config import (
    keys,
    model_config,
    preflight,
    profile,
    releases,
    sizing,
    validators,
)
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.render import Launch, render
from sglang_fleet.errors import InputError, Problem

T = TypeVar("T")
DECLARED = {spec.name: spec for spec in keys.declared(Profile)}
MAX_TRIES = 4  # a phase's tries, each with more refused keys at their defaults
AGAIN = "correct the errors above and run check again"
HYBRID_RULES = "SGLang's hybrid-model rules"


@dataclass
class Report:
    """Errors (exit 1), warnings, notes (what was not checked, and why), and the launch."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    profile: Profile | None = None
    launch: Launch | None = None
    architecture: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, problems: Iterable[Problem], defaulted: Iterable[str] = ()) -> None:
        """Each problem once; none about a key standing at its default (``defaulted``)."""
        skip = set(defaulted)
        for problem in problems:
            if problem.key not in skip and problem not in self.errors:
                self.errors.append(problem)

    def note(self, source: str, phase: str, why: str, fix: str = AGAIN) -> None:
        note = Problem(source, phase, why, fix)
        if note not in self.notes:
            self.notes.append(note)


def with_defaults(prof: Profile, names: Iterable[str]) -> Profile:
    """``prof`` with each named key at its declared default (a required one at its stand-in)."""
    for name in sorted(set(names)):
        spec = DECLARED.get(name)
        if spec is None:
            continue
        value: Any = profile.STAND_INS.get(name) if spec.default is keys.REQUIRED \
            else spec.read(spec.default)
        section, _, key = name.partition(".")
        if key:
            part = getattr(prof, section)
            prof = dataclasses.replace(prof, **{section: dataclasses.replace(part,
                                                                              **{key: value})})
        else:
            prof = dataclasses.replace(prof, **{section: value})
    return prof


def _attempt(report: Report, step: Callable[[Profile], T], prof: Profile,
             defaulted: set[str]) -> tuple[Profile, T] | None:
    """``step`` on ``prof``; when it refuses keys, its problems are said and it runs again
    with those keys at their defaults (added to ``defaulted``), so the phase after it still
    runs. None when it cannot run: a problem not about a key, or too many tries."""
    for _ in range(MAX_TRIES):
        current = with_defaults(prof, defaulted)
        try:
            return current, step(current)
        except InputError as err:
            report.add(err.problems, defaulted)
            refused = {p.key for p in err.problems} - defaulted
            if not refused or not refused <= DECLARED.keys():
                return None
            defaulted |= refused
    return None


def check_profile(ref: str | Path, *, version: str | None = None,
                  config: str | None = None, gpus: int = 8,
                  allow_insecure_urls: bool = False) -> Report:
    """Every phase on one profile, for a host of ``gpus`` GPUs, ``version`` (default: its pin)
    and ``config`` (default: model.config, else model.architecture)."""
    report = Report()
    try:
        loaded = profile.load_all(ref, allow_insecure_urls=allow_insecure_urls)
    except InputError as err:  # not read at all: nothing else can run
        report.add(err.problems)
        report.note(str(ref), "", "not checked further: the profile could not be read "
                    "(above)", "correct it and run check again")
        return report
    report.add(loaded.problems)

    def for_the_host(prof: Profile) -> Profile:
        return prof.for_gpus(gpus, f"a host of --gpus {gpus}")

    check_loaded(report, loaded.profile, set(loaded.refused), for_the_host, version, config)
    return report


def check_loaded(report: Report, prof: Profile, defaulted: set[str],
                 resolve: Callable[[Profile], Profile], version: str | None = None,
                 config: str | None = None) -> None:
    """The phases after validation, on a profile whose ``defaulted`` keys stand at their
    defaults (refused, said already); ``resolve`` sizes it for its host (auto instances)."""
    source = prof.path
    report.profile = prof
    if version is None and "engine.version" in defaulted:
        report.note(source, "render, SGLang's startup rules",
                    "not run: engine.version is refused (above), and both are the release's",
                    "correct engine.version, or give --sglang-version")
        _architecture(report, prof, defaulted, config)
        return
    sized = _attempt(report, lambda p: sizing.apply(resolve(p), None), prof, defaulted)
    if sized is None:
        report.note(source, "render, SGLang's startup rules",
                    "not run: the profile could not be sized for the host (above)")
        _architecture(report, prof, defaulted, config)
        return
    rendered = _attempt(report, lambda p: render(p, version), sized[1], defaulted)
    arch, arch_source = _architecture(report, rendered[0] if rendered else sized[1], defaulted,
                                      config)
    if rendered is None:
        report.note(source, "SGLang's startup rules",
                    "not applied: the launch could not be rendered (above)")
        return
    used, launch = rendered
    report.launch = launch
    outside = any(w.startswith("--model-impl") for w in used.extra_args)
    if arch and arch_source and not outside:
        wrong = releases.architecture_problem(arch, launch.version)
        if wrong:
            report.add([Problem(arch_source, "architectures", wrong,
                                "check the model's config.json, or pin a release that "
                                "serves it")])
    report.add(preflight.check(used, launch, arch), defaulted)
    rules = "; ".join(preflight.architecture_rules(launch.version))
    if arch is None and not _unknown_for_a_reason(report, source, defaulted):
        report.warnings.append(Problem(
            source, "model.architecture",
            "no architecture known (no model.architecture, model.config or --model-config), "
            f"so SGLang {launch.version}'s hybrid-model rules were skipped: {rules}",
            "set model.architecture to the architectures[0] of the model's config.json (e.g. "
            "Qwen3_5ForConditionalGeneration), or give its config.json with --model-config"))
    elif arch and outside and releases.architecture_problem(arch, launch.version):
        report.warnings.append(Problem(
            arch_source or used.source_of("model.architecture"),
            "model.architecture" if arch_source is None
            else "architectures",
            f"{arch} is not a class SGLang {launch.version} serves natively (extra_args "
            "--model-impl), so whether it is a hybrid model is unknown and its hybrid-model "
            f"rules were skipped: {rules}",
            "check those rules against the model by hand, or serve it natively"))
    moves = validators.revision_warning(used.model.source)
    if moves:  # valid, but not the same weights on every host: said, not refused
        report.warnings.append(Problem(used.source_of("model.source"), "model.source", moves,
                                       validators.REVISION_FIX))
    shown = sorted(name for name in defaulted if name in DECLARED)
    if shown:
        one = len(shown) == 1
        report.note(source, "render, SGLang's startup rules",
                    f"ran with {', '.join(shown)} at {'its default' if one else 'their defaults'}"
                    f" in place of the refused value{'' if one else 's'} above; the rules that "
                    f"read {'it' if one else 'them'} apply once {'it is' if one else 'they are'}"
                    " corrected")


def _architecture(report: Report, prof: Profile, defaulted: set[str],
                  config: str | None) -> tuple[str | None, str | None]:
    """The model's class and the file it was read from (``config``, else model.config; None
    for model.architecture)."""
    path = config or (prof.model.config if "model.config" not in defaulted else None)
    if not path:
        report.architecture = prof.model.architecture
        return prof.model.architecture, None
    try:
        arch = model_config.architecture(path)
    except InputError as err:
        report.add(err.problems)
        report.note(prof.path, HYBRID_RULES,
                    "not applied: the model's config.json could not be read (above)")
        return None, None
    report.architecture = arch
    return arch, path


def _unknown_for_a_reason(report: Report, source: str, defaulted: set[str]) -> bool:
    """Whether the architecture is unknown for a problem said already (then a note, not the
    warning)."""
    if any(n.key == HYBRID_RULES for n in report.notes):
        return True
    refused = {"model.architecture", "model.config"} & defaulted
    if refused:
        report.note(source, HYBRID_RULES,
                    f"not applied: {' and '.join(sorted(refused))} refused (above)")
    return bool(refused)

