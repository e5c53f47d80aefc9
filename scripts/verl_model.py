"""A model folder verl and vLLM load with no network: a config.json's architecture with random
bf16 weights, and a tokenizer built offline whose vocabulary is the model's whole vocabulary (a
random model samples any id; each one decodes). Used by scripts/gpu_verl_study.sh.

usage: python scripts/verl_model.py CONFIG_JSON OUT_DIR [--layers N]
The tokenizer: tuner.dataset.write_word_tokenizer at the config's vocabulary size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, help="fewer layers (a CPU check of this script)")
    ap.add_argument("--tokenizer-only", action="store_true", help="rewrite the tokenizer only")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tuner.dataset import write_word_tokenizer

    t0 = time.monotonic()
    raw = json.loads(Path(a.config).read_text())
    if a.layers:
        raw["num_hidden_layers"] = a.layers
    a.out.mkdir(parents=True, exist_ok=True)
    n_vocab = write_word_tokenizer(a.out, int(raw["vocab_size"]))
    if a.tokenizer_only:
        print(f"verl_model: {a.out}: tokenizer of {n_vocab} tokens")
        return 0
    ids = {"pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 3}
    cfg = AutoConfig.for_model(**{**raw, **ids, "torch_dtype": "bfloat16"})
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)
    model.generation_config.save_pretrained(a.out)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"verl_model: {a.out}: {cfg.model_type} {params / 1e9:.2f}B params, vocabulary "
        f"{n_vocab}, {time.monotonic() - t0:.0f} s on {device}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
