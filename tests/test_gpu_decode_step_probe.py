"""scripts/gpu_decode_step_probe.py: the committed comparison of vLLM 0.24's measured decode step
(results/decode-step-h100-x1.jsonl, one H100) with the cost model's is what the script prints
now, and the measured steps show the overlap the model assumes under async scheduling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_decode_step_probe.py"
DATA = REPO / "results" / "decode-step-h100-x1.jsonl"


def test_committed_output_is_what_the_script_prints() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "compare", str(DATA.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == (REPO / "scripts" / "gpu_decode_step_probe.out.txt").read_text()


def test_async_scheduling_takes_host_time_off_every_measured_step() -> None:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    step = {(r["async_scheduling"], r["batch"]): r["step_ms"] for r in rows}
    batches = sorted({b for _, b in step})
    assert len(batches) >= 3
    for b in batches:
        assert step[(True, b)] < step[(False, b)] - 1.0  # ms: the engine's host work hidden
