#!/bin/bash
# Runs the megatron worker on a few layouts and prints one line per run, then a summary table.
#   bash scripts/gpu_worker_smoke.sh 1gpu|4gpu [OUT_DIR]      (SMOKE_CASES="a b" runs only those)
# Needs megatron-core importable (source scripts/gpu_setup.sh first). Writes OUT_DIR/smoke.log
# (all worker output) and OUT_DIR/results.jsonl (one result.json per line, with case and wall_s).
#   1gpu: dense 1.7B-class (dynamic and fixed batching, recompute none/selective/full, offload),
#         a small MoE, and two runs that must end as oom (build and warmup). About 6 minutes.
#   4gpu: tp2+pp2+vpp2 (full recompute), tp2+dp2, MoE ep4 (about 2.5 minutes); also
#         dense-pp2-vpp2, moe-ep2 when named in SMOKE_CASES.
set -u
set -o pipefail
suite=${1:?give 1gpu or 4gpu}
out=${2:-${OUT:-/tmp/smoke}}
mkdir -p "$out/specs" "$out/runs"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

python3 - "$suite" "$out/specs" >"$out/specs/order" <<'EOF'
import json, sys
from tuner.runners.batching import step_sequence_lengths

suite, folder = sys.argv[1], sys.argv[2]
# Qwen3-1.7B-like dense model and a small Qwen3-MoE-like model.
DENSE = dict(name="dense-1.7b", num_layers=28, hidden_size=2048, ffn_hidden_size=6144,
             num_attention_heads=16, num_query_groups=8, kv_channels=128, vocab_size=151936,
             num_experts=0, moe_router_topk=0, moe_ffn_hidden_size=0, qkv_bias=False,
             tie_word_embeddings=True, qk_layernorm=True)
SMALL = dict(DENSE, name="dense-0.6b", num_layers=28, hidden_size=1024, ffn_hidden_size=3072,
             num_attention_heads=16, num_query_groups=8, kv_channels=128)
MOE = dict(name="moe-small", num_layers=8, hidden_size=1024, ffn_hidden_size=0,
           num_attention_heads=16, num_query_groups=4, kv_channels=128, vocab_size=151936,
           num_experts=32, moe_router_topk=4, moe_ffn_hidden_size=768, qkv_bias=False,
           tie_word_embeddings=False, qk_layernorm=True)
HUGE = dict(DENSE, name="dense-huge", num_layers=64, hidden_size=8192, ffn_hidden_size=28672,
            num_attention_heads=64, num_query_groups=8)

def lay(tp=1, pp=1, vpp=1, ep=1, etp=1):
    return dict(tp=tp, pp=pp, vpp=vpp, cp=1, ep=ep, etp=etp, sp=False)

def batch(n, mini, prompt=512, rmax=2048, rmean=1024, budget=16384, mbs=0, seed=0):
    lens = step_sequence_lengths(num_samples=n, prompt_len=prompt, response_max=rmax,
                                 response_mean=rmean, seed=seed)
    return dict(sequence_lengths=lens, mini_batch_size=mini, use_dynamic_bsz=mbs == 0,
                max_token_len_per_gpu=budget, micro_batch_size_per_gpu=mbs)

def rc(g="none", m="uniform", n=0):
    return dict(granularity=g, method=m, num_layers=n)

def off(p=False, g=False, o=False):
    return dict(param=p, grad=g, optimizer=o)

# Two layers of a Qwen3-30B-A3B-like MoE: 128 experts, top-8.
MOE128 = dict(MOE, name="moe-128e", num_layers=2, hidden_size=2048, num_attention_heads=32,
              num_query_groups=4, num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768)

if suite == "1gpu":
    cases = [
        ("dense-dyn", DENSE, lay(), rc(), off(), batch(64, 32, budget=8192)),
        ("dense-selective", DENSE, lay(), rc("selective"), off(), batch(64, 32, budget=8192)),
        ("dense-full-rc", DENSE, lay(), rc("full", "uniform", 1), off(), batch(64, 32)),
        ("dense-fixed-mbs4", DENSE, lay(), rc(), off(), batch(64, 32, mbs=4)),
        ("dense-offload", DENSE, lay(), rc(), off(True, True, True), batch(64, 32, budget=8192)),
        ("moe-ep1", MOE, lay(), rc(), off(), batch(64, 32)),
        ("moe-128e", MOE128, lay(), rc(), off(), batch(64, 32)),
        ("oom-build", HUGE, lay(), rc(), off(), batch(8, 8)),
        ("oom-warmup", DENSE, lay(), rc(), off(), batch(64, 64, prompt=4096, rmax=32768,
                                                         rmean=30000, budget=300000)),
    ]
else:
    cases = [
        ("dense-tp2-pp2-vpp2", SMALL, lay(tp=2, pp=2, vpp=2), rc("full", "uniform", 1), off(),
         batch(32, 16, budget=8192)),
        ("dense-tp2-dp2", SMALL, lay(tp=2), rc(), off(), batch(32, 16)),
        # MoE with tp > 1 needs sequence parallel (megatron-core refuses it otherwise, seen on
        # 2 H200s), and sequence parallel needs transformer-engine: no MoE tp2 case here.
        ("moe-ep4", MOE, lay(ep=4), rc(), off(), batch(32, 16)),
        # Run only when named in SMOKE_CASES:
        ("dense-pp2-vpp2", SMALL, lay(pp=2, vpp=2), rc(), off(), batch(32, 16, budget=8192)),
        ("moe-ep2", MOE, lay(ep=2), rc(), off(), batch(32, 16)),
    ]
    optional = {"dense-pp2-vpp2", "moe-ep2"}
import os
wanted = os.environ.get("SMOKE_CASES", "").split()
for name, model, layout, recompute, offload, b in cases:
    if (wanted and name not in wanted) or (not wanted and name in globals().get("optional", ())):
        continue
    spec = dict(schema=1, model=model, layout=layout, recompute=recompute, offload=offload,
                batch=b, steps=3, warmup_steps=1, seed=0)
    with open(f"{folder}/{name}.json", "w") as f:
        json.dump(spec, f)
    print(name)
EOF
[ $? -eq 0 ] || { echo "smoke: could not write the specs"; exit 1; }

nproc=1; per_run=150; budget=${SMOKE_BUDGET_S:-480}
[ "$suite" = 4gpu ] && { nproc=4; per_run=100; budget=${SMOKE_BUDGET_S:-200}; }
: >"$out/results.jsonl"
start=$(date +%s)
while read -r name; do
  spec="$out/specs/$name.json"
  if [ $(( $(date +%s) - start )) -gt "$budget" ]; then
    echo "$name: skipped, the suite's ${budget}s are spent"
    continue
  fi
  res="$out/runs/$name.result.json"
  rm -f "$res"
  t0=$(date +%s.%N)
  timeout -k 10 $per_run python3 -m torch.distributed.run --standalone --nproc-per-node $nproc \
    -m tuner.runners.megatron_worker --spec "$spec" --out "$res" >"$out/runs/$name.log" 2>&1
  rc=$?
  wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  python3 - "$name" "$res" "$rc" "$wall" >>"$out/results.jsonl" <<'EOF'
import json, sys
name, path, rc, wall = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
try:
    r = json.load(open(path))
except Exception as e:
    r = {"status": "no-result", "reason": f"rc={rc} {type(e).__name__}"}
r.update(case=name, rc=rc, wall_s=wall)
print(json.dumps(r))
EOF
  { echo "===== $name rc=$rc wall=${wall}s"; cat "$out/runs/$name.log"; } >>"$out/smoke.log"
  tail -n 1 "$out/results.jsonl" | python3 -c "
import json,sys; r=json.loads(sys.stdin.read()); e=r.get('extra',{})
print(f\"{r['case']:18s} {r.get('status'):9s} rc={r['rc']} wall={r['wall_s']}s phase={r.get('phase')} \"
      f\"step={r.get('step_s')} reason={r.get('reason','')[:150]}\")"
done <"$out/specs/order"
rm -rf "$out/runs" "$out/specs"

echo
echo "case               status  step_s  times              tok/s/gpu  mfu%   alloc/resv GiB  mb  init/build/wall s  attention"
python3 - "$out/results.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    e = r.get("extra", {})
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"
    times = ",".join(f"{t:.2f}" for t in r.get("step_times_s", []))
    print(f"{r['case']:18s} {r.get('status','?'):7s} {f(r.get('step_s')):>6s}  {times:18s} "
          f"{f(r.get('tokens_per_s_per_gpu'), 0):>9s}  {f(r.get('mfu_pct'), 1):>5s}  "
          f"{f(r.get('peak_mem_allocated_gib'), 1):>5s}/{f(r.get('peak_mem_reserved_gib'), 1):<6s}  "
          f"{r.get('num_micro_batches', '-'):>3}  {e.get('init_s','-')}/{e.get('build_s','-')}/"
          f"{r.get('wall_s')}  {e.get('attention', '')} {r.get('phase', '')} "
          f"{(r.get('reason') or '')[:90]}")
EOF
