"""The entry point: serve generation requests from a pool folder until an exit request.

The folder and its files are megatron_pool's (tuner.runners.megatron_worker.protocol): requests
`req-<seq>.json` (`cmd` trial: `spec` a gen-spec.json, `out` the result to write), `ready.json`
once up, `done-<seq>` after each request. A failed request writes its result (OOM, vLLM's
refusal with its reason, or the failure) and the process exits: the runner starts a fresh
worker, so no half-built or out-of-memory engine serves the next trial."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from tuner.runners.megatron_worker.protocol import Request, serve
from tuner.runners.megatron_worker.result import one_line, write_json_atomic
from tuner.runners.process import log_tail
from tuner.runners.vllm_gen.spec import GenResult, classify_failure, load_gen_spec

POOL_LOG = "pool.log"
"""Where megatron_pool.WorkerPool sends this process's output (and vLLM's engine processes')."""


def _env() -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if importlib.util.find_spec("flashinfer") is None:
        # vLLM 0.24's TopKTopPSampler imports flashinfer unless this is 0 (the GPU kit's README)
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.runners.vllm_gen")
    ap.add_argument("--pool", type=Path, required=True, help="serve requests in this folder")
    args = ap.parse_args(argv)
    _env()
    from tuner.runners.vllm_gen.engine import Engine

    pool: Path = args.pool
    pool.mkdir(parents=True, exist_ok=True)
    engine = Engine()

    def handle(req: Request) -> bool:
        res = engine.serve(load_gen_spec(req["spec"]))
        write_json_atomic(Path(req["out"]), res.to_dict())
        print(
            f"vllm_gen: {res.status} {res.sequences} sequences {res.tokens_generated} tokens in "
            f"{res.generation_s or 0:.2f}s (engine {'reused' if res.engine_reused else 'built'})",
            flush=True,
        )
        return True

    def on_failure(e: BaseException, req: Request) -> int:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        status, reason = classify_failure(one_line(e), log_tail(pool / POOL_LOG, 40_000))
        write_json_atomic(Path(req["out"]), GenResult(status=status, reason=reason).to_dict())
        print(f"vllm_gen: {status}: {reason}", flush=True)
        return 1

    serve(pool, handle, on_failure)
    return 0
