"""What a study learns between trials: the memory guard over sequences of observations."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.estimate.device import PHASE_HEADROOM_GIB, phase_headroom_gib
from tuner.fit.online import OOM_MARGIN_GIB, MemoryGuard, MemoryObservation


def test_guard_before_any_trial_is_the_raw_model_with_the_default_headroom() -> None:
    """Without a study headroom the guard keeps the cost model's headroom of the candidate's
    peak phase (seeded from device.phase_headroom_gib); with one, that one for every phase."""
    g = MemoryGuard(80.0)
    assert g.headroom_gib is None
    assert g.corrected_gib(70.0) == 70.0
    for phase in PHASE_HEADROOM_GIB:
        h = phase_headroom_gib(phase)
        assert g.headroom_for(phase) == h
        assert g.unfit(80.0 - h - 0.1, phase) == ""
        assert g.unfit(80.0 - h + 0.1, phase) != ""
    # 76.5 GiB leaves 3.5 free: enough at the generation peak, not at the update peak
    assert g.unfit(76.5, "generation") == ""
    line = g.unfit(76.5, "update_actor")
    assert "76.5 GiB in update_actor" in line and "headroom 3.8 GiB" in line and "80.0" in line
    assert MemoryGuard(80.0, headroom_gib=0.0).unfit(79.9, "update_actor") == ""
    assert MemoryGuard(80.0, headroom_gib=1.0).headroom_for("update_actor") == 1.0
    with pytest.raises(ValueError, match="headroom_gib"):
        MemoryGuard(80.0, headroom_gib=-1.0)


def test_guard_learns_a_robust_scale_from_ok_trials() -> None:
    g = MemoryGuard(140.0, headroom_gib=2.0)
    for p, m in ((100.0, 110.0), (90.0, 99.0), (80.0, 88.0), (60.0, 20.0)):  # one odd row
        g.observe(MemoryObservation(predicted_gib=p, measured_gib=m, oom=False))
    assert g.corrected_gib(100.0) == pytest.approx(110.0)
    assert g.unfit(126.0, "update_actor") != ""  # 138.6 + 2 > 140
    assert g.unfit(125.0, "update_actor") == ""  # 137.5 + 2 <= 140
    g.observe(MemoryObservation(predicted_gib=50.0, measured_gib=None, oom=False))  # no measure
    assert g.corrected_gib(100.0) == pytest.approx(110.0)


def test_an_oom_makes_everything_from_its_corrected_prediction_unfit() -> None:
    """The issue's trial: predicted to fit at 130.8 GiB of a 139.8 GiB H200, it ran out."""
    g = MemoryGuard(139.8, headroom_gib=2.0)
    assert g.unfit(130.8, "update_actor") == ""
    g.observe(MemoryObservation(predicted_gib=130.8, measured_gib=None, oom=True))
    assert "ran out of memory" in g.unfit(130.8, "update_actor")
    assert g.unfit(130.8 - OOM_MARGIN_GIB / 2, "update_actor") != ""
    assert g.unfit(129.0, "update_actor") == ""


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(10.0, 130.0),
            st.floats(0.5, 1.5),
            st.booleans(),
        ),
        max_size=12,
    ),
    st.floats(10.0, 135.0),
    st.sampled_from(sorted(PHASE_HEADROOM_GIB)),
)
def test_guard_properties(seq: list[tuple[float, float, bool]], probe: float, phase: str) -> None:
    g = MemoryGuard(140.0)
    ooms: list[float] = []
    for p, ratio, oom in seq:
        g.observe(
            MemoryObservation(predicted_gib=p, measured_gib=None if oom else p * ratio, oom=oom)
        )
        if oom:
            ooms.append(p)
    lo, hi = 0.7, 1.5
    assert lo <= g.scale <= hi
    # monotone: what is unfit stays unfit for anything predicted larger
    if g.unfit(probe, phase):
        assert g.unfit(probe + 1.0, phase)
    # every OOM's own prediction stays unfit for the rest of the study
    for p in ooms:
        assert g.unfit(p, phase)
    # whatever fits leaves its phase's headroom free
    if not g.unfit(probe, phase):
        assert g.corrected_gib(probe) + g.headroom_for(phase) <= 140.0
        assert all(
            g.corrected_gib(probe) < g.corrected_gib(p) - OOM_MARGIN_GIB + 1e-9 for p in ooms
        )
    assert math.isfinite(g.corrected_gib(probe))
