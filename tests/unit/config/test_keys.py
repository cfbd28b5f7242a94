"""The key declarations (config/profile.py) hold together: each default passes its own key's
checks, each flag is one SGLang has under the destination render asks for, and every key says
what it means."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_fleet.config import flags, keys, profile, releases, render
from sglang_fleet.config.keys import REQUIRED, Located
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.validate import validate_all
from tests.conftest import MINIMAL

DECLARED = keys.declared(Profile)


def test_the_keys_are_found_in_declaration_order() -> None:
    names = [k.name for k in DECLARED]
    assert len(names) == len(set(names)) > 40
    assert names[:2] == ["engine.version", "engine.package"]
    assert names[-3:] == ["warmup", "env", "extra_args"]
    assert "origin" not in names and "path" not in names  # not keys: where the profile came from
    assert keys.top_level(Profile)[-3:] == ["warmup", "env", "extra_args"]


@pytest.mark.parametrize("key", [k for k in DECLARED if k.default is not REQUIRED],
                         ids=lambda k: k.name)
def test_every_default_passes_its_own_key(key: keys.Declared) -> None:
    """Validation takes a missing key's default as it is: it must be a value the key accepts
    (written into the profile, it validates to itself)."""
    section, _, name = key.name.rpartition(".")
    written = list(key.default) if isinstance(key.default, tuple) else key.default  # YAML's
    data: dict[str, Any] = {"model": {"source": "/models/m", "served_name": "m"}}
    if section:
        data.setdefault(section, {})[name] = written
    else:
        data[name] = written
    checked = validate_all(Profile, data, Located("p.yaml"))
    assert not checked.problems
    values = checked.values
    got = getattr(values[section], name) if section else values[name]
    assert got == key.read(key.default)


def test_required_keys_are_the_model_s() -> None:
    assert [k.name for k in DECLARED if k.default is REQUIRED] == ["model.source",
                                                                    "model.served_name"]


@pytest.mark.parametrize("key", [k for k in DECLARED if k.flag], ids=lambda k: k.name)
def test_every_flag_is_the_release_s_spelling_of_its_destination(key: keys.Declared) -> None:
    """The flag a key declares is the pinned release's current spelling of the destination
    render resolves (a renamed one through RENAMED_DESTS), and no release has the flag under
    another destination."""
    assert key.dest is not None and key.flag is not None
    spellings = render.RENAMED_DESTS.get(key.dest, (key.dest,))
    assert spellings[0] == key.dest  # the newest destination first, as render asks for it
    assert flags.load(releases.pinned()).option_for(key.dest) == key.flag
    for version in releases.supported():
        flag = flags.load(version).get(key.flag)
        if flag is not None and not flag.alias_of:
            assert flag.dest in spellings, version


def test_negated_keys_are_the_disable_flags() -> None:
    assert {k.name for k in DECLARED if k.negated} == {
        k.name for k in DECLARED if k.flag and k.flag.startswith("--disable-")}


@pytest.mark.parametrize("key", DECLARED, ids=lambda k: k.name)
def test_every_key_says_what_it_means(key: keys.Declared) -> None:
    assert key.doc[:1].isupper() and key.doc.endswith("."), key.doc
    assert key.type_name


def test_a_minimal_profile_takes_the_declared_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(MINIMAL)
    for key, value in keys.values(profile.load(path)):
        if key.default is not REQUIRED:
            assert value == key.default, key.name
