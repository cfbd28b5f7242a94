#!/usr/bin/env python3
"""SGLang's own argument parser, release by release, on a machine without a GPU.

``extract`` writes each release's flag table (every option its ``ServerArgs.add_cli_args``
registers: name, aliases, type, choices, default) to ``src/sglang_fleet/data/flags/<release>.json``.
``parse`` runs the release's real parser over command lines (a JSON list of argv lists on stdin)
and prints, for each, the parsed arguments or argparse's error message.

    python3 scripts/sglang_oracle.py extract                 # every supported release
    python3 scripts/sglang_oracle.py extract 0.5.23 0.5.24   # just these
    echo '[["--model-path", "/m"]]' | python3 scripts/sglang_oracle.py parse 0.5.23
    python3 scripts/sglang_oracle.py source 0.5.23           # where the release's source lies

For each release it downloads the published wheel (no dependencies), installs the transformers
release that wheel pins, and imports ``sglang.srt.server_args`` in a CPU-only environment.

Standard library only; needs ``uv`` and network access to PyPI. The CPU build of torch is taken
from ``--find-links`` (default: the machine's wheel directory) when PyPI only has CUDA builds.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import re
import subprocess
import sys
import types
from collections.abc import KeysView, ValuesView
from pathlib import Path

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


def run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


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
    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname.split(".")[0] in SHIMMED:
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


def _install_shims() -> list[str]:
    shimmed = []
    for name in SHIMMED:
        try:
            __import__(name)
        except Exception:
            shimmed.append(name)
    if shimmed:
        sys.meta_path.insert(0, _Shim())
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


def in_release(work: Path, find_links: str, version: str, mode: str,
               stdin: str | None = None) -> str:
    """Run this script's ``mode`` in the extraction environment with ``version`` importable."""
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
    p = sub.add_parser("source", help="print the directory holding the release's source")
    p.add_argument("version")
    sub.add_parser("_dump")
    sub.add_parser("_parse")
    args = ap.parse_args()
    if args.mode == "_dump":
        dump()
    elif args.mode == "_parse":
        parse()
    elif args.mode == "source":
        print(stage_release(args.work, args.version, build_env(args.work, args.find_links))[0])
    elif args.mode == "parse":
        print(in_release(args.work, args.find_links, args.version, "_parse", sys.stdin.read()))
    else:
        extract(args.work, args.find_links,
                args.versions or json.loads(RELEASES.read_text())["supported"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
