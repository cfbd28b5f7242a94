"""Serving profiles: every key, declared once (``keys.key``), and YAML → validated ``Profile``.

    load("qwen3.6-27b-mtp", overrides={"memory.max_running_requests": 64})

Adding a key is adding its field here, then writing docs/profile.md's table anew:
``uv run python -m sglang_fleet.config.docs --write docs/profile.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_fleet.config import checks, profile_yaml, releases, validators
from sglang_fleet.config.checks import AUTO, MAMBA_STRATEGIES, MAX_INSTANCES
from sglang_fleet.config.keys import Located, key, top_level
from sglang_fleet.config.validate import validate_all
from sglang_fleet.errors import InputError, Problem

BACKEND = "a backend the release accepts, e.g. triton"


@dataclass(frozen=True)
class Engine:
    """What the deploy installs: the release, from which package and index."""

    version: str = key(
        releases.pinned(), check=checks.plain(releases.version_problem),
        doc="The SGLang release installed and rendered for.",
        fix="pin a release listed in src/sglang_fleet/data/releases.json")
    package: str = key(
        "sglang", check=checks.plain(validators.pep508_problem),
        doc="The Python package that provides it (a fork may have its own).",
        fix="a PyPI project name, e.g. sglang")
    extras: tuple[str, ...] = key(
        (), check=checks.each(checks.plain(validators.pep508_problem)),
        doc="The package's extras to install.",
        fix="a list of extras names, e.g. [blackwell]")
    index_url: str | None = key(
        None,  # its form depends on allow_insecure_urls: validate._consistency checks it
        doc="The package index to install from instead of PyPI (https://; plain http only "
        "with allow_insecure_urls).",
        fix="an index URL such as https://pypi.org/simple")
    launcher: str = key(
        "sglang.launch_server", check=checks.plain(validators.module_problem),
        doc="The module the server runs as: python -m MODULE.",
        fix="a module run as python -m MODULE")


@dataclass(frozen=True)
class Model:
    """The weights served and the name clients ask for."""

    source: str = key(
        check=checks.plain(validators.model_source_problem), flag="--model-path",
        doc="Where the weights are: hf://ORG/NAME@REVISION or s3://BUCKET/PREFIX (staged on "
        "the host first) or a host path.",
        fix="write hf://org/name@revision, s3://bucket/prefix or /abs/path")
    served_name: str = key(
        check=checks.plain(validators.served_name_problem), flag="--served-model-name",
        doc="The model id clients send.",
        fix="the model id clients send, e.g. qwen3.6-27b")
    architecture: str | None = key(
        None, check=checks.plain(validators.identifier_problem),
        doc="The model's class, config.json's architectures[0]: checked against the classes "
        "the release serves, and it picks preflight's rules.",
        fix="the architectures[0] value of the model's config.json")
    config: str | None = key(
        None,
        doc="A path to the model's config.json, which preflight (sglang-fleet check) reads.",
        fix="path to the model's config.json, read by preflight")
    trust_remote_code: bool = key(
        False, flag="--trust-remote-code",
        doc="Run the model repository's own Python code.")


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding (MTP); every key but ``algorithm`` needs ``algorithm``."""

    algorithm: str | None = key(
        None, check=checks.plain(validators.word_problem), flag="--speculative-algorithm",
        doc="NEXTN or EAGLE for MTP; null: no speculative decoding.",
        fix="NEXTN or EAGLE for MTP; null turns speculative decoding off")
    num_steps: int | None = key(
        None, check=checks.count(), flag="--speculative-num-steps",
        doc="Draft steps per verification.",
        fix="e.g. 3")
    eagle_topk: int | None = key(
        None, check=checks.count(), flag="--speculative-eagle-topk",
        doc="Draft tokens branched per step.",
        fix="e.g. 1")
    num_draft_tokens: int | None = key(
        None, check=checks.count(2), flag="--speculative-num-draft-tokens",
        doc="Draft tokens verified at once.",
        fix="num_steps + 1 when eagle_topk is 1")


@dataclass(frozen=True)
class Mamba:
    """The state of a hybrid model's mamba (linear attention) layers."""

    strategy: str = key(
        # Spelled --mamba-scheduler-strategy before 0.5.14: render.RENAMED_DESTS has both.
        "auto", check=checks.one_of(*MAMBA_STRATEGIES), flag="--mamba-radix-cache-strategy",
        doc=f"How the radix cache keeps mamba states: {', '.join(MAMBA_STRATEGIES)}; "
        "speculative decoding with the radix cache needs extra_buffer.",
        fix=f"one of {', '.join(MAMBA_STRATEGIES)}")
    track_interval: int | None = key(
        None, check=checks.count(), flag="--mamba-track-interval",
        doc="Tokens between the mamba states the radix cache keeps.",
        fix="a multiple of page_size, at least num_draft_tokens")
    full_memory_ratio: float | None = key(
        None, check=checks.fraction, flag="--mamba-full-memory-ratio",
        doc="Mamba state memory over full KV cache memory.",
        fix="a ratio in (0, 1], e.g. 0.9")


@dataclass(frozen=True)
class Memory:
    """GPU memory and how many requests and tokens it holds."""

    mem_fraction_static: float | None = key(
        None, check=checks.fraction, flag="--mem-fraction-static",
        doc="The share of GPU memory for the weights and caches.",
        fix="a fraction in (0, 1], e.g. 0.85")
    max_running_requests: int | None = key(
        None, check=checks.count(), flag="--max-running-requests",
        doc="The most requests SGLang runs at once.",
        fix="e.g. 48")
    max_mamba_cache_size: int | None = key(
        None, check=checks.count(), flag="--max-mamba-cache-size",
        doc="Mamba state slots, which cap the requests SGLang runs at once.",
        fix="mamba state slots, e.g. 240")
    target_running_requests: int | None = key(
        # Not an SGLang flag: the deploy sizes --max-mamba-cache-size for it (sizing.py).
        None, check=checks.count(),
        doc="Running requests the deploy sizes the mamba cache for, from a first start's log "
        "(not with max_mamba_cache_size).",
        fix="running requests the deploy guarantees, e.g. 48")
    context_length: int | None = key(
        None, check=checks.count(), flag="--context-length",
        doc="The longest request, prompt and output, in tokens.",
        fix="tokens, e.g. 262144")
    page_size: int | None = key(
        None, check=checks.count(), flag="--page-size",
        doc="Tokens per KV cache page.",
        fix="tokens per KV page, e.g. 64")
    chunked_prefill_size: int | None = key(
        None, check=checks.count(-1), flag="--chunked-prefill-size",
        doc="Tokens per prefill chunk; -1: no chunks.",
        fix="tokens per prefill chunk, -1 to disable")


@dataclass(frozen=True)
class Scheduler:
    """How SGLang schedules and computes."""

    radix_cache: bool = key(
        True, flag="--disable-radix-cache", negated=True,
        doc="Reuse the KV cache of shared prompt prefixes.")
    overlap_schedule: bool = key(
        True, flag="--disable-overlap-schedule", negated=True,
        doc="Schedule the next batch while the GPU runs this one.")
    attention_backend: str | None = key(
        None, check=checks.plain(validators.word_problem), flag="--attention-backend",
        doc="The attention kernels.",
        fix=BACKEND)
    linear_attn_backend: str | None = key(
        None, check=checks.plain(validators.word_problem), flag="--linear-attn-backend",
        doc="The linear attention (mamba) kernels.",
        fix=BACKEND)


@dataclass(frozen=True)
class Parallel:
    """How many GPUs one server uses, and how many servers a host runs."""

    # tp and dp had other destinations in older releases: render.RENAMED_DESTS has them.
    tp: int = key(
        1, check=checks.count(), flag="--tp-size",
        doc="GPUs per tensor-parallel group.",
        fix="GPUs per tensor-parallel group")
    dp: int = key(
        1, check=checks.count(), flag="--dp-size",
        doc="Data-parallel replicas in one server.",
        fix="data-parallel replicas")
    nnodes: int = key(
        1, check=checks.count(), flag="--nnodes",
        doc="Hosts one server spans: more than 1 needs the hosts in one host-data "
        "sglang_group, whose inventory order gives each its --node-rank.",
        fix="hosts in one server")
    # Not a flag of its own: rendered into --dist-init-addr RANK0:PORT for each member.
    dist_port: int = key(
        checks.DIST_PORT, check=checks.dist_port,
        doc="With nnodes > 1: the port of rank 0's rendezvous (--dist-init-addr ADDRESS:PORT, "
        "ADDRESS rank 0's sglang_address, else ssh_hostname).",
        fix=f"a free TCP port from 1024 to {checks.EPHEMERAL - 1}, e.g. {checks.DIST_PORT}")
    dist_timeout: int | None = key(
        None, check=checks.count(), flag="--dist-timeout",
        doc="Seconds the ranks wait for one another at the rendezvous (and, from 0.5.11, an "
        "NCCL collective); null: torch's default, 10 minutes for NCCL.",
        fix="seconds, e.g. 900")
    instances: int | str = key(
        # A number, or AUTO until ``Profile.for_gpus`` resolves it for one host.
        1, check=checks.instances,
        doc="Servers per host, each on its own GPUs and port (port + its number); auto: one "
        "per tp x dp GPUs of the host.",
        fix="auto (one server per tp x dp GPUs of each host) or a number of servers per host, "
        f"1 to {MAX_INSTANCES}")

    @property
    def gpus_per_instance(self) -> int:
        return -(-self.tp * self.dp // self.nnodes)  # a share SGLang refuses rounds up

    @property
    def servers(self) -> int:
        """Servers per host, once ``instances: auto`` is resolved (``for_gpus``)."""
        if not isinstance(self.instances, int):
            raise ValueError("parallel.instances is auto: resolve it for a host (for_gpus)")
        return self.instances


@dataclass(frozen=True)
class Parsers:
    """How SGLang reads reasoning and tool calls out of the model's output."""

    reasoning: str | None = key(
        None, check=checks.plain(validators.word_problem), flag="--reasoning-parser",
        doc="The reasoning parser.",
        fix="a reasoning parser the release knows, e.g. qwen3")
    tool: str | None = key(
        None, check=checks.plain(validators.word_problem), flag="--tool-call-parser",
        doc="The tool-call parser.",
        fix="a tool-call parser the release knows, e.g. qwen3_coder")


@dataclass(frozen=True)
class Server:
    """Where the server listens and which keys it asks for."""

    host: str = key(
        "0.0.0.0", check=checks.plain(validators.host_problem), flag="--host",
        doc="The address to listen on.",
        fix="an IP address (0.0.0.0 for every interface) or a host name")
    port: int = key(
        30000, check=checks.port, flag="--port",
        doc="The first server's port; instance N listens on port + N.",
        fix="a TCP port from 1024 to 65535, e.g. 30000")
    # The two keys reach SGLang in-process, never on the command line (render.KEY_FLAGS).
    api_key_secret: str | None = key(
        None, check=checks.secret_name,
        doc="The name of the secret (host data secrets) whose value clients send as the API "
        "key (--api-key).",
        fix="e.g. sglang-api-key")
    admin_api_key_secret: str | None = key(
        None, check=checks.secret_name,
        doc="The name of the secret for SGLang's admin endpoints (--admin-api-key); not the "
        "client one.",
        fix="e.g. sglang-admin-api-key")
    metrics: bool = key(
        False, flag="--enable-metrics",
        doc="Serve Prometheus /metrics.")
    router_connection: str = key(
        "http", check=checks.one_of(*checks.CONNECTIONS),
        doc="How the router reaches the servers: http (SGLang's HTTP API) or grpc (SGLang's "
        "gRPC mode, --smg-grpc-mode: smg tokenizes and parses at the gateway; SGLang 0.5.20 "
        "on, smg only, no key on the servers: host data sglang_allowed_clients required).",
        fix="http or grpc")


@dataclass(frozen=True)
class Profile:
    """One serving setup, described semantically; ``render`` turns it into a command line."""

    path: str
    engine: Engine
    model: Model
    speculative: Speculative
    mamba: Mamba
    memory: Memory
    scheduler: Scheduler
    parallel: Parallel
    parsers: Parsers
    server: Server
    warmup: str = key(
        "compile", check=checks.warmup_mode, accepts=(str, bool),
        parse=lambda value: "off" if value is False else value,  # YAML reads a bare off as false
        doc="What a deploy that changes a serving server's kernels does first, on GPUs no "
        "server uses: off (nothing), compile (the release's precompile) or full (a whole "
        "start).",
        fix="off, compile or full")
    env: Mapping[str, str] = key(
        {}, check=checks.environment,
        doc="More environment variables for the server.",
        fix="UPPER_CASE names with string values")
    extra_args: tuple[str, ...] = key(
        (), check=checks.flag_words,
        doc="Flags no key owns, spelled in full as the release spells them; checked like the "
        "rest.",
        fix="a list of strings, e.g. ['--flag', 'value']")
    origin: Located = field(default_factory=lambda: Located(""), compare=False)

    def source_of(self, key: str) -> str:
        return self.origin.of(key)

    def for_gpus(self, gpus: int, where: str) -> Profile:
        """The profile for a host of ``gpus`` GPUs (``where``: which, for errors): ``instances:
        auto`` becomes one server per tp x dp of them."""
        parallel = self.parallel
        if parallel.instances != AUTO:
            return self
        servers = gpus // parallel.gpus_per_instance
        if parallel.nnodes > 1:  # a member of a multi-node group runs one rank: one unit
            servers = min(servers, 1)
        name = "parallel.instances"
        share = "" if parallel.nnodes == 1 else f" / nnodes {parallel.nnodes}"
        if servers < 1:
            raise InputError.one(self.source_of(name), name,
                                 f"auto: {where} has {gpus} GPU(s), fewer than one server's "
                                 f"tp x dp{share} = {parallel.gpus_per_instance}",
                                 "lower parallel.tp or parallel.dp, or serve from a larger host")
        if self.server.port + servers - 1 > 65535:
            raise InputError.one(self.source_of("server.port"), "server.port",
                                 f"auto: {where}'s {servers} servers would listen up to port "
                                 f"{self.server.port + servers - 1}, above 65535",
                                 f"set server.port to at most {65536 - servers}")
        return replace(self, parallel=replace(parallel, instances=servers))


# What a refused required key stands at while the checks after validation run on the rest
# (``load_all``): no rule reads them, and nothing rendered with them is ever used.
STAND_INS = {"model.source": "/models/stand-in", "model.served_name": "stand-in"}


@dataclass(frozen=True)
class Loaded:
    """Every problem, the keys they refuse, and the profile with those at their defaults."""

    profile: Profile
    problems: list[Problem]
    refused: frozenset[str]


def load_all(path: str | Path, overrides: Mapping[str, Any] | None = None,
             overrides_source: str | Mapping[str, str] = "host data",
             allow_insecure_urls: bool = False) -> Loaded:
    """``load`` without stopping at the values (InputError only for a file not read as a
    mapping). ``overrides_source``: where they were written, for all or by key."""
    path = profile_yaml.locate(path)
    data = profile_yaml.read(path, top_level(Profile))
    located = Located(str(path))
    for name, value in (overrides or {}).items():
        source = overrides_source if isinstance(overrides_source, str) \
            else overrides_source[name]
        profile_yaml.merge(data, {name: value}, source, located)
    checked = validate_all(Profile, data, located, allow_insecure_urls, STAND_INS)
    return Loaded(Profile(path=located.default_source, origin=located, **checked.values),
                  checked.problems, checked.refused)


def load(path: str | Path, overrides: Mapping[str, Any] | None = None,
         overrides_source: str | Mapping[str, str] = "host data",
         allow_insecure_urls: bool = False) -> Profile:
    """Read, merge and validate a profile; InputError naming file, key and fix."""
    loaded = load_all(path, overrides, overrides_source, allow_insecure_urls)
    InputError.raise_any(loaded.problems)
    return loaded.profile
