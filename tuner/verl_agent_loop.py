"""verl-tuner's agent loop for performance runs: verl's single-turn loop with each response
capped at the length the workload's length model drew for it (tuner.dataset.draw_response_caps),
so a measured run has the long tail of real RL responses while a random-weight model, which
never stops by itself, runs each response to its cap (the study sets `rollout.ignore_eos`).

Imported inside verl's agent-loop workers (never by the tuner itself): the synthetic dataset's
`agent_loops.yaml` names it, and each row's `agent_name` picks it. Facts from verl 0.9.1:
- the v1 trainer (`trainer.use_v1`, the default) runs the n responses to a prompt as n calls of
  the loop with `session_id` = 0..n-1 and the row's columns as keyword arguments
  (trainer/ppo/v1/agent_loop_tq.py, `_run_prompt`); the legacy trainer passes no session id;
  there the k-th call this worker makes for a row takes the k-th cap;
- a per-request `max_tokens` in the sampling params caps the response, clamped to
  `rollout.response_length` (workers/rollout/vllm_rollout/vllm_async_server.py, `generate`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

_CALLS: Counter[Any] = Counter()
"""Calls per row index in this worker process (the legacy trainer's stand-in for session_id)."""


def cap_for(caps: Any, session_id: Any, index: Any) -> int | None:
    """The cap of this response: the session's entry of the row's caps; None without caps."""
    if caps is None or len(caps) == 0:
        return None
    if session_id is None:
        session_id = _CALLS[index]
        _CALLS[index] += 1
    return int(caps[int(session_id) % len(caps)])


class DrawnLengthAgentLoop(SingleTurnAgentLoop):  # type: ignore[misc]
    """Single turn; the response's `max_tokens` is its drawn length."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        cap = cap_for(kwargs.get("response_caps"), kwargs.get("session_id"), kwargs.get("index"))
        if cap is not None:
            sampling_params = {**sampling_params, "max_tokens": cap}
        return await super().run(sampling_params, **kwargs)
