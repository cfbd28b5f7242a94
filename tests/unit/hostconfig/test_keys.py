from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra.api.inventory import Inventory

from sglang_fleet import hostconfig as hostdata
from sglang_fleet.config.keys import declared
from sglang_fleet.errors import InputError
from sglang_fleet.facts.nvidia import Gpu, SmiReport
from sglang_fleet.hostconfig import HostConfig, table
from sglang_fleet.hostconfig.__main__ import main as hostconfig_main
from tests.conftest import FIELD_PROFILE


def inventory(**host_data: object) -> Inventory:
    return Inventory(  # type: ignore[no-untyped-call]
        ([("b200-1", host_data), "b200-2"], {}),
        b200=(["b200-1", "b200-2"], {
            "sglang_profile": str(FIELD_PROFILE), "gpu_count": 8,
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


def smi(count: int, error: str | None = None) -> SmiReport:
    gpus = tuple(Gpu(i, "NVIDIA B200", 183359, "580.95.05", "10.0", True) for i in range(count))
    return SmiReport(() if error else gpus, error)


def test_auto_runs_one_server_per_gpu_set_of_the_host() -> None:
    inv = inventory(**{"sglang.parallel.tp": 2})
    assert hostdata.profile_for(inv.get_host("b200-1")).parallel.instances == 4  # gpu_count 8
    # nvidia-smi, when the deploy is connected to the host, must agree with host data
    assert hostdata.profile_for(inv.get_host("b200-2"), smi(8)).parallel.instances == 8
    with pytest.raises(InputError) as err:
        hostdata.profile_for(inv.get_host("b200-2"), smi(7))
    [problem] = err.value.problems
    assert (problem.source, problem.key) == ("pyinfra data of b200-2", "gpu_count")
    assert "nvidia-smi on b200-2 lists 7 GPU(s), host data says 8" in problem.message
    assert "Xid 79" in problem.fix


def test_auto_counts_the_gpus_nvidia_smi_lists_or_says_what_it_needs() -> None:
    inv = Inventory(([("h1", {"sglang_profile": str(FIELD_PROFILE)})], {}))  # type: ignore[no-untyped-call]
    host = inv.get_host("h1")
    assert hostdata.profile_for(host, smi(4)).parallel.instances == 4
    for given, why in ((None, "read before connecting"),
                       (smi(0, "nvidia-smi is not installed"), "nvidia-smi is not installed")):
        with pytest.raises(InputError) as err:
            hostdata.profile_for(host, given)
        [problem] = err.value.problems
        assert (problem.key, problem.source) == ("parallel.instances", str(FIELD_PROFILE))
        assert why in problem.message and "set gpu_count = 8" in problem.fix


def test_auto_with_fewer_gpus_than_one_server_names_the_levers() -> None:
    inv = inventory(**{"sglang.parallel.tp": 8, "gpu_count": 4})
    with pytest.raises(InputError) as err:
        hostdata.profile_for(inv.get_host("b200-1"))
    [problem] = err.value.problems
    assert "b200-1 (host data gpu_count) has 4 GPU(s), fewer than one server's tp x dp = 8" \
        in problem.message and "parallel.tp" in problem.fix


def test_a_number_of_instances_still_checks_the_gpus_seen() -> None:
    inv = inventory(**{"sglang.parallel.instances": "2"})  # --data gives strings
    host = inv.get_host("b200-1")
    assert hostdata.profile_for(host, smi(8)).parallel.instances == 2
    with pytest.raises(InputError, match="lists 6 GPU"):
        hostdata.profile_for(host, smi(6))


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


def test_every_problem_of_a_host_is_listed_at_once() -> None:
    inv = inventory(gpu_count=0, router_port=443, purge="engine,models",
                    nvidia_driver_version="570.1.1", startup_budget_seconds="ten")
    with pytest.raises(InputError) as err:
        hostdata.profile_for(inv.get_host("b200-1"))
    found = {p.key: p.message for p in err.value.problems}
    assert found == {
        "gpu_count": "must be a positive integer, got 0",
        "startup_budget_seconds": "must be a whole number of seconds from 1 to 86400, got 'ten'",
        "purge": "unknown 'models'",
        "router_port": "must be a port from 1024 to 65535, got 443",
        "nvidia_driver_version": "570.1.1 is not on branch 580",
    }
    assert all(p.source == "pyinfra data of b200-1" and p.fix for p in err.value.problems)


def test_a_host_config_is_built_once_typed_with_its_defaults() -> None:
    host = inventory(router_port=31000, nvidia_driver_branch=590).get_host("b200-1")
    cfg = hostdata.of(host)
    assert hostdata.of(host) is cfg  # built and checked once per host
    assert (cfg.gpu_count, cfg.router_port, cfg.nvidia_driver_branch, cfg.drain_budget_seconds,
            cfg.sglang_overrides) == (8, 31000, "590", 600, {"memory.max_running_requests": 64,
                                                              "memory.page_size": 64})
    assert hostdata.of(inventory().get_host("b200-2")).address == "b200-2"


def test_secret_values_stay_out_of_the_config_and_its_errors() -> None:
    key = "Sk-Live-0123456789abcdef"
    cfg = HostConfig.from_data({"secrets": {"sglang-api-key": key}, "hf_token": "hf_" + key,
                                "aws_access_key_id": "AK" + key,
                                "aws_secret_access_key": "S" + key}, "h")
    assert key not in repr(cfg) and cfg.secrets["sglang-api-key"] == key
    with pytest.raises(InputError) as err:
        HostConfig.from_data({"secrets": {"a": key + " "}, "hf_token": key + "\n",
                              "router_admin_api_key_secret": key}, "h")
    assert key not in str(err.value) and len(err.value.problems) == 3


@pytest.mark.parametrize("bad", [object(), -1, "not this; id", True, ["x y"], {"a": 1}],
                         ids=["object", "-1", "words", "True", "list", "mapping"])
def test_every_check_says_what_is_wrong_and_how_to_fix_it(bad: object) -> None:
    for spec in declared(HostConfig):
        if spec.check is None:
            continue
        try:
            HostConfig.from_data({spec.name: bad}, "h")
        except InputError as err:
            for p in err.problems:
                assert p.source == "pyinfra data of h" and p.message and p.fix, (spec.name, p)


def test_the_table_is_printed_and_written(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert hostconfig_main([]) == 0
    assert capsys.readouterr().out == table.TABLE.text()
    begin, end = table.TABLE.begin, table.TABLE.end
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{begin}\nold\n{end}\n\nafter\n")
    assert hostconfig_main(["--write", str(readme)]) == 0
    assert readme.read_text() == f"# x\n\n{begin}\n{table.TABLE.text()}{end}\n\nafter\n"
    assert hostconfig_main(["--write", str(tmp_path / "none.md")]) == 1
