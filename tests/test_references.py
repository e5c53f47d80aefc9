from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY, from_hf_config
from tuner.references import reference_candidates, reference_family, scale_layout
from tuner.space import validate
from tuner.workload import PRESETS


@pytest.mark.parametrize(
    ("text", "world", "expect"),
    [
        ("tp4pp2", 8, "tp4pp2"),
        ("tp4pp2", 2, "tp2"),
        ("tp4ep8", 2, "tp2ep2"),
        ("ep8", 2, "ep2"),
        ("ep8cp4", 4, "cp4ep4"),
        ("tp4pp2vpp2", 4, "tp2pp2vpp2"),
        ("tp4pp2vpp2", 2, "tp2"),
        ("tp4ep32", 32, "tp4ep32"),
    ],
)
def test_scale_layout_halves_the_largest_degree(text: str, world: int, expect: str) -> None:
    lay = scale_layout(text, world)
    assert lay is not None and lay.notation == expect and lay.world == world


def test_references_at_two_gpus_are_scaled_and_say_so() -> None:
    m, w = REGISTRY["qwen2.5-7b"], PRESETS["grpo-short"]
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=2)
    refs = reference_candidates(m, cl, w)
    origins = {o for _, o in refs}
    assert "reference tp2" in origins and "reference tp4pp2 as tp2" in origins
    assert all(c.layout.world == 2 for c, _ in refs)
    assert all(validate(c, m, cl, w) == [] for c, _ in refs if c.layout.cp == 1)


def test_fewer_layer_config_uses_its_family_references(tmp_path: Path) -> None:
    base = REGISTRY["qwen3-30b-moe"]
    d = tmp_path / "qwen3-30b-moe-8l"
    d.mkdir()
    src = Path(__file__).parents[1] / "scripts" / "models" / "qwen3-30b-moe-8l" / "config.json"
    (d / "config.json").write_text(src.read_text())
    m = from_hf_config(d / "config.json")
    assert m.num_layers == 8 and m.num_experts == base.num_experts
    assert reference_family(m) == "qwen3-30b-moe"
    assert reference_family(REGISTRY["qwen3-8b"]) == ""
