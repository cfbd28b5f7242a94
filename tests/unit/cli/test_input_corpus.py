"""Every bad input gets a named error: a table of malformed and hostile inputs to ``check``,
``render``, ``smoke``, ``roll`` and host data, each with the fragment its message must hold.

Each case must exit 1 with ``error: SOURCE: ...`` (and a ``fix:`` line for input problems), or,
for an option whose value is wrong as written (a release, a URL, a count, a ``--data`` pair),
exit 2 with argparse's ``usage:`` and the problem; never exit 0 (silently accepted), never
print a traceback and never exit 3 (a bug).
"""

from __future__ import annotations

import copy
import json
import os
import socketserver
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyinfra.api.inventory import Inventory

from sglang_fleet import cli
from sglang_fleet import hostconfig as hostdata
from sglang_fleet.errors import InputError
from tests.conftest import FIELD_PROFILE, ROOT, free_port

BASE: dict[str, Any] = {
    "engine": {"version": "0.5.23"},
    "model": {"source": "hf://Qwen/Qwen3.6-27B@main", "served_name": "qwen3.6-27b",
              "architecture": "Qwen3_5ForConditionalGeneration"},
    "speculative": {"algorithm": "NEXTN", "num_steps": 3, "eagle_topk": 1,
                    "num_draft_tokens": 4},
    "mamba": {"strategy": "extra_buffer"},
    "server": {"port": 30000},
}
DROP = object()


def prof(changes: dict[str, Any] | None = None) -> str:
    """BASE with dotted keys changed (DROP removes one), as YAML text."""
    data = copy.deepcopy(BASE)
    for dotted, value in (changes or {}).items():
        section, _, key = dotted.partition(".")
        if not key:
            data[section] = value
        elif value is DROP:
            data.setdefault(section, {}).pop(key, None)
        else:
            data.setdefault(section, {})[key] = value
    return yaml.safe_dump(data, allow_unicode=True)


def extra(*words: Any, **changes: Any) -> str:
    return prof({"extra_args": list(words), **changes})


@dataclass(frozen=True)
class Case:
    """``profile`` (text or bytes; None: no profile file) goes to ``args`` as {profile};
    ``files`` are written beside it and named in args as {name}."""

    name: str
    args: tuple[str, ...]
    expect: str
    profile: str | bytes | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)
    fix: bool = True  # input problems carry a fix line; a server's answer is one line
    usage: bool = False  # a usage error: exit 2, argparse's usage and the problem


def check(name: str, profile: str | bytes, expect: str, *more: str) -> Case:
    return Case(name, ("check", "{profile}", *more), expect, profile)


def check_usage(name: str, expect: str, *more: str) -> Case:
    """An option of ``check`` that is wrong as written: exit 2 before the profile is read."""
    return Case(name, ("check", "{profile}", *more), expect, prof(), usage=True)


def render(name: str, profile: str | bytes, expect: str, *more: str) -> Case:
    return Case(name, ("render", "{profile}", *more), expect, profile)


def config(name: str, content: str | bytes, expect: str) -> Case:
    return Case(name, ("check", "{profile}", "--model-config", "{config.json}"), expect,
                prof(), {"config.json": content})


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8))
NAN, INF = float("nan"), float("inf")

PROFILE_CASES = [
    # Encoding, size and YAML structure.
    check("latin-1", prof().replace("qwen3.6-27b", "caf\xe9").encode("latin-1"),
          "not UTF-8: byte 0xe9"),
    check("utf-16 with BOM", prof().encode("utf-16"), "UTF-16"),
    check("utf-16 without BOM", prof().encode("utf-16-le"), "NUL bytes"),
    check("utf-32", prof().encode("utf-32"), "UTF-32"),
    check("binary garbage", bytes(range(128, 256)) * 4, "not UTF-8"),
    check("integer key", prof() + "1: x\n", "not a string"),
    check("null key", prof() + "~: x\n", "not a string"),
    check("boolean key", prof() + "yes: x\n", "not a string"),
    check("integer key in a section", prof() + "memory:\n  1: 2\n", "not a string"),
    check("list key", prof() + "? [a, b]\n: x\n", "not a string"),
    check("20000 nested [", "a: " + "[" * 20000, "nested deeper"),
    check("20000 nested {", "a: " + "{x: " * 20000, "nested deeper"),
    check("alias bomb", ALIAS_BOMB, "aliases"),
    check("one alias", prof() + "x: &v 1\ny: *v\n", "aliases"),
    check("merge key", prof() + "base: &b {page_size: 64}\nmemory:\n  <<: *b\n", "aliases"),
    check("duplicate section", prof() + "memory: {page_size: 64}\nmemory: {page_size: 1}\n",
          "duplicate key 'memory'"),
    check("duplicate key", prof() + "memory:\n  mem_fraction_static: 0.8\n"
          "  mem_fraction_static: 0.9\n", "duplicate key 'mem_fraction_static'"),
    check("duplicate key keeps context_length", prof() + "memory:\n  context_length: 1024\n"
          "  context_length: 2048\n", "the second would silently replace it"),
    Case("/dev/zero", ("check", "/dev/zero"), "larger than 256 KiB"),
    check("a 300 KiB profile", prof() + "# padding\n" * 30000, "larger than 256 KiB"),
    Case("a directory", ("check", str(ROOT)), "cannot read the profile"),
    Case("no such file", ("check", "/nonexistent/p.yaml"), "No such file"),
    check("unclosed quote", prof() + 'x: "abc\n', "not valid YAML"),
    check("tab indentation", "model:\n\tsource: x\n", "not valid YAML"),
    check("top-level list", "- a\n- b\n", "the top level must be a mapping"),
    check("top-level scalar", "just words\n", "the top level must be a mapping"),
    check("control character in YAML", prof() + "x: a\x07b\n", "not valid YAML"),
    check("python tag", prof() + "x: !!python/object/apply:os.system [id]\n",
          "not valid YAML"),
    check("empty profile", "", "model.source: is required"),
    check("binary value", prof({"model.served_name": DROP}).replace(
        "model:\n", "model:\n  served_name: !!binary aGk=\n"), "must be a string"),
    check("section is a list", prof({"memory": [1, 2]}), "must be a mapping"),
    check("section is a string", prof({"memory": "lots"}), "must be a mapping"),
    check("unknown section", prof({"servr": {"port": 1}}), "did you mean 'server'"),
    check("unknown key", prof({"memory.page_sise": 64}), "did you mean 'page_size'"),
    check("a 100 KiB key", prof({"memory." + "k" * 100_000: 1}), "memory.kkk"),
    check("a key with a newline", prof({"memory.a\nb": 1}), "'memory.a\\nb'"),
    # Numbers: type, range, finiteness.
    check("mem_fraction_static nan", prof({"memory.mem_fraction_static": NAN}), "finite"),
    check("mem_fraction_static inf", prof({"memory.mem_fraction_static": INF}), "finite"),
    check("mem_fraction_static -inf", prof({"memory.mem_fraction_static": -INF}), "finite"),
    check("mem_fraction_static 1.5", prof({"memory.mem_fraction_static": 1.5}), "at most 1"),
    check("mem_fraction_static 0", prof({"memory.mem_fraction_static": 0}), "greater than 0"),
    check("mem_fraction_static a string", prof({"memory.mem_fraction_static": "0.8"}),
          "must be a number"),
    check("mem_fraction_static true", prof({"memory.mem_fraction_static": True}),
          "must be a number"),
    check("full_memory_ratio nan", prof({"mamba.full_memory_ratio": NAN}), "finite"),
    check("full_memory_ratio 2", prof({"mamba.full_memory_ratio": 2}), "at most 1"),
    check("context_length inf", prof({"memory.context_length": INF}), "must be an integer"),
    check("context_length 0", prof({"memory.context_length": 0}), "at least 1"),
    check("context_length 2**40", prof({"memory.context_length": 2**40}), "at most 2147483647"),
    check("context_length negative", prof({"memory.context_length": -5}), "at least 1"),
    check("context_length words", prof({"memory.context_length": "lots"}), "must be an integer"),
    check("context_length 1.5", prof({"memory.context_length": 1.5}), "must be an integer"),
    check("chunked_prefill_size -2", prof({"memory.chunked_prefill_size": -2}), "at least -1"),
    check("page_size a list", prof({"memory.page_size": [64]}), "must be an integer"),
    check("max_running_requests 0", prof({"memory.max_running_requests": 0}), "at least 1"),
    check("target_running_requests 0", prof({"memory.target_running_requests": 0}),
          "at least 1"),
    check("target_running_requests negative", prof({"memory.target_running_requests": -48}),
          "at least 1"),
    check("target_running_requests 2**31", prof({"memory.target_running_requests": 2**31}),
          "at most 2147483647"),
    check("target_running_requests 1.5", prof({"memory.target_running_requests": 1.5}),
          "must be an integer"),
    check("target_running_requests a string", prof({"memory.target_running_requests": "48"}),
          "must be an integer"),
    check("target_running_requests true", prof({"memory.target_running_requests": True}),
          "must be an integer"),
    check("target_running_requests nan", prof({"memory.target_running_requests": NAN}),
          "must be an integer"),
    check("target_running_requests a list", prof({"memory.target_running_requests": [48]}),
          "must be an integer"),
    check("target with max_mamba_cache_size",
          prof({"memory": {"target_running_requests": 48, "max_mamba_cache_size": 24}}),
          "memory.max_mamba_cache_size: is set with memory.target_running_requests"),
    check("target above max_running_requests",
          prof({"memory": {"target_running_requests": 48, "max_running_requests": 16}}),
          "16 is below memory.target_running_requests 48"),
    render("target as an extra flag", extra("--target-running-requests", "48"),
           "has no flag --target-running-requests"),
    check("tp 0", prof({"parallel.tp": 0}), "at least 1"),
    check("tp 1.5", prof({"parallel.tp": 1.5}), "must be an integer"),
    check("instances 0", prof({"parallel.instances": 0}), "at least 1"),
    check("instances 65", prof({"parallel.instances": 65}), "at most 64"),
    check("instances not auto", prof({"parallel.instances": "automatic"}),
          "must be auto or a number"),
    check("instances a float", prof({"parallel.instances": 2.5}), "must be an integer or a string"),
    check("trust_remote_code a string", prof({"model.trust_remote_code": "yes"}),
          "must be true/false"),
    check("radix_cache 1", prof({"scheduler.radix_cache": 1}), "must be true/false"),
    check("metrics a string", prof({"server.metrics": "true"}), "must be true/false"),
    # Ports and the listen address.
    check("port 65535 with two instances", prof({"server.port": 65535, "parallel.instances": 2}),
          "65536"),
    check("port 80", prof({"server.port": 80}), "privileged"),
    check("port 0", prof({"server.port": 0}), "privileged"),
    check("port 70000", prof({"server.port": 70000}), "at most 65535"),
    check("port a string", prof({"server.port": "30000"}), "must be an integer"),
    check("port nan", prof({"server.port": NAN}), "must be an integer"),
    check("host words", prof({"server.host": "not a host!"}), "neither an IP address"),
    check("host empty", prof({"server.host": ""}), "is empty"),
    check("host with a command", prof({"server.host": "0.0.0.0; id"}), "neither an IP address"),
    check("host 300.1.1.1", prof({"server.host": "300.1.1.1"}), "neither an IP address"),
    check("host with a space", prof({"server.host": "exa mple.com"}), "neither an IP address"),
    check("host an integer", prof({"server.host": 10}), "must be a string"),
    # Speculative decoding.
    check("num_steps without an algorithm", prof({"speculative.algorithm": None}),
          "speculative.algorithm is null"),
    check("eagle_topk without an algorithm", prof({"speculative": {"eagle_topk": 1}}),
          "speculative.algorithm is null"),
    check("num_draft_tokens without an algorithm", prof({"speculative": {"num_draft_tokens": 4}}),
          "speculative.algorithm is null"),
    check("algorithm MTP", prof({"speculative.algorithm": "MTP"}),
          "Unknown speculative algorithm"),
    check("algorithm with a command", prof({"speculative.algorithm": "NEXTN; id"}),
          "is not a name"),
    check("a refused algorithm is not called null", prof({"speculative.algorithm": "a b"}),
          "is not a name"),
    check("num_draft_tokens 1", prof({"speculative.num_draft_tokens": 1}), "at least 2"),
    check("mamba strategy unknown", prof({"mamba.strategy": "fast"}), "must be one of"),
    # Architectures the release does not know.
    check("architecture misspelled", prof({"model.architecture": "Qwen3_5ForConditionalGeneraton"}),
          "did you mean Qwen3_5ForConditionalGeneration"),
    check("architecture unknown", prof({"model.architecture": "Llama"}), "has no model class"),
    check("architecture with a space", prof({"model.architecture": "Qwen 3"}),
          "not a Python class name"),
    check("architecture newer than the release", prof({"model.architecture": "Qwen3_5ForCausalLM"}),
          "SGLang 0.5.12 has no model class", "--sglang-version", "0.5.12"),
    check("architecture an integer", prof({"model.architecture": 7}), "must be a string"),
    # Strings: control characters, expansions, forms (issue 11).
    check("served_name ${VAR}", prof({"model.served_name": "${SGLANG_API_KEY}"}), "'${'"),
    check("served_name $(cmd)", prof({"model.served_name": "$(id)"}), "'$('"),
    check("served_name backticks", prof({"model.served_name": "`id`"}), "'`'"),
    check("served_name newline", prof({"model.served_name": "a\nb"}), "U+000A, a newline"),
    check("served_name trailing newline", prof({"model.served_name": "qwen\n"}),
          "U+000A, a newline"),
    check("served_name NUL", prof({"model.served_name": "a\x00b"}), "U+0000"),
    check("served_name line separator", prof({"model.served_name": "a\u2028b"}), "U+2028"),
    check("served_name escape", prof({"model.served_name": "a\x1b[31mb"}), "U+001B"),
    check("served_name with a space", prof({"model.served_name": "a b"}), "is not a model name"),
    check("served_name percent", prof({"model.served_name": "x%n"}), "is not a model name"),
    check("served_name quote", prof({"model.served_name": "x'y"}), "is not a model name"),
    check("served_name 2024", prof({"model.served_name": 2024}), "quote it"),
    check("served_name a date", prof({"model.served_name": DROP}).replace(
        "model:\n", "model:\n  served_name: 2024-01-01\n"), 'served_name: "2024-01-01"'),
    check("served_name empty", prof({"model.served_name": ""}), "is empty"),
    check("served_name spaces only", prof({"model.served_name": "   "}), "only whitespace"),
    check("served_name 5000 characters", prof({"model.served_name": "x" * 5000}),
          "at most 4096"),
    check("served_name 1 MiB", prof({"model.served_name": "x" * 200_000}),
          "at most 4096"),
    check("served_name missing", prof({"model.served_name": DROP}),
          "model.served_name: is required"),
    check("source with a command", prof({"model.source": "/models/x; touch /tmp/p; #"}),
          "characters a model path never needs"),
    check("source relative", prof({"model.source": "models/x"}), "is not hf://"),
    check("source without a revision", prof({"model.source": "hf://Qwen/Qwen3.6-27B"}),
          "no pinned revision"),
    check("source hf path escape", prof({"model.source": "hf://Qwen/../x@main"}),
          "must be ORG/NAME"),
    check("source hf revision command", prof({"model.source": "hf://Qwen/x@main;id"}),
          "the revision must be"),
    check("source hf three parts", prof({"model.source": "hf://a/b/c@main"}),
          "must be ORG/NAME"),
    check("source bad bucket", prof({"model.source": "s3://Bucket_Bad/x"}),
          "not an S3 bucket name"),
    check("source s3 dot-dot", prof({"model.source": "s3://bucket/a/../b"}),
          "'..' is not allowed"),
    check("source path with a space", prof({"model.source": "/models/a b"}),
          "characters a model path never needs"),
    check("source $(cmd)", prof({"model.source": "/models/$(id)"}), "'$('"),
    check("source newline", prof({"model.source": "/models/x\n"}), "U+000A"),
    check("source root", prof({"model.source": "/"}), "not a model directory"),
    check("source file URL", prof({"model.source": "file:///models/x"}), "is not hf://"),
    check("source empty part", prof({"model.source": "/models//x"}), "empty path part"),
    check("source percent", prof({"model.source": "/models/%h"}),
          "characters a model path never needs"),
    check("source glob", prof({"model.source": "/models/*"}),
          "characters a model path never needs"),
    check("package with a command", prof({"engine.package": "sglang; rm -rf /"}),
          "not a package name"),
    check("package with a version", prof({"engine.package": "sglang==0.5"}), "PEP 508"),
    check("package URL", prof({"engine.package": "https://x/y.whl"}), "PEP 508"),
    check("package empty", prof({"engine.package": ""}), "is empty"),
    check("extras with a space", prof({"engine.extras": ["all", "x y"]}), "not a package name"),
    check("extras a string", prof({"engine.extras": "all"}), "must be a list"),
    check("extras integers", prof({"engine.extras": [1]}), "a list of strings"),
    check("launcher with a command", prof({"engine.launcher": "sglang.launch_server; id"}),
          "not a Python module name"),
    check("version 0.5.9", prof({"engine.version": "0.5.9"}), "not a supported release"),
    check("version a path", prof({"engine.version": "../flags/0.5.23"}),
          "not a supported release"),
    check("version a float", prof({"engine.version": 0.5}), "quote it"),
    check("index_url http", prof({"engine.index_url": "http://pypi.example/simple"}),
          "plain http"),
    check("index_url ftp", prof({"engine.index_url": "ftp://x/simple"}), "not an http(s) URL"),
    check("index_url credentials", prof({"engine.index_url": "https://u:p@x.org/simple"}),
          "holds credentials"),
    check("index_url empty", prof({"engine.index_url": ""}), "is empty"),
    check("index_url without host", prof({"engine.index_url": "https://"}), "no valid host"),
    check("index_url with a space", prof({"engine.index_url": "https://x.org/a b"}),
          "must not hold"),
    check("reasoning parser with a flag", prof({"parsers.reasoning": "qwen3 --api-key x"}),
          "is not a name"),
    check("tool parser with a semicolon", prof({"parsers.tool": "a;b"}), "is not a name"),
    check("attention backend expansion", prof({"scheduler.attention_backend": "${X}"}), "'${'"),
    check("env lower-case name", prof({"env": {"lower": "x"}}), "invalid variable names"),
    check("env name with a dash", prof({"env": {"A-B": "x"}}), "invalid variable names"),
    check("env value newline", prof({"env": {"A": "x\ny"}}), "U+000A"),
    check("env value NUL", prof({"env": {"A": "x\x00"}}), "U+0000"),
    check("env value integer", prof({"env": {"A": 1}}), "mapping of strings"),
    check("env SGLANG_API_KEY", prof({"env": {"SGLANG_API_KEY": "x"}}), "set by the product"),
    check("env value $(cmd)", prof({"env": {"A": "$(id)"}}), "'$('"),
    check("env a list", prof({"env": ["A=1"]}), "must be a mapping"),
    check("env CUDA_VISIBLE_DEVICES with instances",
          prof({"env": {"CUDA_VISIBLE_DEVICES": "0"}, "parallel.instances": 2, "parallel.tp": 1}),
          "set per instance"),
    check("api_key_secret holds a key", prof({"server.api_key_secret": "sk-LIVE-1234567890"}),
          "NAME of a secret"),
    check("config path newline", prof({"model.config": "/m/config.json\n"}), "U+000A"),
    # extra_args.
    check("extra_args --api-key", extra("--api-key", "secret"), "server.api_key_secret"),
    check("extra_args --api-key=", extra("--api-key=secret"), "would write the key"),
    check("extra_args --admin-api-key", extra("--admin-api-key", "x"), "server.api_key_secret"),
    check("extra_args contradicts overlap", extra("--disable-overlap-schedule"),
          "set scheduler.overlap_schedule: false"),
    check("extra_args contradicts radix cache", extra("--disable-radix-cache"),
          "set scheduler.radix_cache: false"),
    check("extra_args repeats a false key",
          extra("--disable-overlap-schedule", **{"scheduler.overlap_schedule": False}),
          "renders it already"),
    check("extra_args mem fraction", extra("--mem-fraction-static", "0.5"),
          "set memory.mem_fraction_static: 0.5"),
    check("extra_args metrics", extra("--enable-metrics"), "set server.metrics: true"),
    check("extra_args gRPC mode", extra("--smg-grpc-mode"), "serve gRPC in place of HTTP"),
    check("extra_args gRPC port on every server",
          extra("--grpc-port", "31000", **{"parallel.instances": 2}),
          "the second to start cannot bind it"),
    check("extra_args gRPC port beside the key",
          extra("--grpc-port", "31000", **{"server.api_key_secret": "k"}),
          "bypasses HTTP auth middleware"),
    check("extra_args served name", extra("--served-model-name", "x"), "model.served_name"),
    check("extra_args model path", extra("--model-path", "/x"), "model.source"),
    check("extra_args tp", extra("--tp-size", "2"), "parallel.tp"),
    check("extra_args tp alias", extra("--tensor-parallel-size", "2"), "parallel.tp"),
    check("extra_args algorithm", extra("--speculative-algorithm", "EAGLE"),
          "speculative.algorithm"),
    check("extra_args given twice", extra("--log-level", "info", "--log-level", "debug"),
          "given twice"),
    check("extra_args old mamba flag", extra("--mamba-scheduler-strategy", "no_buffer"),
          "spells it --mamba-radix-cache-strategy"),
    check("extra_args abbreviation", extra("--log-lev", "info"), "write the flag in full"),
    check("extra_args unknown flag", extra("--frobnicate"), "has no flag --frobnicate"),
    check("extra_args near miss", extra("--log-levle", "info"), "did you mean --log-level"),
    check("extra_args without a flag first", extra("log-level", "info"),
          "must start with a --flag"),
    check("extra_args newline in a value", extra("--log-level", "a\nb"), "U+000A"),
    check("extra_args integer", extra("--log-level", 5), "a list of strings"),
    check("extra_args a string", prof({"extra_args": "--log-level info"}), "must be a list"),
    check("extra_args 300 words", extra(*["--log-level", "info"] * 150), "at most 256"),
    check("extra_args bad choice", extra("--load-format", "bogus"), "parser rejects"),
    check("extra_args missing value", extra("--load-format"), "parser rejects"),
    check("extra_args bad integer", extra("--max-total-tokens", "lots"), "parser rejects"),
    check("extra_args expansion", extra("--log-level", "${X}"), "'${'"),
    # Releases on the command line.
    check_usage("--sglang-version empty", "is empty", "--sglang-version", ""),
    check_usage("--sglang-version a path", "not a supported release",
                "--sglang-version", "../flags/0.5.23"),
    check_usage("--sglang-version 0.5.9", "--sglang-version: SGLang 0.5.9 is not a supported "
                "release", "--sglang-version", "0.5.9"),
    check_usage("--sglang-version near miss", "did you mean", "--sglang-version",
                "0.5.23.post9"),
    check_usage("--sglang-version newline", "not a supported release",
                "--sglang-version", "0.5.23\n"),
    render("render a bad profile", prof({"server.port": 80}), "privileged", "--format", "json"),
    render("render http index", prof({"engine.index_url": "http://x.org/simple"}), "plain http"),
    # The model's config.json.
    config("config architectures a string", json.dumps({"architectures": "Qwen3"}),
           "is the string 'Qwen3', not a list"),
    config("config latin-1", b'{"architectures": ["Qwen\xe9"]}', "not UTF-8"),
    config("config utf-16", json.dumps({"architectures": ["X"]}).encode("utf-16"), "UTF-16"),
    config("config not JSON", "{architectures: [", "not valid JSON"),
    config("config nested", "[" * 100000, "nested too deeply"),
    config("config a list", "[1, 2]", "must be a JSON object"),
    config("config empty architectures", json.dumps({"architectures": []}), "empty list"),
    config("config architectures integers", json.dumps({"architectures": [1]}),
           "must list class names"),
    config("config no architectures", json.dumps({"model_type": "x"}), "is missing"),
    config("config misspelled", json.dumps({"architectures": ["Qwen3_5ForConditionalGeneratio"]}),
           "did you mean Qwen3_5ForConditionalGeneration"),
    config("config class with a command", json.dumps({"architectures": ["X; id"]}),
           "not a Python class name"),
    Case("config missing", ("check", "{profile}", "--model-config", "/nonexistent/config.json"),
         "cannot read the model config", prof()),
    Case("config /dev/zero", ("check", "{profile}", "--model-config", "/dev/zero"),
         "larger than", prof()),
]


def _expand(case: Case, tmp: Path) -> list[str]:
    names = {}
    if case.profile is not None:
        path = tmp / "p.yaml"
        path.write_bytes(case.profile if isinstance(case.profile, bytes)
                         else case.profile.encode())
        names["profile"] = str(path)
    for name, content in case.files.items():
        (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        names[name] = str(tmp / name)
    return [names.get(a[1:-1], a) if a.startswith("{") and a.endswith("}") else a
            for a in case.args]


def assert_named_error(code: int, err: str, case: Case) -> None:
    assert code != 0, f"{case.name}: silently accepted"
    assert "Traceback" not in err and code != cli.INTERNAL_ERROR, f"{case.name}: a bug:\n{err}"
    if case.usage:
        assert code == 2, f"{case.name}: exit {code}, not a usage error\n{err}"
        assert err.startswith("usage: sglang-fleet "), f"{case.name}: {err!r}"
        assert ": error: argument " in err and case.expect in err, f"{case.name}:\n{err}"
        return
    assert code == 1, f"{case.name}: exit {code}\n{err}"
    assert err.startswith("error: "), f"{case.name}: {err!r}"
    assert case.expect in err, f"{case.name}: {case.expect!r} not in:\n{err}"
    if case.fix:
        assert "\n    fix: " in err, f"{case.name}: no fix line:\n{err}"


@pytest.mark.parametrize("case", PROFILE_CASES, ids=lambda c: c.name)
def test_profile_and_cli_inputs(case: Case, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(_expand(case, tmp_path))
    assert_named_error(code, capsys.readouterr().err, case)


# --- smoke: URLs, key files, and every kind of answer -------------------------------------

def _http(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _sse(*lines: bytes) -> bytes:
    return _http(200, b"".join(b"data: " + line + b"\n\n" for line in lines),
                 "text/event-stream")


MODELS = _http(200, json.dumps({"data": [{"id": "m"}]}).encode())
# Each fake server: what it answers to /v1/models and to /v1/chat/completions.
SERVERS: dict[str, tuple[bytes, bytes]] = {
    "ssh": (b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", b""),
    "garbage json": (_http(200, b"{not json"), b""),
    "no model list": (_http(200, b'{"object": "list"}'), b""),
    "empty model list": (_http(200, b'{"data": []}'), b""),
    "model id an integer": (_http(200, b'{"data": [{"id": 5}]}'), b""),
    "models a string": (_http(200, b'"hello"'), b""),
    "http 500": (_http(500, b"Internal Server Error"), b""),
    "http 404": (_http(404, b"Not Found"), b""),
    "http 403": (_http(403, b"Forbidden"), b""),
    "close at once": (b"", b""),
    "half a status line": (b"HTTP/1.1 2", b""),
    "stream not UTF-8": (MODELS, _sse(b'{"choices": [{"delta": {"content": "\xff\xfe"}}]}')),
    "stream not JSON": (MODELS, _sse(b"{oops")),
    "stream chunk a list": (MODELS, _sse(b"[1, 2]")),
    "stream choices an integer": (MODELS, _sse(b'{"choices": 5}')),
    "stream delta a list": (MODELS, _sse(b'{"choices": [{"delta": [1]}]}')),
    "stream empty": (MODELS, _sse(b"[DONE]")),
    "chat 500": (MODELS, _http(500, b"boom")),
    "chat garbage status": (MODELS, b"garbage\r\n\r\n"),
    "chat cut short": (MODELS, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: {"),
    "chat chunked garbage": (MODELS, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     b"zz\r\nnot a chunk\r\n"),
    "insane answer": (MODELS, _sse(b'{"choices": [{"delta": {"content": "five"}}]}',
                                   b"[DONE]")),
}
SMOKE_EXPECT = {
    "ssh": "did not answer HTTP",
    "garbage json": "not JSON",
    "no model list": "without a model list",
    "empty model list": "lists no model",
    "model id an integer": "without a usable id",
    "models a string": "without a model list",
    "http 500": "answered 500: Internal Server Error",
    "http 404": "answered 404",
    "http 403": "answered 403",
    "close at once": "did not answer",
    "half a status line": "did not answer",
    "stream not UTF-8": "not UTF-8",
    "stream not JSON": "not JSON",
    "stream chunk a list": "not an object",
    "stream choices an integer": "not OpenAI chat completion chunks",
    "stream delta a list": "not OpenAI chat completion chunks",
    "stream empty": "returned nothing",
    "chat 500": "answered 500: boom",
    "chat garbage status": "did not answer",
    "chat cut short": "a stream line is not JSON",
    "chat chunked garbage": "streamed no content",
    "insane answer": "not sane",
}


class _Handler(socketserver.BaseRequestHandler):
    answers: tuple[bytes, bytes] = (b"", b"")

    def handle(self) -> None:
        self.request.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            head += chunk
        models, chat = self.answers
        self.request.sendall(chat if b"/chat/completions" in head.split(b"\r\n")[0] else models)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    running, urls = [], {}
    for name, answers in SERVERS.items():
        handler = type("H", (_Handler,), {"answers": answers})
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append(srv)
        urls[name] = f"http://127.0.0.1:{srv.server_address[1]}"
    yield urls
    for srv in running:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("name", list(SERVERS))
def test_smoke_answers(name: str, servers: dict[str, str],
                       capsys: pytest.CaptureFixture[str]) -> None:
    case = Case(name, (), SMOKE_EXPECT[name], fix=False)
    code = cli.main(["smoke", servers[name]])
    err = capsys.readouterr().err
    assert_named_error(code, err, case)
    assert err.count("\n") == 1, f"{name}: not one line: {err!r}"


SMOKE_INPUT_CASES = [
    Case("url empty", ("smoke", ""), "is empty", usage=True),
    Case("url without a scheme", ("smoke", "10.0.0.1:30000"), "not an http(s) URL", usage=True),
    Case("url host:port", ("smoke", "localhost:30000"), "not an http(s) URL", usage=True),
    Case("url ftp", ("smoke", "ftp://x"), "not an http(s) URL", usage=True),
    Case("url no host", ("smoke", "http://"), "no valid host", usage=True),
    Case("url bad port", ("smoke", "http://h:99999"), "not a URL", usage=True),
    Case("url with a space", ("smoke", "http://a b:1"), "must not hold", usage=True),
    Case("url newline", ("smoke", "http://a\n:1"), "U+000A", usage=True),
    Case("key file missing", ("smoke", "http://127.0.0.1:1", "--api-key-file", "/nonexistent"),
         "cannot read the API key file"),
    Case("key file two lines", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "holds 2 lines", files={"k": "key-one\nkey-two\n"}),
    Case("key file not UTF-8", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "not UTF-8", files={"k": b"key\xff\n"}),
    Case("key file empty", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "is empty", files={"k": ""}),
    Case("key file a space", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "holds spaces", files={"k": "two words\n"}),
    Case("key file a tab", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "U+0009", files={"k": "a\tb\n"}),
    Case("key file non-ASCII", ("smoke", "http://127.0.0.1:1", "--api-key-file", "{k}"),
         "printable ASCII", files={"k": "clé\n"}),
    Case("key file /dev/zero", ("smoke", "http://127.0.0.1:1", "--api-key-file", "/dev/zero"),
         "larger than"),
    Case("key file a directory", ("smoke", "http://127.0.0.1:1", "--api-key-file", str(ROOT)),
         "cannot read the API key file"),
    Case("nothing listening", ("smoke", "http://127.0.0.1:{port}"), "did not answer", fix=False),
]


@pytest.mark.parametrize("case", SMOKE_INPUT_CASES, ids=lambda c: c.name)
def test_smoke_inputs(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.replace("{port}", str(free_port())) for a in _expand(case, tmp_path)]
    code = cli.main(args)
    assert_named_error(code, capsys.readouterr().err, case)


# --- host data, as pyinfra gives it to a deploy's preflight -------------------------------

def _host_data(**data: Any) -> Callable[[], Any]:
    def profile() -> Any:
        inv = Inventory(  # type: ignore[no-untyped-call]
            ([("h1", data)], {}),
            b200=(["h1"], {"sglang_profile": str(FIELD_PROFILE), "gpu_count": 8}))
        return hostdata.profile_for(inv.get_host("h1"))

    return profile


HEX_KEY = "3f9a" * 16  # a key pasted where a secret's name belongs: refused, never shown
HOST_CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("overrides not a mapping", _host_data(sglang_overrides=["x"]), "must be a mapping"),
    ("auto past the last port", _host_data(gpu_count=64, **{"sglang.server.port": 65500}),
     "would listen up to port 65563"),
    ("startup budget words", _host_data(startup_budget_seconds="ten"), "whole number"),
    ("drain budget negative", _host_data(drain_budget_seconds=-1), "whole number"),
    ("gpu_count 0", _host_data(gpu_count=0), "positive integer"),
    ("gpu_count a string", _host_data(gpu_count="8"), "positive integer"),
    ("secret with a newline", _host_data(secrets={"sglang-api-key": "a\nb"}), "U+000A"),
    ("secrets a list", _host_data(secrets=["x"]), "mapping of secret names"),
    ("secret with a trailing newline", _host_data(secrets={"sglang-api-key": "key\n"}),
     "strip the value"),
    ("secret non-ASCII", _host_data(secrets={"sglang-api-key": "clé"}), "printable ASCII"),
    ("secret an integer", _host_data(secrets={"sglang-api-key": 5}), "must be a string"),
    ("hf_token empty", _host_data(hf_token=""), "is empty"),
    ("aws key with NUL", _host_data(aws_access_key_id="AK\x00"), "U+0000"),
    ("repo http", _host_data(nvidia_repo_base_url="http://mirror/cuda"), "plain http"),
    ("find-links http", _host_data(engine_find_links="http://wheels/"), "allow_insecure_urls"),
    ("s3 endpoint without scheme", _host_data(s3_endpoint_url="s3.local:9000"),
     "not an http(s) URL"),
    ("s3 endpoint an integer", _host_data(s3_endpoint_url=9000), "must be a URL string"),
    ("address words", _host_data(sglang_address="bad host!"), "neither an IP address"),
    ("allow_insecure_urls words", _host_data(allow_insecure_urls="sure"),
     "allow_insecure_urls: must be true/false, yes/no, on/off or 1/0, got 'sure'"),
    ("allow_reboot words", _host_data(allow_reboot="maybe"),
     "allow_reboot: must be true/false, yes/no, on/off or 1/0, got 'maybe'"),
    ("router_allow_no_key 2", _host_data(router_allow_no_key=2), "router_allow_no_key: must be"),
    ("profile an integer", _host_data(sglang_profile=5), "no serving profile"),
    ("profile empty", _host_data(sglang_profile=""), "no serving profile"),
    ("profile newline", _host_data(sglang_profile="profiles/x.yaml\n"), "U+000A"),
    ("data port 80", _host_data(**{"sglang.server.port": "80"}), "privileged"),
    ("data source empty", _host_data(**{"sglang.model.source": ""}), "is empty"),
    ("data empty unsets", _host_data(**{"sglang.memory.mem_fraction_static": ""}),
     "is empty"),
    ("data served_name 2024", _host_data(**{"sglang.model.served_name": 2024}),
     "--data 'sglang.model.served_name=\"2024\"'"),
    ("data alias bomb", _host_data(**{"sglang.memory.page_size": ALIAS_BOMB}),
     "must be an integer"),
    ("data nan", _host_data(**{"sglang.memory.mem_fraction_static": ".nan"}), "finite"),
    ("data 50 MiB", _host_data(**{"sglang.model.served_name": "x" * (50 << 20)}),
     "at most 4096"),
    ("data unknown key", _host_data(**{"sglang.memory.max_runing_requests": 8}),
     "did you mean 'max_running_requests'"),
    ("data target empty", _host_data(**{"sglang.memory.target_running_requests": ""}),
     "is empty"),
    ("data target words", _host_data(**{"sglang.memory.target_running_requests": "many"}),
     "must be an integer"),
    ("data target 0", _host_data(**{"sglang.memory.target_running_requests": "0"}),
     "at least 1"),
    ("data target with a size", _host_data(**{"sglang.memory.target_running_requests": "48",
                                              "sglang.memory.max_mamba_cache_size": "24"}),
     "both decide the mamba cache's size"),
    ("driver branch with a command", _host_data(nvidia_driver_branch="580; id"),
     "is not a driver branch"),
    ("driver version words", _host_data(nvidia_driver_version="latest"),
     "is not an exact driver version"),
    ("cuda toolkit path", _host_data(cuda_toolkit="../12-9"), "is not a toolkit package"),
    ("engine cuda words", _host_data(engine_cuda="thirteen"), "is not a CUDA release"),
    ("job estimate one number", _host_data(job_estimate="900000"), "COMPLETIONS,TOKENS"),
    ("router version with a command", _host_data(router_version="0.3.2 && id"),
     "is not a release"),
    ("router version true", _host_data(router_version=True), "must be a release"),
    ("router secret holds a key", _host_data(router_api_key_secret="sk-LIVE-ABC"),
     "the value is not the NAME of a secret"),
    ("router secret 64 hex", _host_data(router_admin_api_key_secret=HEX_KEY),
     "router_admin_api_key_secret: the value is not the NAME of a secret: it looks like a key"),
    ("secrets named by a key", _host_data(secrets={HEX_KEY: "x" * 32}),
     "secrets: a name in it is not the NAME of a secret: it looks like a key"),
    ("router host words", _host_data(router_host="any interface"), "neither an IP address"),
    ("router url ftp", _host_data(router_url="ftp://r:30080"), "not an http(s) URL"),
    ("router port 443", _host_data(router_port=443), "privileged"),
    ("router port a string", _host_data(router_port="30080"), "port from 1024"),
    ("data index http", _host_data(**{"sglang.engine.index_url": "http://x.org/simple"}),
     "plain http"),
]


@pytest.mark.parametrize("name,load,expect", HOST_CASES, ids=[c[0] for c in HOST_CASES])
def test_host_data(name: str, load: Callable[[], Any], expect: str) -> None:
    with pytest.raises(InputError) as exc:
        load()
    message = str(exc.value)
    assert message.startswith("pyinfra data of h1: "), message
    assert expect in message and "\n    fix: " in message, message
    assert HEX_KEY not in message


@pytest.mark.parametrize("key", ["allow_reboot", "router_allow_no_key", "allow_insecure_urls"])
@pytest.mark.parametrize("value", ["no", "NO", "off", "false", 0, False])
def test_host_data_no_is_no(key: str, value: object) -> None:
    """As --data gives a word (``allow_reboot=no`` stays the text "no") or a file writes it."""
    inv = Inventory(([("h1", {key: value})], {}))  # type: ignore[no-untyped-call]
    assert getattr(hostdata.of(inv.get_host("h1")), key) is False


def test_host_data_insecure_urls_when_allowed() -> None:
    profile = _host_data(allow_insecure_urls=True, engine_find_links="http://wheels/",
                         **{"sglang.engine.index_url": "http://x.org/simple"})()
    assert profile.engine.index_url == "http://x.org/simple"


# --- roll: inventories and --data, in a process of its own (pyinfra_cli patches gevent) ----

INVENTORY = f"""
hosts = [("h1", {{"sglang_profile": {str(FIELD_PROFILE)!r}, "ssh_hostname": "10.0.0.1",
                  "gpu_count": 8}})]
"""
# Options wrong as written: a usage error (exit 2) before the inventory is read.
ROLL_USAGE = {"batch 0", "data without =", "data key with a space", "data value newline",
              "drain timeout nan", "health timeout negative"}
ROLL_CASES = [
    ("inventory syntax error", "hosts = [(\n", (), "not valid Python"),
    ("inventory raises", "raise RuntimeError('no such site')\n", (), "no such site"),
    ("no serving hosts", "hosts = ['h1']\n", (), "no serving hosts"),
    ("no router", INVENTORY, (), "no router"),
    ("batch 0", INVENTORY, ("--batch", "0"), "at least 1"),
    ("data without =", INVENTORY, ("--data", "novalue"), "not key=value"),
    ("data key with a space", INVENTORY, ("--data", "bad key=1"), "not a data key"),
    ("data value newline", INVENTORY, ("--data", "sglang.model.served_name=a\nb"), "U+000A"),
    ("data served_name 2024", INVENTORY, ("--data", "sglang.model.served_name=2024"),
     "quote it"),
    ("data empty value", INVENTORY, ("--data", "sglang.memory.page_size="), "is empty"),
    ("data insecure words", INVENTORY, ("--data", "allow_insecure_urls=maybe"),
     "allow_insecure_urls: must be true/false, yes/no, on/off or 1/0, got 'maybe'"),
    ("data reboot words", INVENTORY, ("--data", "allow_reboot=maybe"),
     "allow_reboot: must be true/false, yes/no, on/off or 1/0, got 'maybe'"),
    ("data secret name 64 hex", INVENTORY, ("--data", f"router_api_key_secret={HEX_KEY}"),
     "router_api_key_secret: the value is not the NAME of a secret"),
    ("data http find-links", INVENTORY, ("--data", "engine_find_links=http://w/"),
     "plain http"),
    ("drain timeout nan", INVENTORY, ("--drain-timeout", "nan"), "seconds from 0"),
    ("health timeout negative", INVENTORY, ("--health-timeout", "-1"), "seconds from 0"),
    ("router URL garbage", INVENTORY + "routers = [('h1', {'router_url': 'not a url'})]\n", (),
     "router_url"),
    ("missing inventory", None, (), "no such inventory file"),
]
_ROLL_RUNNER = """
import json, sys
from sglang_fleet import cli
results = []
for args in json.loads(sys.stdin.read()):
    import io, contextlib
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(args)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def test_roll_inputs(tmp_path: Path) -> None:
    argvs = []
    for i, (_, inventory, more, _) in enumerate(ROLL_CASES):
        path = tmp_path / f"inv{i}" / "inventory.py"
        path.parent.mkdir()
        if inventory is not None:
            path.write_text(inventory)
        argvs.append(["roll", str(path), *more])
    run = subprocess.run([sys.executable, "-c", _ROLL_RUNNER], input=json.dumps(argvs),
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout.splitlines()[-1])
    for (name, _, _, expect), (code, err) in zip(ROLL_CASES, results, strict=True):
        assert_named_error(code, err, Case(name, (), expect, usage=name in ROLL_USAGE))
        assert HEX_KEY not in err, name


def test_corpus_size() -> None:
    total = (len(PROFILE_CASES) + len(SERVERS) + len(SMOKE_INPUT_CASES) + len(HOST_CASES)
             + len(ROLL_CASES))
    assert total >= 150, total
