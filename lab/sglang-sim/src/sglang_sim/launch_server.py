"""``python -m sglang_sim.launch_server <SGLang flags>``: start like ``sglang.launch_server``.

Arguments are parsed as the release in ``SGLANG_SIM_VERSION`` parses them; the model's
config.json and ``nvidia-smi`` size memory; SGLang's startup lines are printed in SGLang's
formats; the server turns healthy after a warmup request and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import logging
import os
import shlex
import signal
import sys
import time
import traceback
from argparse import Namespace
from collections.abc import Callable, Iterator

import uvicorn

from sglang_sim import args as args_mod
from sglang_sim import (
    deep_gemm,
    dp,
    follower,
    graphs,
    grpc_mode,
    logs,
    memory,
    model,
    multinode,
    processes,
    rules,
    server,
)
from sglang_sim import gpus as gpus_mod
from sglang_sim.engine import Engine
from sglang_sim.faults import Faults
from sglang_sim.state import State

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
DRAIN_POLL_SECONDS = float(os.environ.get("SGLANG_SIM_DRAIN_POLL_SECONDS", "5"))


def load(args: Namespace, release: str, faults: Faults, scheduler: logging.Logger,
         raw: Namespace | None = None) -> State:
    """Everything from reading the model to allocating memory pools; raises as SGLang does:
    ServerArgs's checks in the server process (a traceback, exit 1), the rest in the scheduler
    (``Scheduler hit an exception``, SIGQUIT, the whole tree SIGKILLed: see processes.py). With
    ``--dp-size`` each DP rank loads at once on its own GPUs (dp.py); one that fails ends the DP
    controller, and the server raises "Rank 0 scheduler died during initialization"."""
    started = time.time()
    table = args_mod.table(release)
    shape = model.load(args.model_path)
    rules.resolve(args, shape.architecture, release, table["speculative_algorithms"])
    served_by_grpc = rules.grpc_in_place_of_http(args)
    if rules.grpc_mode(args) and not served_by_grpc:  # --grpc-port: beside HTTP
        sys.exit("sglang-sim: gRPC serving beside HTTP (--grpc-port) is not imitated")
    multinode.check(args, release)
    dp.resolve_load_balance_method(args)
    gpus = gpus_mod.discover()  # ServerArgs sizes memory from the first GPU, in this process
    memory.default_memory_settings(args, gpus[0].memory_mib)
    if served_by_grpc:
        grpc_mode.before_schedulers(raw or args, release)
    else:
        _log_server_args(args, release)
    children = processes.Children(release, args.tp_size, args.dp_size, ranks=(
        multinode.local_ranks(args) if args.nnodes > 1 else None), grpc=served_by_grpc)
    peers = multinode.Peers(args, release)
    loggers = [scheduler] if args.dp_size == 1 else [
        logs.rank_logger(logs.scheduler_prefix(0, args.tp_size, d)) for d in range(args.dp_size)]
    ranks: list[Callable[[], memory.MemoryPlan]] = [
        functools.partial(_load_in_scheduler, args, release, faults, log, shape, gpus, d,
                          peers)
        for d, log in enumerate(loggers)]
    if len(ranks) == 1:
        try:
            plans = [ranks[0]()]
        except Exception:
            children.exception(traceback.format_exc())  # ends this process, unless it is gone
            raise
    else:
        plans = _load_at_once(ranks, children)
    engines = [_engine(args, faults, plan, children, release, shape, d, log)
               for d, (plan, log) in enumerate(zip(plans, loggers, strict=True))]
    command = "python -m sglang.launch_server " + shlex.join(sys.argv[1:])
    return State(args=args, release=release, launch_command=command, shape=shape,
                 memories=plans, dispatch=dp.Dispatcher(engines, args.load_balance_method,
                                                        release),
                 faults=faults, startup_time=started, children=children, peers=peers)


def _load_at_once(ranks: list[Callable[[], memory.MemoryPlan]],
                  children: processes.Children) -> list[memory.MemoryPlan]:
    """The DP ranks' schedulers load side by side; the first (lowest) rank that fails hits its
    exception, whose SIGQUIT ends the controller: the server then raises what SGLang's
    _wait_for_scheduler_ready raises, after launch_server's kill_process_tree of the rest."""
    def attempt(rank: Callable[[], memory.MemoryPlan]) -> memory.MemoryPlan | str:
        try:
            return rank()
        except Exception:
            return traceback.format_exc()

    with concurrent.futures.ThreadPoolExecutor(len(ranks)) as pool:
        results = list(pool.map(attempt, ranks))
    failed = [(d, r) for d, r in enumerate(results) if isinstance(r, str)]
    if failed:
        dp_rank, formatted = failed[0]
        try:
            children.exception(formatted, dp_rank=dp_rank)
        finally:
            children.kill_tree(include_parent=False)
        raise RuntimeError("a DP rank's scheduler failed and the controller did not end")
    return [r for r in results if not isinstance(r, str)]


def _load_in_scheduler(args: Namespace, release: str, faults: Faults,
                       scheduler: logging.Logger, shape: model.ModelShape,
                       gpus: list[gpus_mod.Gpu], dp_rank: int,
                       peers: multinode.Peers) -> memory.MemoryPlan:
    """One scheduler's start on its DP rank's first GPU: the process group (multinode.py),
    weights, pools, graphs, its summary (TP rank 0's only: 0.5.12 managers/scheduler.py:775,
    0.5.23 :1267). With --nnodes each node holds tp_size / nnodes of the TP ranks, from its
    first GPU."""
    tp_here = args.tp_size // args.nnodes
    if (dp_rank + 1) * tp_here > len(gpus):
        raise RuntimeError(f"CUDA error: invalid device ordinal (tp_size={args.tp_size}, "
                           f"dp_size={args.dp_size}, visible GPUs={len(gpus)})")
    peers.rendezvous(scheduler)
    gpu = gpus[dp_rank * tp_here]
    before = gpu.memory_mib / 1024 - memory.CONTEXT_OVERHEAD_GB
    scheduler.info(f"Load weight begin. avail mem={before:.2f} GB")
    tic = time.perf_counter()
    deadline = time.monotonic() + faults.load_seconds
    while faults.hang_loading or time.monotonic() < deadline:
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
    if faults.fail_startup:
        raise RuntimeError(faults.fail_startup)
    plan = memory.plan(args, shape, gpu.memory_mib, release)
    rel = args_mod.release_tuple(release)
    scheduler.info(
        f"Load weight end. elapsed={time.perf_counter() - tic:.2f} s, type={shape.architecture}, "
        f"avail mem={plan.avail_after_load_gb:.2f} GB, mem usage={plan.weight_gb:.2f} GB.")
    _log_limits(scheduler, plan, rel, args.max_running_requests)
    _log_kv(scheduler, rel, shape.dtype, plan.kv_tokens, plan.kv_k_gb, plan.kv_v_gb)
    if shape.is_hybrid:
        _log_mamba(scheduler, plan, faults, args.speculative_algorithm is not None)
    scheduler.info(f"Memory pool end. avail mem={plan.pool_end_avail_gb:.2f} GB")
    graphs.capture_target(scheduler, args, plan, rel)  # the target's runner, then the draft's
    available = plan.available_gpu_mem_gb
    if args.speculative_algorithm is not None:
        available -= _log_draft_worker(scheduler, plan, rel, shape, args)
    if args.nnodes > 1:
        peers.loaded()
    if args.node_rank > 0:
        return plan
    scheduler.info(
        f"max_total_num_tokens={plan.kv_tokens}, chunked_prefill_size={plan.chunked_prefill_size}, "
        f"max_prefill_tokens={plan.max_prefill_tokens}, "
        f"max_running_requests={plan.max_running_requests}, context_len={plan.context_len}, "
        f"available_gpu_mem={available:.2f} GB")
    deep_gemm.warmup(args, release, shape, gpu.name, available, scheduler)
    return plan


def _engine(args: Namespace, faults: Faults, plan: memory.MemoryPlan,
            children: processes.Children, release: str, shape: model.ModelShape, dp_rank: int,
            log: logging.Logger) -> Engine:
    """One scheduler's serving loop; the simulator's faults act on the first (DP0's)."""
    engine = Engine(plan.max_running_requests, args.speculative_algorithm is not None,
                    args.speculative_num_draft_tokens or 1, args.reasoning_parser is not None,
                    args.random_seed or 0)
    if dp_rank == 0:
        engine.crash_after = faults.crash_after
        engine.hang_after = faults.hang_after
    engine.fault = functools.partial(_fault, children, args.watchdog_timeout, dp_rank)
    engine.prefill_line = functools.partial(graphs.prefill_line, args_mod.release_tuple(release),
                                            shape.is_hybrid)
    engine.log = log
    return engine


def _fault(children: processes.Children, watchdog_timeout: float | int, dp_rank: int,
           what: str) -> None:
    """The engine's scheduler stops: an exception (``crash MESSAGE``) or a batch that hangs
    until the scheduler's watchdog (``--watchdog-timeout``) ends it."""
    verb, _, message = what.partition(" ")
    if verb == "crash":
        try:
            raise RuntimeError(message)
        except RuntimeError:
            children.exception(traceback.format_exc(), wait=False, dp_rank=dp_rank)
    else:
        children.tell(f"hang {watchdog_timeout!r}", dp_rank)


def _log_server_args(args: Namespace, release: str) -> None:
    """entrypoints/engine.py: the dataclass repr up to 0.5.18, the resolved dict from 0.5.19."""
    if args_mod.release_tuple(release) >= (0, 5, 19, 0):
        logger.info(f"server_args={vars(args)!r}")
    else:
        logger.info(
            f"server_args=ServerArgs({', '.join(f'{k}={v!r}' for k, v in vars(args).items())})")


def _log_limits(scheduler: logging.Logger, plan: memory.MemoryPlan, rel: tuple[int, ...],
                requested: int | None) -> None:
    """resolve_max_num_reqs: the mamba cap is logged from 0.5.17 (kv_cache_configurator.py;
    earlier releases cap silently), a KV-capped requested limit from 0.5.14."""
    if plan.capped_by_mamba and rel >= (0, 5, 17, 0):
        scheduler.warning(
            "max_running_requests is capped to %d by the mamba state cache "
            "(max_mamba_cache_size=%d, %d state slots per request). To raise it: increase "
            "--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size "
            "with --mamba-ssm-dtype bfloat16.", plan.max_running_requests, plan.mamba_slots,
            plan.slots_per_request)
    elif (requested is not None and plan.max_running_requests < requested
          and not plan.capped_by_mamba and rel >= (0, 5, 14, 0)):
        scheduler.warning(
            "max_running_requests was reduced from the requested %d to %d (per dp worker) due "
            "to the available KV cache capacity.", requested, plan.max_running_requests)


def _log_kv(scheduler: logging.Logger, rel: tuple[int, ...], dtype: str, tokens: int,
            k_gb: float, v_gb: float) -> None:
    """mem_cache/memory_pool.py: "dtype: " joins the line in 0.5.13."""
    dtype_part = f"dtype: torch.{dtype}, " if rel >= (0, 5, 13, 0) else ""
    scheduler.info(f"KV Cache is allocated. {dtype_part}#tokens: {tokens}, "
                   f"K size: {k_gb:.2f} GB, V size: {v_gb:.2f} GB")


def _log_mamba(scheduler: logging.Logger, plan: memory.MemoryPlan, faults: Faults,
               speculative: bool) -> None:
    if faults.state_cache_too_small:
        raise RuntimeError(
            "Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            f"max_mamba_cache_size={plan.slots_per_request - 1}, "
            f"mamba_ratio={plan.slots_per_request}, resulting max_num_reqs=0. Try: (1) "
            "reduce --max-running-requests, (2) increase --mem-fraction-static, or (3) use "
            "GPUs with more memory.")
    line = (f"Mamba Cache is allocated. max_mamba_cache_size: {plan.mamba_slots}, "
            f"conv_state size: {plan.mamba_conv_gb:.2f}GB, "
            f"ssm_state size: {plan.mamba_ssm_gb:.2f}GB ")
    if speculative:
        line += (f"intermediate_ssm_state_cache size: {plan.intermediate_ssm_gb:.2f}GB "
                 f"intermediate_conv_window_cache size: {plan.intermediate_conv_gb:.2f}GB ")
    scheduler.info(line)


# The MTP draft model each target runs as (configs/model_config.py rewrites the architecture).
DRAFT_ARCH = {"Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP"}


def _log_draft_worker(scheduler: logging.Logger, plan: memory.MemoryPlan, rel: tuple[int, ...],
                      shape: model.ModelShape, args: Namespace) -> float:
    """The speculative draft worker's own model runner lines, after the target's: one MTP layer
    of weights and a one-layer KV pool of the same tokens. Returns the GB it takes."""
    arch = DRAFT_ARCH.get(shape.architecture, "Qwen3_5ForCausalLMMTP")
    weight_gb = plan.weight_gb / max(shape.num_layers, 1)
    k_gb, v_gb = plan.kv_k_gb / max(shape.num_layers, 1), plan.kv_v_gb / max(shape.num_layers, 1)
    avail = plan.pool_end_avail_gb - weight_gb
    scheduler.info(f"Load weight begin. avail mem={plan.pool_end_avail_gb:.2f} GB")
    scheduler.info(f"Load weight end. elapsed={0.5:.2f} s, type={arch}, avail mem={avail:.2f} GB, "
                   f"mem usage={weight_gb:.2f} GB.")
    _log_kv(scheduler, rel, shape.dtype, plan.kv_tokens, k_gb, v_gb)
    scheduler.info(f"Memory pool end. avail mem={avail - k_gb - v_gb:.2f} GB")
    graphs.capture_draft(scheduler, args, plan, rel, avail - k_gb - v_gb)
    return weight_gb + k_gb + v_gb


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # SGLang's own SIGTERM handler drains instead
        yield


async def serve(state: State) -> None:
    args = state.args
    app = server.build_app(state)
    # Like SGLang: uvicorn's own log config at --log-level-http (else --log-level).
    http = _Server(uvicorn.Config(app, host=args.host, port=args.port,
                                  log_level=args.log_level_http or args.log_level,
                                  timeout_keep_alive=5, lifespan="off"))
    loop = asyncio.get_running_loop()
    drained = asyncio.Event()

    def on_sigterm() -> None:
        # loop.add_signal_handler calls SGLang's sigterm_handler with no arguments (0.5.10
        # managers/tokenizer_manager.py:1513, 0.5.23 :2455): both print as None
        signum, frame = None, None
        logger.warning(f"SIGTERM received. {signum=} {frame=}. "
                       "Draining requests and shutting down...")
        state.draining = True

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, on_sigterm)

    async def watchdog() -> None:
        while not state.draining:
            await asyncio.sleep(min(DRAIN_POLL_SECONDS, 0.5))
            state.dispatch.step(busy=False)  # an idle scheduler still iterates
            state.dispatch.mark_dead(state.children.dp_rank_alive)
        while True:
            remaining_rids = list(state.dispatch.rids)
            remain_num_req = len(remaining_rids)
            logger.info(f"Gracefully exiting... Remaining number of requests {remain_num_req}. "
                        f"Remaining requests {remaining_rids=}.")
            if remain_num_req == 0:
                break
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        drained.set()

    async def warmup() -> None:
        while not http.started:
            await asyncio.sleep(0.05)
        state.children.handle_loop(loop)  # the first generate request: the warm-up's
        out = state.dispatch.compose("warmup", 1, False, None)
        async for _ in state.dispatch.run("warmup", 1, out, streaming=False):
            pass
        state.dispatch.reset_stats()
        state.up = True
        logger.info("The server is fired up and ready to roll!")

    server_task = asyncio.create_task(http.serve())
    tasks = [asyncio.create_task(warmup()), asyncio.create_task(watchdog())]
    await asyncio.wait([server_task, asyncio.create_task(drained.wait())],
                                 return_when=asyncio.FIRST_COMPLETED)
    http.should_exit = True
    await server_task
    for task in tasks:
        task.cancel()


def main(argv: list[str] | None = None) -> None:
    release = args_mod.version()
    args = args_mod.parse(sys.argv[1:] if argv is None else argv, release)
    raw = _raw(args, release)
    first_rank = multinode.local_ranks(args)[0]
    scheduler = logs.configure(args.log_level,
                               logs.scheduler_prefix(first_rank, args.tp_size, None))
    faults = Faults.from_env()
    state = load(args, release, faults, scheduler, raw)
    if args.node_rank > 0:
        follower.follow(state)  # never returns
    if rules.grpc_in_place_of_http(args):
        grpc_mode.schedulers_ready(args)
        grpc_mode.run(state, raw)  # never returns
    state.children.serving()
    if args.nnodes > 1:
        state.peers.watch(lambda: any(e.running for e in state.dispatch.engines),
                          functools.partial(multinode.lost_peer, state.children,
                                            state.dispatch.engines, args, release))
    try:
        asyncio.run(serve(state))
    except BaseException:
        # launch_server's own finally: the children go, the error ends the server (exit 1)
        state.children.stop_watching()
        state.children.kill_tree(include_parent=False)
        raise
    end_after_drain(state)


def _raw(args: Namespace, release: str) -> Namespace:
    """The arguments as given, which the gRPC servicer reads (0.5.19+ seal the record, and
    the resolved values live beside it); 0.5.20+ launch_server seeds tokenizer_path from
    model_path first (launch_server.py:22-25)."""
    raw = Namespace(**copy.deepcopy(vars(args)))
    if raw.tokenizer_path is None and args_mod.release_tuple(release) >= (0, 5, 20, 0):
        raw.tokenizer_path = raw.model_path
    return raw


def end_after_drain(state: State) -> None:
    """How the drained server ends (TokenizerManager.sigterm_watchdog): 0.5.14+ stop the
    subprocess watchdog first (child exits are expected now) and send ShutdownReq, which every
    TP rank of every node gets (0.5.14 tokenizer_manager.py:2646-2651; multinode.py); 0.5.10 -
    0.5.18 then call kill_process_tree(os.getpid(), include_parent=True), which SIGKILLs the
    process itself; 0.5.19+ kill only the children and sys.exit(0) (0.5.18
    tokenizer_manager.py:3148-3158, 0.5.23 :3542-3571)."""
    rel = args_mod.release_tuple(state.release)
    if rel >= (0, 5, 14, 0):
        state.children.stop_watching()
        state.peers.shutdown()  # ShutdownReq: the other nodes' schedulers exit too
    state.children.kill_tree(include_parent=rel < (0, 5, 19, 0))
    sys.exit(0)


if __name__ == "__main__":
    main()
