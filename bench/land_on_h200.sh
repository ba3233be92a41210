#!/usr/bin/env bash
# What this branch needs from an H200 before it may land on main: its recipes changed
# the attention section binds and gemm_auto's dispatch (an `even` kernel of 128 x 192
# tiles), and both were measured on an H100 only.
#
# Here (the CPU machine), once:
#   python -m tests.gpu.build gemm gemm_auto gemm_swiglu gemm_swiglu_auto gemm_streamk \
#     gemm_swiglu_streamk gemm_multicast gemm_pingpong gemm_swiglu_pingpong attn_causal \
#     attn_dense attn_softcap attn_alibi attn_sliding attn_document attn_block_sparse \
#     attn_paged attn_causal_deterministic attn_causal_d64 attn_dense_d64 \
#     attn_causal_d64_deterministic attn_sliding_d64 attn_block_sparse_d64 attn_paged_d64 \
#     attn_document_d64 attn_cp_ring attn_document_ids
# then on the device, carrying build/gpu, three calls of at most ten minutes:
#   bash bench/land_on_h200.sh tests      # GPU tests + the sections sweep
#   bash bench/land_on_h200.sh benches    # attention forward/backward + GEMM benches
#   bash bench/land_on_h200.sh sanitize   # `narrow` (168-wide tiles, unswizzled
#                                         # staging) under compute-sanitizer
# Each writes its JSON and logs under $OUT and stops at once on anything but an H200.
# Back here: copy the JSON into bench/, run each bench's --report, and rewrite what the
# branch's docs say from the H100 (docs/recipes/attention.md "Scheduler sections",
# recipes/attn_*.yaml bind comments, recipes/gemm_auto.yaml's fitted rule, README's
# dispatch text, docs/pytorch.md) from the H200's numbers; then delete this script.
set -uo pipefail
export PYTHONPATH=$PWD
OUT=${OUT:?run on the device machine, where \$OUT is set}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" > "$OUT/gpu.txt"
case "$gpu" in
  *H200*) ;;
  *) echo "not an H200 ($gpu): nothing run"; exit 3 ;;
esac

step() {   # name, seconds, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "rc=$?" >> "$OUT/$name.log"
  tail -3 "$OUT/$name.log"
}

case "${1:-}" in
  tests)
    step tests 330 python -m pytest -q -x tests/gpu/test_attention.py tests/gpu/test_split_k.py \
      tests/gpu/test_gemm.py --junitxml="$OUT/junit.xml"
    step sections 240 python bench/attention_sections.py --json "$OUT/attention_sections.json"
    ;;
  benches)
    step attention 200 python bench/attention.py --json "$OUT/attention.json"
    step attention_backward 200 python bench/attention_backward.py \
      --json "$OUT/attention_backward.json"
    step gemm 170 python bench/gemm_swiglu.py --json "$OUT/gemm_swiglu.json"
    ;;
  sanitize)
    # M = 200, N = 22016 runs `narrow` (tests/gpu/test_split_k.py); `even` ran clean
    # under all three on the H100.
    for tool in memcheck racecheck synccheck; do
      step "$tool" 180 compute-sanitizer --tool "$tool" --error-exitcode 9 \
        python -m tests.gpu.gemm_check build/gpu/sm_90a gemm_auto 200 22016 128
    done
    ;;
  *) echo "usage: bash bench/land_on_h200.sh tests|benches|sanitize"; exit 2 ;;
esac
