"""The CLI reads every layout the search writes (one grammar: tuner.space.layout.read_degrees)
and takes verl's uneven first/last stages where pp does not divide the layers."""

from __future__ import annotations

import argparse
import json

import pytest

from tuner.cli import main
from tuner.cli_args import layout_text
from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.space import ParallelLayout, SearchSpace
from tuner.space.layout import balanced_split, read_degrees
from tuner.workload import PRESETS


def test_the_cli_reads_every_layout_the_search_writes() -> None:
    m = REGISTRY["qwen3-235b-moe"]
    space = SearchSpace(
        model=m, cluster=Cluster(gpu=get_gpu("h100"), num_gpus=64), workload=PRESETS["dapo-math"]
    )
    uneven = [lay for lay in space.layouts.values() if lay.uneven]
    assert uneven
    for lay in space.layouts.values():
        assert layout_text(lay.spec) == lay.spec
        assert ParallelLayout.parse(lay.spec, 64, m.num_layers) == lay


def test_pp_that_does_not_divide_the_layers_takes_the_balanced_uneven_split() -> None:
    lay = ParallelLayout.parse("tp4pp8ep32", 256, num_layers=94)
    # the search's split of (94 layers, pp8): balanced_split, stages of at most 12 layers
    assert (lay.first_stage_layers, lay.last_stage_layers) == balanced_split(94, 8)
    assert lay.uneven and max(lay.stage_layers(94)) == 12
    # written first/last stand; no model: as written
    assert ParallelLayout.parse("tp4pp8first10last12ep8", 256, 94).first_stage_layers == 10
    assert not ParallelLayout.parse("tp4pp8ep32", 256).uneven


def test_one_grammar_refuses_alike() -> None:
    for bad in ("tp4xx2", "tp2tp2", "", "tp4 pp²"):
        with pytest.raises(UserError):
            read_degrees(bad)
        with pytest.raises(argparse.ArgumentTypeError):
            layout_text(bad)


@pytest.mark.parametrize("layout", ["tp4pp8first10last12ep8", "tp4pp8ep32"])
def test_tune_estimate_takes_the_published_235b_layouts(
    layout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # rollout tp 16: at the default 1, vLLM has no room for the 235B weights (a negative KV
    # cache and an infinite step, which tune estimate refuses: tests/test_nonsense_38.py)
    argv = ["estimate", "--model", "qwen3-235b-moe", "--gpus", "256", "--layout", layout]
    rc = main([*argv, "--rollout-tp", "16", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)
