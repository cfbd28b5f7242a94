"""Yes/no host data reads as written (``allow_reboot=no`` is no), and a secret's NAME that is a
key pasted in its place is refused without being shown."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_fleet.config import profile
from sglang_fleet.config.keys import declared
from sglang_fleet.errors import InputError
from sglang_fleet.hostconfig import HostConfig

FLAGS = [k.name for k in declared(HostConfig) if k.types == (bool,) and not k.group]
# As written in a data file, and as pyinfra's --data gives them: "true"/"false" become bools,
# "1"/"0" ints, any other word stays text.
YES = [True, 1, "1", "true", "True", "YES", "yes", "on", "On"]
NO = [False, 0, "0", "false", "FALSE", "no", "No", "off", "OFF"]
WORDS = "true/false, yes/no, on/off or 1/0"


def test_every_yes_no_key_is_found() -> None:
    assert {"allow_reboot", "router_allow_no_key", "allow_insecure_urls",
            "replace_stale_servers", "install_dcgm"} <= set(FLAGS)


@pytest.mark.parametrize("name", FLAGS)
def test_yes_no_keys_read_the_words_as_written(name: str) -> None:
    for value, meant in [*((v, True) for v in YES), *((v, False) for v in NO)]:
        assert getattr(HostConfig.from_data({name: value}, "h"), name) is meant, (name, value)


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("value", ["maybe", "", "yess", "nein", 2, -1, "2", 0.0, 1.0, ["no"],
                                   {"no": 1}])
def test_anything_else_is_refused_naming_the_key_and_the_words(name: str, value: Any) -> None:
    with pytest.raises(InputError) as err:
        HostConfig.from_data({name: value}, "h")
    [problem] = err.value.problems
    assert (problem.source, problem.key) == ("pyinfra data of h", name)
    assert WORDS in problem.message and problem.fix


def test_allow_insecure_urls_yes_allows_plain_http_and_no_does_not() -> None:
    data = {"engine_find_links": "http://wheels.lab/"}
    assert HostConfig.from_data({**data, "allow_insecure_urls": "yes"}, "h").engine_find_links
    with pytest.raises(InputError, match="plain http"):
        HostConfig.from_data({**data, "allow_insecure_urls": "no"}, "h")


HEX = "0123456789abcdef" * 4
PASTED = [HEX, HEX[:32], "sk-" + HEX[:20], "sk-proj-" + HEX[:24], "hf_" + "abcdefghij" * 3,
          "ghp_" + "a1b2c3d4e5" * 3, "8f14e45f-ceea-467f-a9e1-0b3c5d2a7e11",
          "k3jd92mfq0zlx8w7v6b5n4c1"]
NAMES = ["sglang-api-key", "sglang-router-admin-key", "prod.router-key_2", "hf-token-for-b200",
         "deadbeef-key", "qwen3-235b-a22b-key", "a"]


@pytest.mark.parametrize("key", ["router_api_key_secret", "router_admin_api_key_secret"])
@pytest.mark.parametrize("pasted", PASTED)
def test_a_key_shaped_secret_name_is_refused_and_never_shown(key: str, pasted: str) -> None:
    with pytest.raises(InputError) as err:
        HostConfig.from_data({key: pasted}, "h")
    [problem] = err.value.problems
    assert problem.key == key and "NAME of a secret" in problem.message and problem.fix
    assert pasted not in str(err.value)


@pytest.mark.parametrize("pasted", PASTED)
def test_a_key_shaped_name_in_secrets_is_refused_and_never_shown(pasted: str) -> None:
    with pytest.raises(InputError) as err:
        HostConfig.from_data({"secrets": {pasted: "x" * 32}}, "h")
    [problem] = err.value.problems
    assert problem.key == "secrets" and "NAME of a secret" in problem.message and problem.fix
    assert pasted not in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_secret_names_as_people_write_them_pass(name: str) -> None:
    cfg = HostConfig.from_data({"router_api_key_secret": name, "secrets": {name: "x" * 32}}, "h")
    assert (cfg.router_api_key_secret, cfg.secrets) == (name, {name: "x" * 32})


@pytest.mark.parametrize("pasted", PASTED)
def test_a_profile_refuses_a_key_shaped_secret_name(pasted: str) -> None:
    with pytest.raises(InputError) as err:
        profile.load("qwen3.6-27b-mtp", {"server.api_key_secret": pasted})
    assert "NAME of a secret" in str(err.value) and pasted not in str(err.value)
