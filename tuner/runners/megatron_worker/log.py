"""Small helpers every worker module uses: the log line and a running sum."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence


def log(msg: str) -> None:
    rank = os.environ.get("RANK", "0")
    print(f"[worker r{rank} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cumsum(xs: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out
