#!/usr/bin/env python3
"""SGLang's own argument parser, release by release, on a machine without a GPU.

``extract`` writes each release's flag table (every option its ``ServerArgs.add_cli_args``
registers: name, aliases, type, choices, default) to ``src/sglang_fleet/data/flags/<release>.json``.
``parse`` runs the release's real parser over command lines (a JSON list of argv lists on stdin)
and prints, for each, the parsed arguments or argparse's error message. ``construct`` goes on to
the release's real ``ServerArgs`` resolution, with every platform and GPU query answered as an
8 x NVIDIA B200 host answers it (``B200_PROBES``) and the model known by its architecture only
(``_StubModelConfig``), and prints accepted (with the resolved fields and the mamba hooks that
ran) or the exception SGLang raised. ``mamba-archs`` writes, per release, which architectures
reach the mamba radix-cache rules and which may use extra_buffer, read from its source.

    python3 scripts/sglang_oracle.py extract                 # every supported release
    python3 scripts/sglang_oracle.py extract 0.5.23 0.5.24   # just these
    echo '[["--model-path", "/m"]]' | python3 scripts/sglang_oracle.py parse 0.5.23
    echo '[{"argv": ["--model-path", "/m"], "arch": "Qwen3_5ForConditionalGeneration"}]' \
        | python3 scripts/sglang_oracle.py construct 0.5.23   # real ServerArgs on a B200
    python3 scripts/sglang_oracle.py mamba-archs             # data/mamba_archs.json
    python3 scripts/sglang_oracle.py source 0.5.23           # where the release's source lies

For each release it downloads the published wheel (no dependencies), installs the transformers
release that wheel pins, and imports ``sglang.srt.server_args`` in a CPU-only environment.

Standard library only; needs ``uv`` and network access to PyPI. The CPU build of torch is taken
from ``--find-links`` (default: the machine's wheel directory) when PyPI only has CUDA builds.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.abc
import importlib.machinery
import json
import re
import subprocess
import sys
import types
from collections.abc import Iterator, KeysView, ValuesView
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "sglang_fleet" / "data" / "flags"
RELEASES = ROOT / "src" / "sglang_fleet" / "data" / "releases.json"
TORCH = "torch==2.13.0+cpu"
# What sglang.srt.server_args imports on its way in (checked for 0.5.10 through 0.5.23).
PARSER_DEPS = [
    "msgspec", "numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow",
    "starlette", "pydantic", "pyzmq", "tqdm", "IPython", "aiohttp", "httpx", "openai",
    "partial_json_parser", "dill", "sentencepiece", "fastapi", "uvicorn", "huggingface_hub",
]
# Imported at module level by some releases but irrelevant to argument parsing; PyPI's build of
# torchvision needs CUDA torch, so these are replaced by empty modules when they cannot be imported.
SHIMMED = ("torchvision",)
# Imported by the model-config and quantization chain that ServerArgs resolution walks through
# (0.5.10+), unused while resolving arguments: stubbed when absent from the environment.
RESOLUTION_SHIMMED = ("einops", "compressed_tensors", "gguf")
# What SGLang's platform probes (sglang.srt.utils.common, re-exported by name into many modules)
# answer on an 8 x NVIDIA B200 host: nvidia-smi reports 183359 MiB, compute capability 10.0.
B200_PROBES: dict[str, object] = {
    "is_cuda": True, "is_cuda_alike": True, "is_hip": False, "is_npu": False, "is_xpu": False,
    "is_musa": False, "is_mps": False, "is_hpu": False, "is_cpu": False,
    "is_sm90_supported": False, "is_sm100_supported": True, "is_sm100_or_sm110_supported": True,
    "is_sm110_supported": False, "is_sm120_supported": False, "is_blackwell_supported": True,
    "is_blackwell": True, "is_hopper_with_cuda_12_3": False, "cpu_has_amx_support": False,
    "is_flashinfer_available": True, "get_device_sm": 100, "get_device_capability": (10, 0),
    "get_device_memory_capacity": 183359, "get_nvidia_driver_version": (580, 95, 5),
    "get_device": "cuda", "get_device_name": "NVIDIA B200", "get_device_count": 8,
}
# The functions whose running proves the release's hybrid-model (mamba) rules were applied.
MAMBA_HOOKS = (("sglang.srt.server_args", "ServerArgs._handle_mamba_radix_cache"),
               ("sglang.srt.arg_groups.model_hook", "handle_mamba_radix_cache"))
# Resolved fields the differential test compares.
RESOLVED = ("mamba_scheduler_strategy", "mamba_radix_cache_strategy", "disable_overlap_schedule",
            "disable_radix_cache", "page_size", "attention_backend", "mamba_track_interval",
            "speculative_algorithm", "speculative_num_draft_tokens", "max_running_requests",
            "load_balance_method", "dp_size")


def run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


@contextmanager
def setup_lock(work: Path) -> Iterator[None]:
    """One environment or release set up at a time in ``work``: test workers run beside each
    other and would otherwise install into the same directory at once."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def build_env(work: Path, find_links: str) -> Path:
    env = work / "env"
    python = env / "bin" / "python"
    if not python.exists():
        run(["uv", "venv", "-q", "-p", "3.11", str(env)])
        pip = ["uv", "pip", "install", "-q", "--python", str(python)]
        run([*pip, "--find-links", find_links, TORCH, *PARSER_DEPS])
        run([*pip, "--no-deps", "triton", "xgrammar", "apache-tvm-ffi"])
    return python


def stage_release(work: Path, version: str, python: Path) -> list[Path]:
    """Install the release (no dependencies) and the transformers it pins; return PYTHONPATH."""
    target = work / "sglang" / version
    if not (target / "sglang").is_dir():
        run(["uv", "pip", "install", "-q", "--no-deps", "--python", str(python),
             "--target", str(target), f"sglang=={version}"])
    meta = next(target.glob("sglang-*.dist-info/METADATA")).read_text()
    pin = re.search(r"^Requires-Dist: transformers==(\S+)$", meta, re.M)
    paths = [target]
    if pin:
        tf = work / "transformers" / pin.group(1)
        if not (tf / "transformers").is_dir():
            run(["uv", "pip", "install", "-q", "--python", str(python), "--target", str(tf),
                 f"transformers=={pin.group(1)}"])
        paths.append(tf)
    return paths


def jsonable(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset, KeysView, ValuesView)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return repr(value)


class _Anything:
    """Stands in for any attribute of a shimmed module: attributes and calls give itself."""

    def __getattr__(self, attr: str) -> _Anything:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return self


def _shim_attr(attr: str) -> object:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Anything()


class _Shim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        module = types.ModuleType(spec.name)
        # transformers reads the version of what it finds importable.
        vars(module).update(__path__=[], __version__="0.0.0")
        module.__getattr__ = _shim_attr  # type: ignore[method-assign]
        return module

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass


def _install_shims(names: tuple[str, ...] = SHIMMED) -> list[str]:
    shimmed = []
    for name in names:
        try:
            __import__(name)
        except Exception:
            shimmed.append(name)
    if shimmed:
        sys.meta_path.insert(0, _Shim(tuple(shimmed)))
    return shimmed


def dump() -> None:
    """Runs inside the extraction environment with one release on sys.path."""
    shimmed = _install_shims()
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    by_dest: dict[str, list[str]] = {}
    for action in parser._actions:
        for opt in action.option_strings:
            by_dest.setdefault(action.dest, []).append(opt)
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = type(action).__name__
        flags.append({
            "options": list(action.option_strings),
            "dest": action.dest,
            "action": kind,
            "type": getattr(action.type, "__name__", None) if action.type else None,
            "nargs": action.nargs,
            "const": jsonable(action.const),
            "choices": jsonable(list(action.choices)) if action.choices is not None else None,
            "default": jsonable(action.default),
            "required": action.required,
            "deprecated": "Deprecated" in kind or "[Deprecated]" in (action.help or ""),
            "alias_of": getattr(action, "new_flag", None),
            "aliases": [o for o in by_dest[action.dest] if o not in action.option_strings],
        })
    json.dump({"version": __version__, "shimmed_imports": shimmed, "flags": flags,
               "speculative_algorithms": speculative_algorithms()},
              sys.stdout, indent=1, sort_keys=True)


def speculative_algorithms() -> dict[str, list[str]]:
    """Names ``SpeculativeAlgorithm.from_string`` accepts: enum members and reserved aliases."""
    import inspect

    import sglang.srt.server_args as server_args
    from sglang.srt.speculative import spec_info

    names = [m.name for m in spec_info.SpeculativeAlgorithm if m.name != "NONE"]
    aliases = set(getattr(spec_info, "_RESERVED_ALIASES", ()))
    try:  # 0.5.13 moved the alias table to its own module
        from sglang.srt.speculative import spec_registry

        aliases |= set(getattr(spec_registry, "_RESERVED_ALIASES", ()))
    except ImportError:
        pass
    # Releases without the alias table rewrite NEXTN to EAGLE while resolving the arguments.
    if '"NEXTN"' in inspect.getsource(server_args):
        aliases.add("NEXTN")
    return {"names": names, "aliases_of_eagle": sorted(aliases)}


def parse() -> None:
    """Runs inside the extraction environment: the real parser over argv lists from stdin."""
    import contextlib
    import io

    _install_shims()
    from sglang.srt.server_args import ServerArgs

    results = []
    for argv in json.load(sys.stdin):
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(parser)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(argv)
            results.append({"ok": True, "args": jsonable(vars(ns))})
        except SystemExit:
            results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1]})
    json.dump(results, sys.stdout)


class _StubModelConfig:
    """What ServerArgs reads of sglang's ModelConfig, for a model known only by architecture
    (no weights, no config.json): a dense bf16 attention stack of 16 heads, 2 KV heads, 256K
    context. Attributes outside this list raise AttributeError as a real config would not, so a
    release that reads more fails the harness loudly instead of deciding on a made-up value."""

    VALUES: ClassVar[dict[str, object]] = {
        "context_len": 262144, "is_multimodal": False,
        "is_multimodal_chunked_prefill_supported": True,
        "is_multimodal_piecewise_cuda_graph_supported": False, "is_hybrid_swa": False,
        "is_encoder_decoder": False, "has_attention_sinks": False, "has_asymmetric_kv": False,
        "attention_chunk_size": None, "v_head_dim": 256, "head_dim": 256,
        "num_nextn_predict_layers": 1, "hf_quant_config": None, "quantization": None,
        "is_piecewise_cuda_graph_disabled_model": False, "joint_head_config": None,
        "pointer_head": None, "decision_config": None, "revision": None,
        "embedding_model_spec": None, "is_embedding_gemma": False, "num_attention_heads": 16,
        "num_key_value_heads": 2, "model_path": "/m",
    }

    def __init__(self, hf_config: object) -> None:
        self.hf_config = self.hf_text_config = hf_config

    def get_num_kv_heads(self, tp: int) -> int:
        return max(1, 2 // tp)

    def get_max_num_attention_heads(self) -> int:
        return 16

    def __getattr__(self, attr: str) -> object:
        if attr in self.VALUES:
            return self.VALUES[attr]
        if attr == "dtype":
            import torch  # type: ignore[import-not-found]

            return torch.bfloat16
        if attr == "attention_arch":
            from sglang.srt.configs.model_config import AttentionArch

            return AttentionArch.MHA
        raise AttributeError(attr)


def _import_resolution_modules() -> None:
    """Import every module ServerArgs resolution may import lazily, so the B200 patch reaches
    the names they bind."""
    import importlib
    import pkgutil

    import sglang.srt.server_args  # noqa: F401

    for package in ("sglang.srt.arg_groups", "sglang.srt.arg_groups.model_overrides"):
        try:
            mod = importlib.import_module(package)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(mod.__path__):
            importlib.import_module(f"{package}.{info.name}")
    importlib.import_module("sglang.srt.configs.model_config")


def _patch_b200(arch: list[str]) -> None:
    """Answer every platform probe as an 8 x B200 host does and every model-config query with
    ``arch[0]``'s architecture; ``arch`` is a one-element list the caller rebinds per case."""
    import torch
    import transformers
    from sglang.srt.configs.model_config import ModelConfig

    def hf_config(*_: object, **__: object) -> object:
        return transformers.PretrainedConfig(architectures=[arch[0]])

    def constant(value: object) -> object:
        return lambda *_, **__: value

    torch.cuda.is_available = constant(True)
    torch.cuda.device_count = constant(8)
    torch.cuda.get_device_capability = constant((10, 0))
    torch.cuda.get_device_name = constant("NVIDIA B200")
    ModelConfig.from_server_args = classmethod(
        lambda cls, *_, **__: _StubModelConfig(hf_config()))
    for name, mod in list(sys.modules.items()):
        if not name.startswith("sglang") or mod is None:
            continue
        for attr, value in B200_PROBES.items():
            if callable(getattr(mod, attr, None)) and not isinstance(getattr(mod, attr), type):
                setattr(mod, attr, constant(value))
        if callable(getattr(mod, "get_config", None)):
            mod.get_config = hf_config  # type: ignore[attr-defined]


def _count_hooks(ran: list[str]) -> None:
    """Wrap the release's mamba hook so each call is recorded in ``ran``."""
    import importlib

    for module, qualname in MAMBA_HOOKS:
        try:
            owner: object = importlib.import_module(module)
        except ImportError:
            continue
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, attr, None)
        if original is None:
            continue

        def counted(*a: object, _original=original, _name=qualname, **kw: object) -> object:  # type: ignore[no-untyped-def]
            ran.append(_name)
            return _original(*a, **kw)

        setattr(owner, attr, counted)


def _resolve_case(case: dict[str, object], arch: list[str], ran: list[str]) -> dict[str, object]:
    import contextlib
    import io
    import os

    from sglang.srt.server_args import ServerArgs

    arch[0] = str(case["arch"])
    ran.clear()
    saved = dict(os.environ)
    env: dict[str, object] = case.get("env") or {}  # type: ignore[assignment]
    os.environ.update({str(k): str(v) for k, v in env.items()})
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(list(case["argv"]))  # type: ignore[call-overload]
    except SystemExit:
        return {"ok": False, "error": err.getvalue().strip().splitlines()[-1], "hooks": []}
    try:
        args = ServerArgs.from_cli_args(ns)
        if hasattr(args, "resolve_once"):  # 0.5.19+: construction leaves the record unresolved
            args.resolve_once()
        view: object = args
        with contextlib.suppress(ImportError):
            from sglang.srt.arg_groups.overrides import resolved_view

            view = resolved_view(args)
        resolved = {k: jsonable(getattr(view, k, None)) for k in RESOLVED}
        return {"ok": True, "hooks": list(ran), "resolved": resolved}
    except Exception as exc:  # SGLang refuses with ValueError, AssertionError, RuntimeError
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"ok": False, "error": f"{type(exc).__name__}: {message}", "hooks": list(ran)}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def construct() -> None:
    """Runs inside the extraction environment: SGLang's real ServerArgs resolution, on a
    simulated B200, for each case from stdin ({"argv": [...], "arch": ..., "env": {...}})."""
    import logging

    logging.disable(logging.CRITICAL)
    _install_shims()
    _install_shims(RESOLUTION_SHIMMED)
    _import_resolution_modules()
    arch, ran = ["LlamaForCausalLM"], list[str]()
    _patch_b200(arch)
    _count_hooks(ran)
    json.dump([_resolve_case(case, arch, ran) for case in json.load(sys.stdin)], sys.stdout)


def _arch_strings(node: object) -> list[str]:
    import ast

    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)  # type: ignore[arg-type]
            and isinstance(c.value, str) and c.value[:1].isupper()]


def _mamba_calls(tree: object, method: str) -> list[tuple[list[str], dict[str, object]]]:
    """(architectures of the enclosing ``model_arch`` branch, keyword arguments) for every call
    of ``method`` (or of apply_nemotron_h_defaults, standing for its hook's call)."""
    import ast

    found: list[tuple[list[str], dict[str, object]]] = []

    def visit(node: ast.AST, archs: list[str]) -> None:
        if isinstance(node, ast.If) and "model_arch" in ast.unparse(node.test):
            for stmt in node.body:
                visit(stmt, _arch_strings(node.test))
            for stmt in node.orelse:
                visit(stmt, archs)
            return
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) \
                in (method, "apply_nemotron_h_defaults"):
            kw: dict[str, object] = {
                k.arg or "": k.value.value if isinstance(k.value, ast.Constant) else True
                for k in node.keywords}
            if getattr(node.func, "id", "") == "apply_nemotron_h_defaults":
                kw = {"nemotron_hook": True}
            found.append((archs, kw))
        for child in ast.iter_child_nodes(node):
            visit(child, archs)

    visit(tree, [])  # type: ignore[arg-type]
    return found


def mamba_archs(src: Path) -> dict[str, list[str]]:
    """Which architectures reach a release's mamba radix-cache rules and which may use
    extra_buffer, read from its source: the per-architecture branches of
    ``ServerArgs._handle_model_specific_adjustments`` (0.5.10 - 0.5.14), the
    ``_MAMBA_RADIX_CACHE_ARCHS`` / ``_MAMBA_EXTRA_BUFFER_ARCHS`` sets (0.5.15+), and
    linear-attention models registered with ``uses_mamba_radix_cache=True``."""
    import ast

    srt = src / "sglang" / "srt"
    server_args = (srt / "server_args.py").read_text()
    overrides = srt / "arg_groups" / "overrides.py"
    radix: set[str] = set()
    extra: set[str] = set()
    no_cache: set[str] = set()
    text = overrides.read_text() if overrides.exists() else ""
    if "_MAMBA_EXTRA_BUFFER_ARCHS = " in text:
        for name, into in (("_MAMBA_RADIX_CACHE_ARCHS", radix),
                           ("_MAMBA_EXTRA_BUFFER_ARCHS", extra)):
            m = re.search(name + r" = frozenset\(\s*\{(.*?)\}\s*\)", text, re.S)
            into.update(re.findall(r'"(\w+)"', m.group(1)) if m else ())
    else:
        hook = srt / "arg_groups" / "nemotron_h_hook.py"
        hook_calls = _mamba_calls(ast.parse(hook.read_text()), "_handle_mamba_radix_cache") \
            if hook.exists() else []
        hook_kw = [kw for _, kw in hook_calls]
        for archs, kw in _mamba_calls(ast.parse(server_args), "_handle_mamba_radix_cache"):
            if kw.get("nemotron_hook"):
                kw = hook_kw[0] if hook_kw else {}
            if kw.get("support_mamba_cache") is False:
                no_cache.update(archs)
                continue
            radix.update(archs)
            if kw.get("support_mamba_cache_extra_buffer", True) is not False:
                extra.update(archs)
        m = re.search(r"def _support_mamba_cache_extra_buffer.*?\]:", server_args, re.S)
        if m:  # 0.5.14: one list decides
            extra = set(re.findall(r'"(\w+)"', m.group(0)))
    if "GraniteMoeHybridForCausalLM" in extra:  # hybrid when its config has mamba layers
        radix.add("GraniteMoeHybridForCausalLM")
    for config in (srt / "configs").glob("*.py"):
        body = "" if config.name == "linear_attn_model_registry.py" else config.read_text()
        if "register_linear_attn_model(" in body and "uses_mamba_radix_cache=True" in body:
            m = re.search(r"arch_names=\[(.*?)\]", body, re.S)
            radix.update(re.findall(r'"(\w+)"', m.group(1)) if m else ())
    return {"radix_cache": sorted(radix), "extra_buffer": sorted(extra & radix),
            "radix_cache_disabled": sorted(no_cache - radix)}


def write_mamba_archs(work: Path, find_links: str, versions: list[str]) -> None:
    with setup_lock(work):
        python = build_env(work, find_links)
        table = {v: mamba_archs(stage_release(work, v, python)[0]) for v in versions}
    (OUT.parent / "mamba_archs.json").write_text(json.dumps(table, indent=1) + "\n")


def in_release(work: Path, find_links: str, version: str, mode: str,
               stdin: str | None = None) -> str:
    """Run this script's ``mode`` in the extraction environment with ``version`` importable."""
    with setup_lock(work):
        python = build_env(work, find_links)
        paths = stage_release(work, version, python)
    env = {"PYTHONPATH": ":".join(map(str, paths)), "PATH": "/usr/bin:/bin",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([str(python), __file__, mode], env=env, input=stdin,
                            capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{version}: {mode} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def extract(work: Path, find_links: str, versions: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for version in versions:
        table = json.loads(in_release(work, find_links, version, "_dump"))
        if table["version"] != version:
            raise SystemExit(f"{version}: the wheel reports version {table['version']}")
        (OUT / f"{version}.json").write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        print(f"{version}: {len(table['flags'])} options", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "sglang-fleet" / "oracle")
    ap.add_argument("--find-links", default="/opt/wheels", help="where the CPU torch wheel lies")
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("extract", help="write flag tables")
    p.add_argument("versions", nargs="*", help="releases (default: every supported release)")
    p = sub.add_parser("parse", help="parse argv lists (JSON on stdin) with the real parser")
    p.add_argument("version")
    p = sub.add_parser("construct", help="resolve cases (JSON on stdin) with the real ServerArgs "
                       "on a simulated B200")
    p.add_argument("version")
    p = sub.add_parser("mamba-archs", help="write data/mamba_archs.json from each release's source")
    p.add_argument("versions", nargs="*", help="releases (default: every supported release)")
    p = sub.add_parser("source", help="print the directory holding the release's source")
    p.add_argument("version")
    sub.add_parser("_dump")
    sub.add_parser("_parse")
    sub.add_parser("_construct")
    args = ap.parse_args()
    if args.mode == "_dump":
        dump()
    elif args.mode == "_parse":
        parse()
    elif args.mode == "_construct":
        construct()
    elif args.mode == "mamba-archs":
        write_mamba_archs(args.work, args.find_links,
                          args.versions or json.loads(RELEASES.read_text())["supported"])
    elif args.mode == "source":
        with setup_lock(args.work):
            python = build_env(args.work, args.find_links)
            print(stage_release(args.work, args.version, python)[0])
    elif args.mode in ("parse", "construct"):
        print(in_release(args.work, args.find_links, args.version, f"_{args.mode}",
                         sys.stdin.read()))
    else:
        extract(args.work, args.find_links,
                args.versions or json.loads(RELEASES.read_text())["supported"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
