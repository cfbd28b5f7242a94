from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostdata
from sglang_fleet.errors import InputError
from tests.conftest import FIELD_PROFILE


def inventory(**host_data: object) -> Inventory:
    return Inventory(  # type: ignore[no-untyped-call]
        ([("b200-1", host_data), "b200-2"], {}),
        b200=(["b200-1", "b200-2"], {
            "sglang_profile": str(FIELD_PROFILE),
            "sglang_overrides": {"memory": {"max_running_requests": 64, "page_size": 64}},
        }),
    )


def test_group_overrides_apply_to_every_host() -> None:
    inv = inventory()
    for name in ("b200-1", "b200-2"):
        p = hostdata.profile_for(inv.get_host(name))
        assert p.memory.max_running_requests == 64 and p.memory.page_size == 64


def test_host_overrides_merge_key_by_key_over_group() -> None:
    inv = inventory(sglang_overrides={"memory": {"max_running_requests": 8}},
                    **{"sglang.parallel.tp": 2})
    p = hostdata.profile_for(inv.get_host("b200-1"))
    assert p.memory.max_running_requests == 8
    assert p.memory.page_size == 64  # from the group, not repeated by the host
    assert p.parallel.tp == 2
    assert p.source_of("parallel.tp") == "pyinfra data of b200-1"


def test_bad_override_names_host_and_key() -> None:
    inv = inventory(**{"sglang.memory.max_runing_requests": 8})
    with pytest.raises(InputError) as exc:
        hostdata.profile_for(inv.get_host("b200-1"))
    message = str(exc.value)
    assert message.startswith("pyinfra data of b200-1: memory.max_runing_requests")
    assert "did you mean 'max_running_requests'" in message


def test_missing_profile(tmp_path: Path) -> None:
    inv = Inventory((["h"], {}))  # type: ignore[no-untyped-call]
    with pytest.raises(InputError, match="sglang_profile"):
        hostdata.profile_for(inv.get_host("h"))


@pytest.mark.parametrize("key", ["router_api_key_secret", "router_admin_api_key_secret"])
def test_a_key_in_place_of_a_secret_name_is_masked(key: str) -> None:
    pasted = "Sk-Live-0123456789abcdef"
    with pytest.raises(InputError) as err:
        hostdata.profile_for(inventory(**{key: pasted}).get_host("b200-1"))
    message = str(err.value)
    assert f"{key}: the value is not the NAME of a secret" in message
    assert pasted not in message
