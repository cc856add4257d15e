#!/usr/bin/env bash
# The STE records of one LLM under the clean demonstration pool (prompt.demo_pool=train, the default),
# each step published into experiments/records/ste-<llm>.jsonl.gz as soon as it is done, so a step
# that is cut off loses only itself (each resumes from the cache under .cache/ on the same machine):
#   1. the LLM stage (generation, capture, labels) on all 750 calls
#   2. P(True), verbalized confidence and the way-out prompt on all 750 calls (one shared prefill)
#   3. self-consistency, k = 10, on the 200 test calls, and the semantic entropy of the same samples
# Usage: OMP_NUM_THREADS=1 bash experiments/records/regenerate.sh smollm2_135m [first step]
set -euo pipefail
llm=$1; step=${2:-1}
out=experiments/records/ste-$llm.jsonl.gz
run() { echo "[$(date -u +%FT%TZ)] $*"; /usr/bin/time -f "wall %e s, user %U s, max RSS %M KB" "$@"; }
py=${PYTHON:-.venv/bin/python}
[ "$step" -le 1 ] && run "$py" -m mice_exp records llm="$llm" output="$out" force=true
[ "$step" -le 2 ] && run "$py" -m mice_exp records llm="$llm" llm.records="$out" \
    "sources.use=[p_true,verbalized,acts]" output="$out"
[ "$step" -le 3 ] && run "$py" -m mice_exp records llm="$llm" llm.records="$out" \
    "sources.use=[consistency,semantic_entropy]" "sources.consistency.splits=[test]" output="$out"
echo "[$(date -u +%FT%TZ)] done: $out"
