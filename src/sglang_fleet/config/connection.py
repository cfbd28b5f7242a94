"""``server.router_connection: grpc``: SGLang in gRPC mode, as smg reaches it. The server serves
``sglang.grpc.scheduler.SglangScheduler`` on its port in place of HTTP (smg-grpc-servicer), and a
side port serves ``/metrics`` (``--smg-http-sidecar-port``; its default, port + 1, is the next
instance's port here).

    grpc_args(profile, table, 0, problems)
    # ['--smg-grpc-mode', '--smg-http-sidecar-port', '30100']
"""

from __future__ import annotations

from sglang_fleet.config import flags
from sglang_fleet.config.profile import Profile
from sglang_fleet.config.releases import at_least
from sglang_fleet.errors import InputError, Problem

KEY = "server.router_connection"
# The servicer an install resolves today (smg-grpc-servicer 0.14.1) imports names SGLang has
# only from 0.5.19, and breaks 0.5.19's GetServerInfo (its ServerArgs is no msgspec struct).
GRPC_FROM = "0.5.20"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
SIDECAR_OFFSET = 100  # instance N's side port: port + N + 100, clear of the instances' ports
# Over gRPC the gateway, not the server, reads the think block and the tool calls: smg 1.13.0's
# name for the parser that reads the format SGLang's does (SGLang 0.5.23
# parser/reasoning_parser.py DetectorMap, function_call/function_call_parser.py ToolCallParser;
# smg's crates/reasoning_parser and crates/tool_parser/src/factory.rs). A name missing here has
# no smg parser known to read the same format.
SMG_REASONING = {"qwen3": "qwen3", "qwen3-thinking": "qwen3_thinking",
                 "deepseek-r1": "deepseek_r1", "glm45": "glm45", "kimi": "kimi",
                 "step3": "step3", "gemma4": "gemma4", "minimax": "minimax"}
SMG_TOOL = {"qwen3_coder": "qwen_coder", "qwen": "qwen", "qwen25": "qwen",
            "pythonic": "pythonic", "mistral": "mistral", "llama3": "llama",
            "deepseekv3": "deepseek", "deepseekv31": "deepseek31", "deepseekv32": "deepseek32",
            "glm45": "glm45_moe", "glm47": "glm47_moe", "kimi_k2": "kimik2",
            "kimi_k3": "kimi_k3", "step3": "step3", "minimax-m2": "minimax_m2"}


def grpc(profile: Profile) -> bool:
    return profile.server.router_connection == "grpc"


def sidecar_port(port: int) -> int:
    """The side port (its ``/metrics``) of a gRPC-mode server on ``port``."""
    return port + SIDECAR_OFFSET


def metrics_url(url: str) -> str:
    """Where a server's Prometheus ``/metrics`` is: under its own URL, or, for one in gRPC
    mode (``grpc://HOST:PORT``), on its side port over HTTP.

        >>> metrics_url("grpc://10.0.0.11:30001"), metrics_url("http://10.0.0.11:30001/")
        ('http://10.0.0.11:30101/metrics', 'http://10.0.0.11:30001/metrics')
    """
    if not url.startswith("grpc://"):
        return f"{url.rstrip('/')}/metrics"
    where, _, port = url.removeprefix("grpc://").rstrip("/").rpartition(":")
    return f"http://{where}:{sidecar_port(int(port))}/metrics"


def require_filter(profile: Profile, allowed_clients: tuple[str, ...], source: str) -> None:
    """InputError unless servers in gRPC mode that other hosts reach keep them off with host
    data ``sglang_allowed_clients``: their port checks no key."""
    if grpc(profile) and not allowed_clients and profile.server.host not in LOOPBACK:
        raise InputError.one(source, "sglang_allowed_clients",
                             f"the servers are in gRPC mode ({KEY}: grpc), whose port checks no "
                             f"key: anyone who reaches port {profile.server.port} on "
                             f"{profile.server.host} could use them",
                             "set sglang_allowed_clients to the router's and the operators' "
                             "networks, e.g. ['10.0.0.0/24'], or bind server.host to 127.0.0.1")


def gateway_args(profile: Profile, problems: list[Problem] | None = None) -> list[str]:
    """smg's parser flags for a profile's servers in gRPC mode (none over HTTP, where each
    server parses its own answers); a parser smg cannot stand in for is a problem.

        >>> from sglang_fleet.config.profile import load
        >>> gateway_args(load("qwen3.6-27b-mtp", {KEY: "grpc"}))
        ['--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen_coder']
    """
    if not grpc(profile):
        return []
    args = []
    for key, flag, table in (("parsers.reasoning", "--reasoning-parser", SMG_REASONING),
                             ("parsers.tool", "--tool-call-parser", SMG_TOOL)):
        name = getattr(profile.parsers, key.split(".")[1])
        if name and name in table:
            args += [flag, table[name]]
        elif name and problems is not None:
            problems.append(Problem(profile.source_of(key), key,
                                    f"over gRPC the gateway parses answers, and smg has no "
                                    f"parser known to read what SGLang's {name!r} reads",
                                    f"use one of {', '.join(sorted(table))}, or set {KEY}: http"))
    return args


def grpc_args(profile: Profile, table: flags.FlagTable, instance: int,
              problems: list[Problem]) -> list[str]:
    if not grpc(profile):
        return []
    source = profile.source_of(KEY)
    before = len(problems)
    if not at_least(table.version, GRPC_FROM):
        problems.append(Problem(source, KEY, f"SGLang {table.version} cannot serve gRPC to smg: "
                                "the smg-grpc-servicer it installs today serves "
                                f"{GRPC_FROM} and later",
                                f"pin SGLang {GRPC_FROM} or later, or set {KEY}: http"))
    for key in ("server.api_key_secret", "server.admin_api_key_secret"):
        if getattr(profile.server, key.split(".")[1]):
            problems.append(Problem(profile.source_of(key), key,
                                    "the gRPC port checks no key (smg-grpc-servicer binds it "
                                    "insecure and reads no call metadata): it would protect "
                                    "nothing",
                                    f"remove {key}: host data sglang_allowed_clients keeps "
                                    "other hosts off the servers, and the router keeps its own "
                                    f"key; or set {KEY}: http"))
    if not profile.server.metrics:
        problems.append(Problem(profile.source_of("server.metrics"), "server.metrics",
                                "a server in gRPC mode answers no HTTP but its side port's "
                                "/metrics, which the roll's drain and status read",
                                "set server.metrics: true"))
    if profile.parallel.nnodes > 1:
        problems.append(Problem(source, KEY, "gRPC to a multi-node group's rank 0 is not "
                                "offered", f"set {KEY}: http for parallel.nnodes > 1"))
    gateway_args(profile, problems)
    if len(problems) > before:
        return []
    port = profile.server.port + instance
    return ["--smg-grpc-mode", "--smg-http-sidecar-port", str(sidecar_port(port))]
