#!/usr/bin/env bash
# Each speed feature of the fused companion (rms_norm_fused_cutedsl.py) against the plan it would
# run without that feature, at shapes where the feature is picked: time_plans.py times the
# companion's own plan (the feature on) and the alternative in the same rounds, so the "/ own plan"
# column of the alternative is what switching the feature off costs (> 1: it pays).
# benchmarks/NOTES.md ("Speed features and what each buys") records the figures; the 1-vector
# few-token plan of 2-3 KB rows, dropped in d3b1255, was timed by this script at 241895e. Needs a
# GPU.
#
#     bash benchmarks/experiments/speed_features.sh [--rounds 5] [--dtypes float16,bfloat16]
set -euo pipefail
cd "$(dirname "$0")/../.."
time_plans() {
    echo "## $1"
    shift
    python3 benchmarks/experiments/time_plans.py "$@" "${EXTRA[@]}"
}
EXTRA=("$@")
[[ " $* " == *" --dtypes "* ]] || EXTRA+=(--dtypes float16,bfloat16)

time_plans "cluster: 4 CTAs share a row (alternative: the few-token plan, one CTA a row)" \
    --shapes 1x8192,32x8192 --plans t256k4
time_plans "cluster at 16384, up to 128 rows" --shapes 1x16384,128x16384 --plans t512k4
time_plans "few-token plan: X and W in registers (alternative: the row's own plan)" \
    --shapes 1x4096,128x4096 --plans t256k2s
time_plans "few-token plan at 10240" --shapes 128x10240 --plans t320k4sl
time_plans "mid plan: 2 rows per CTA in turn, bulk copy (alternatives: own plan; cp.async; one row \
per CTA)" \
    --shapes 512x8192,1024x8192 --plans t256k4,t256k4sq2,t256k4sb
time_plans "mid plan by cp.async at 4096 (alternative: one staged row per CTA)" \
    --shapes 512x4096,1024x4096 --plans t256k2s
time_plans "mid plan up to 4096 rows from 20 KB rows (alternative: the own plan)" \
    --shapes 2048x10240,4096x10240 --plans t320k4sl
time_plans "MID_BOUND: 2 CTAs/SM for mid plans of 480+ threads (alternative: no launch bound)" \
    --shapes 2048x15360,4096x15360 --plans t480k4sbq2
time_plans "2-CTA cluster for 16 KB rows from 1025 rows (alternative: one CTA a row)" \
    --shapes 4096x8192,16384x8192 --plans t256k4
time_plans "cp.async staging in the own plan (alternative: X in registers)" \
    --shapes 4096x4096,16384x4096 --plans t256k2
time_plans "cp.async staging at 12 KB rows" --shapes 8192x6144 --plans t192k4
time_plans "W after the reduction at 24 KB rows (alternative: W first)" \
    --shapes 16384x12288 --plans t192k8s
time_plans "launch bound 8 CTAs/SM at 2 KB rows (alternative: none)" \
    --shapes 4096x1000,16384x1024 --plans t64k2r2
time_plans "launch bound 8 CTAs/SM at exactly 3 KB (alternative: none)" \
    --shapes 4096x1536 --plans t96k2
time_plans "short rows: 256 threads a CTA, W late (alternatives: 128 threads; W first)" \
    --shapes 4096x100 --plans t16k2lr8,t16k2r16
time_plans "launch bound 8 CTAs/SM at 2-3 KB rows other than 3 KB (the own plan has none)" \
    --shapes 4096x1152,4096x1280,4096x1408,16384x1280 --plans t96k2m8
time_plans "short rows: 128 threads a CTA with W first, with and without the launch bound of 2 KB \
rows" \
    --shapes 4096x100,16384x100 --plans t16k2r8,t16k2r8m8
time_plans "mid plan up to 4096 rows at 24 KB rows (alternative: the own plan)" \
    --shapes 2048x12288,4096x12288 --plans t192k8sl
time_plans "mid plan up to 4096 rows at 30 KB rows (alternative: the own plan)" \
    --shapes 2048x15360,4096x15360 --plans t256k8sl
time_plans "mid plan up to 4096 rows at 32 KB rows (alternative: the own plan)" \
    --shapes 2048x16384,4096x16384 --plans t512k4l
time_plans "MID_BOUND within 1024 rows (alternative: no launch bound)" \
    --shapes 512x16384,1024x16384 --plans t512k4sbq2
time_plans "MID_BOUND within 1024 rows at 30 KB rows" \
    --shapes 512x15360,1024x15360 --plans t480k4sbq2
