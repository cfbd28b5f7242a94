"""``python -m sglang_sim.compile_deep_gemm <launch_server flags> [--timeout S]``: the release's
``python -m sglang.compile_deep_gemm`` (shipped by every release 0.5.10 - 0.5.23).

The real script parses the server's flags plus ``--timeout`` (default 3600), sets
``SGLANG_IN_DEEPGEMM_PRECOMPILE_STAGE``, starts a server without CUDA graphs on ``--port`` (so it
needs the model's GPU memory and a free port), sends one generation, prints that compilation
finished, sleeps 10 s and kills the server. The simulator loads the model and compiles into the
same cache entries a server start would use (paying ``SGLANG_SIM_JIT_SECONDS`` for what is
missing), prints the script's lines and exits 0, without serving.

    python -m sglang_sim.compile_deep_gemm --model-path lab/models/qwen3.6-27b --tp 8
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from sglang_sim import args as args_mod
from sglang_sim import logs
from sglang_sim.deep_gemm import PRECOMPILE_STAGE
from sglang_sim.faults import Faults
from sglang_sim.launch_server import load


def split_timeout(argv: list[str]) -> tuple[int, list[str]]:
    """CompileArgs.add_cli_args: ``--timeout`` (int, 3600) beside the server's flags."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--timeout", type=int, default=3600)
    known, rest = parser.parse_known_args(argv)
    return known.timeout, rest


def main(argv: list[str] | None = None) -> None:
    timeout, rest = split_timeout(sys.argv[1:] if argv is None else argv)
    release = args_mod.version()
    args = args_mod.parse(rest, release)
    scheduler = logs.configure(args.log_level, logs.scheduler_prefix(0, args.tp_size, None))
    os.environ[PRECOMPILE_STAGE] = "1"  # envs.SGLANG_IN_DEEPGEMM_PRECOMPILE_STAGE.set(True)
    print("Disable CUDA Graph and Torch Compile to save time...", flush=True)
    print("Begin DeepGEMM Kernels compilation...\n"
          "It may take a long time and timeout maybe raised "
          "while the compilation is still in progress.\n"
          "Just feel free to restart the command "
          "until the compilation is fully finished.\n", flush=True)
    tic = time.monotonic()
    load(args, release, Faults.from_env(), scheduler)  # compiles what the cache lacks
    if time.monotonic() - tic > timeout:  # what was compiled stays in the cache
        raise TimeoutError("DeepGEMM Kernels compilation timeout."
                           "\n\nFeel free and please restart the command.")
    print("\nGenerate warm up request for compiling DeepGEMM...\n", flush=True)
    print("\nDeepGEMM Kernels compilation finished successfully.", flush=True)


if __name__ == "__main__":
    main()
