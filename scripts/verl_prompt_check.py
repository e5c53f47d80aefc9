"""What verl's own prompt path makes of the synthetic prompts: the tokenizer of a model folder
(as scripts/verl_model.py writes it), the dataset built for it (tuner.dataset), and verl 0.9.1's
agent-loop tokenization of each prompt (verl.utils.tokenizer: hf_tokenizer, then the Continuous
Token builder of the config's model_type, `build_initial_tokens`, as SingleTurnAgentLoop runs it).

usage: python scripts/verl_prompt_check.py MODEL_DIR [--prompt-tokens 512] [--out DIR]
Prints one JSON line: versions, the tokenizer's class and pre-tokenizer, the target, the
lengths verl's path gives (min/mean/max) and whether the dataset is exact; exit 1 if the mean
is off the target by more than 5%.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def check(model_dir: Path, prompt_tokens: int, out: Path) -> dict:
    import pyarrow.parquet as pq
    import transformers
    from verl.utils.tokenizer import hf_tokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from tuner.dataset import load_tokenizer, write_synthetic

    tok, why = load_tokenizer(model_dir)
    ds = write_synthetic(
        out, prompt_tokens=prompt_tokens, max_prompt_len=prompt_tokens, rows=8, tokenizer=tok
    )
    vtok = hf_tokenizer(str(model_dir))
    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    builder = create_continuous_token_builder(vtok, hf_model_type=model_type)
    prompts = pq.read_table(ds.train_file).column("prompt").to_pylist()
    lengths = [len(builder.build_initial_tokens(list(p))) for p in prompts]
    backend = getattr(vtok, "backend_tokenizer", None) or getattr(vtok, "_tokenizer", None)
    return {
        "transformers": transformers.__version__,
        "tokenizer_class": type(vtok).__name__,
        "pre_tokenizer": repr(getattr(backend, "pre_tokenizer", None))[:120],
        "tuner_tokenizer": "loaded" if tok is not None else why,
        "model_type": model_type,
        "target": prompt_tokens,
        "exact": ds.exact,
        "verl_min": min(lengths),
        "verl_mean": sum(lengths) / len(lengths),
        "verl_max": max(lengths),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        got = check(a.model_dir, a.prompt_tokens, a.out or Path(tmp))
    print(json.dumps(got))
    return 0 if abs(got["verl_mean"] - got["target"]) <= 0.05 * got["target"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
