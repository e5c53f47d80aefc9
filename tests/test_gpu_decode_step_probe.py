"""scripts/gpu_decode_step_probe.py: the committed comparison of vLLM 0.24's measured decode step
(results/decode-step-h100-x1.jsonl and h200: one GPU each) with the cost model's is what the
script prints now, and the measured steps show the overlap the model assumes under async
scheduling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_decode_step_probe.py"
DATA = [REPO / "results" / f"decode-step-{g}-x1.jsonl" for g in ("h100", "h200")]


def test_committed_output_is_what_the_script_prints() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", *(str(d.relative_to(REPO)) for d in DATA)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == (REPO / "scripts" / "gpu_decode_step_probe.out.txt").read_text()


def test_async_scheduling_takes_host_time_off_every_measured_step() -> None:
    for path in DATA:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        step = {(r["async_scheduling"], r["batch"]): r["step_ms"] for r in rows}
        batches = sorted({b for _, b in step})
        assert len(batches) >= 3
        for b in batches:
            assert step[(True, b)] < step[(False, b)] - 0.5  # ms: the engine's host work hidden
