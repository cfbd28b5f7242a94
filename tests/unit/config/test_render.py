from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from sglang_fleet.config import flags, profile, releases
from sglang_fleet.config.render import legacy_staging_dir, render, staging_dir
from sglang_fleet.errors import InputError
from tests.conftest import MINIMAL, PROFILES, field_profile

Write = Callable[..., Path]


def pairs(argv: tuple[str, ...]) -> dict[str, str | None]:
    """--flag value pairs of an argv (a switch maps to None)."""
    out: dict[str, str | None] = {}
    words = list(argv[3:])
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[word] = None if nxt is None or nxt.startswith("--") else nxt
    return out


@pytest.fixture(scope="module")
def field() -> profile.Profile:
    return field_profile()


def test_0_5_23_uses_the_radix_cache_flag(field: profile.Profile) -> None:
    launch = render(field, "0.5.23")
    args = pairs(launch.argv)
    assert launch.argv[:3] == ("python", "-m", "sglang.launch_server")
    assert args["--mamba-radix-cache-strategy"] == "extra_buffer"
    assert "--mamba-scheduler-strategy" not in args
    assert args["--speculative-algorithm"] in ("NEXTN", "EAGLE")
    assert (args["--speculative-num-steps"], args["--speculative-eagle-topk"],
            args["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert "SGLANG_ENABLE_SPEC_V2" not in launch.env


def test_0_5_12_uses_the_scheduler_flag(field: profile.Profile) -> None:
    args = pairs(render(field, "0.5.12").argv)
    assert args["--mamba-scheduler-strategy"] == "extra_buffer"
    assert "--mamba-radix-cache-strategy" not in args


def test_0_5_10_sets_spec_v2(field: profile.Profile) -> None:
    assert render(field, "0.5.10").env["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert "SGLANG_ENABLE_SPEC_V2" not in render(field, "0.5.11").env
    wide = replace(field, speculative=replace(field.speculative, eagle_topk=4,
                                              num_draft_tokens=8))
    assert "SGLANG_ENABLE_SPEC_V2" not in render(wide, "0.5.10").env  # v2 takes topk 1 only


@pytest.mark.parametrize("version", ["0.5.14", "0.5.19"])
def test_deprecated_alias_is_never_emitted(field: profile.Profile, version: str) -> None:
    args = pairs(render(field, version).argv)
    assert "--mamba-radix-cache-strategy" in args and "--mamba-scheduler-strategy" not in args


@pytest.mark.parametrize("version", releases.supported())
@pytest.mark.parametrize("path", PROFILES, ids=[p.name for p in PROFILES])
def test_every_emitted_flag_is_spelled_in_full(path: Path, version: str) -> None:
    launch = render(profile.load(path).for_gpus(8, "a test host"), version)
    table = flags.load(version)
    for option in pairs(launch.argv):
        flag = table.get(option)
        assert flag is not None, f"{option} is not a full flag of {version}"
        assert not flag.deprecated and flag.alias_of is None


def test_keys_are_named_never_on_the_command_line(field: profile.Profile) -> None:
    launch = render(field)
    assert "--api-key" not in launch.argv and "--admin-api-key" not in launch.argv
    assert launch.secrets == {"SGLANG_API_KEY": "sglang-api-key"}
    admin = replace(field, server=replace(field.server,
                                          admin_api_key_secret="sglang-admin-api-key"))
    assert render(admin).secrets == {"SGLANG_API_KEY": "sglang-api-key",
                                     "SGLANG_ADMIN_API_KEY": "sglang-admin-api-key"}
    same = replace(field, server=replace(field.server, admin_api_key_secret="sglang-api-key"))
    with pytest.raises(InputError, match="admin_api_key_secret: names the same secret"):
        render(same)


def test_parsed_args_hold_defaults_and_values(field: profile.Profile) -> None:
    args = render(field, "0.5.23").args
    assert args["speculative_num_steps"] == 3
    assert args["mamba_track_interval"] == 256  # the release's default
    assert args["enable_metrics"] is True


def test_shell_format_quotes(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL + "env:\n  NCCL_DEBUG: 'WARN x'\n"))
    shell = render(p).as_shell()
    assert shell.startswith("env NCCL_DEBUG='WARN x' python -m sglang.launch_server")


def test_strategy_unknown_to_release(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL + "mamba:\n  strategy: extra_buffer_lazy\n"))
    render(p, "0.5.14")
    with pytest.raises(InputError) as exc:
        render(p, "0.5.12")
    assert "mamba.strategy" in str(exc.value) and "0.5.12" in str(exc.value)


def extra(write_profile: Write, *args: str) -> InputError:
    body = MINIMAL + "extra_args: [" + ", ".join(f"'{a}'" for a in args) + "]\n"
    p = profile.load(write_profile(body))
    with pytest.raises(InputError) as exc:
        render(p, "0.5.23")
    return exc.value


def test_extra_args_pass_through(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL + "extra_args: ['--cuda-graph-max-bs-decode', '64']\n"))
    launch = render(p, "0.5.23")
    assert launch.argv[-2:] == ("--cuda-graph-max-bs-decode", "64")
    assert launch.args["cuda_graph_max_bs_decode"] == 64


def test_extra_args_abbreviation_refused(write_profile: Write) -> None:
    message = str(extra(write_profile, "--cuda-graph-max-bs", "8"))
    assert "extra_args" in message and "--cuda-graph-max-bs-decode" in message


def test_extra_args_unknown_flag(write_profile: Write) -> None:
    assert "--disable-piecewise-cuda-graph" in str(
        extra(write_profile, "--disable-piecewise-cuda-graph"))


def test_extra_args_removed_flag(write_profile: Write) -> None:
    assert "no flag --mamba-scheduler-strategy" in str(
        extra(write_profile, "--mamba-scheduler-strategy", "extra_buffer"))


def test_extra_args_mistyped_value(write_profile: Write) -> None:
    message = str(extra(write_profile, "--cuda-graph-max-bs-decode", "many"))
    assert "invalid int value: 'many'" in message


def test_extra_args_duplicate_of_profile_key(write_profile: Write) -> None:
    assert "set by the profile" in str(extra(write_profile, "--port", "1"))


def test_extra_args_deprecated_alias(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL + "extra_args: ['--cuda-graph-max-bs', '8']\n"))
    with pytest.raises(InputError) as exc:
        render(p, "0.5.19")
    assert "deprecated" in str(exc.value) and "--cuda-graph-max-bs-decode" in str(exc.value)


@pytest.mark.parametrize(("version", "option"), [("0.5.23", "--smg-grpc-mode"),
                                                   ("0.5.23", "--grpc-mode"),
                                                   ("0.5.12", "--grpc-mode")])
def test_extra_args_grpc_mode_refused(write_profile: Write, version: str, option: str) -> None:
    """gRPC in place of HTTP, as a raw flag: the gate and the router would not know; the
    release's deprecated alias gets the same answer, not a pointer to the new spelling."""
    p = profile.load(write_profile(MINIMAL + f"extra_args: ['{option}']\n"))
    with pytest.raises(InputError) as exc:
        render(p, version)
    message = str(exc.value)
    assert f"{option} makes SGLang {version} serve gRPC in place of HTTP" in message
    assert "set server.router_connection: grpc" in message and "deprecated" not in message


@pytest.mark.parametrize(("body", "refused"), [
    ("server: {api_key_secret: k}\n", "refuses --grpc-port with --api-key"),
    ("server: {admin_api_key_secret: k}\n", "refuses --grpc-port with --api-key"),
    ("parallel: {instances: 2}\n", "one port for every server of a host (parallel.instances 2)"),
    ("", None),
])
def test_extra_args_native_grpc_port(write_profile: Write, body: str, refused: str | None) -> None:
    """SGLang's native gRPC beside HTTP: refused where SGLang refuses it or a second server
    could not bind it; one server without a key takes it as SGLang does."""
    p = profile.load(write_profile(MINIMAL + body + "extra_args: ['--grpc-port', '31000']\n"))
    if refused is None:
        assert render(p, "0.5.23").args["grpc_port"] == 31000
        return
    with pytest.raises(InputError, match=r"extra_args: .*" + re.escape(refused)):
        render(p, "0.5.23")


def test_grpc_port_from_the_environment_held_as_the_flag(write_profile: Write) -> None:
    """SGLANG_GRPC_PORT: --grpc-port's fallback from 0.5.16 on; no meaning before."""
    body = MINIMAL + "server: {api_key_secret: k}\nenv: {SGLANG_GRPC_PORT: '31000'}\n"
    with pytest.raises(InputError, match=r"env.SGLANG_GRPC_PORT: SGLang 0.5.16 refuses "
                                         r"SGLANG_GRPC_PORT with --api-key"):
        render(profile.load(write_profile(body)), "0.5.16")
    assert render(profile.load(write_profile(body)), "0.5.15").env["SGLANG_GRPC_PORT"] == "31000"


def test_instances_get_their_own_port_and_gpus(write_profile: Write) -> None:
    p = profile.load(write_profile(MINIMAL + "parallel: {tp: 2, instances: 4}\n"))
    from sglang_fleet.config.render import render_all

    launches = render_all(p, "0.5.23")
    assert [launch.port for launch in launches] == [30000, 30001, 30002, 30003]
    assert [launch.unit for launch in launches] == [f"sglang-{i}.service" for i in range(4)]
    assert launches[2].env["CUDA_VISIBLE_DEVICES"] == "4,5"
    single = render(profile.load(write_profile(MINIMAL)), "0.5.23")
    assert single.unit == "sglang.service" and "CUDA_VISIBLE_DEVICES" not in single.env


def test_instances_must_fit_the_host(write_profile: Write) -> None:
    from sglang_fleet.config import preflight
    from sglang_fleet.config.render import render_all

    p = profile.load(write_profile(MINIMAL + "parallel: {tp: 4, instances: 3}\n"))
    with pytest.raises(InputError, match="3 instance\\(s\\) of tp x dp = 4 GPUs need 12, b1 has 8"):
        preflight.require_host(p, render_all(p), "b1", 8)
    preflight.require_host(p, render_all(p), "b1", 16)


def test_sources_sharing_a_slug_get_directories_of_their_own(field: profile.Profile) -> None:
    """hf://org/model@v1, s3://org/model/v1 and s3://org/model+v1 all slug to org--model--v1:
    each must still have its own staging directory, so that a change of source stages the new
    weights (and the unit, which names the directory, restarts) instead of serving the old."""
    sources = ["hf://org/model@v1", "s3://org/model/v1", "s3://org/model+v1"]
    paths = [render(field_profile({"model.source": s})).args["model_path"]
             for s in sources]
    assert len(set(paths)) == 3
    assert all(Path(p).name.startswith("org--model--v1-") for p in paths)
    assert len({render(field_profile({"model.source": s})).argv
                for s in sources}) == 3
    # The same objects by another spelling are the same directory.
    assert staging_dir("s3://org/model/v1/") == staging_dir("s3://org/model/v1")
    assert legacy_staging_dir("s3://org/model/v1") == "/var/lib/sglang/models/org--model--v1"


def test_a_long_source_still_makes_a_file_name() -> None:
    name = Path(staging_dir("s3://bucket/" + "/".join(["a" * 200] * 4))).name
    assert len(name) <= 120


def test_router_connection_grpc_renders_grpc_mode_with_its_side_port_clear(
        write_profile: Write) -> None:
    """Each instance's side port (/metrics) is port + 100: SGLang's default, port + 1, is the
    next instance's port. The release's own parser takes the line (render parses it)."""
    p = profile.load(write_profile(MINIMAL + "server: {router_connection: grpc, metrics: true}\n"
                                   "parallel: {instances: 2}\n"))
    launches = [render(p, "0.5.23", i) for i in range(2)]
    assert [launch.args["smg_grpc_mode"] for launch in launches] == [True, True]
    assert [(launch.port, launch.args["smg_http_sidecar_port"]) for launch in launches] == \
        [(30000, 30100), (30001, 30101)]


@pytest.mark.parametrize(("body", "version", "said"), [
    ("server: {router_connection: grpc, metrics: true}\n", "0.5.19",
     "SGLang 0.5.19 cannot serve gRPC to smg"),
    ("server: {router_connection: grpc, metrics: true, api_key_secret: k}\n", "0.5.23",
     "server.api_key_secret: the gRPC port checks no key"),
    ("server: {router_connection: grpc}\n", "0.5.23", "server.metrics: a server in gRPC mode"),
    ("server: {router_connection: grpc, metrics: true}\nparallel: {nnodes: 2}\n", "0.5.23",
     "gRPC to a multi-node group's rank 0 is not offered"),
    ("server: {router_connection: gRPC}\n", "0.5.23", "server.router_connection"),
])
def test_router_connection_grpc_refused_where_it_cannot_serve(
        write_profile: Write, body: str, version: str, said: str) -> None:
    with pytest.raises(InputError) as exc:
        render(profile.load(write_profile(MINIMAL + body)), version)
    assert said in str(exc.value)
