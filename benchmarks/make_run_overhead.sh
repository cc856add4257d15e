#!/bin/bash
# `make run` outside its LLM stage: the default run (SmolLM2-135M, 45 STE calls) timed with the LLM
# stage already cached, and a fresh feature cache and MLflow store each time, so what is timed is
# start-up, model and encoder loads, BERTScore, estimation, MLflow logging and the gate (README,
# "Measured figures"). Time it on a quiet machine: the load average is printed beside every run.
#   bash benchmarks/make_run_overhead.sh [RUNS]    (default 2; the first call also runs the stage once)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-2}
PY=.venv/bin/python
WORK=${TMPDIR:-/tmp}/mice_exp_make_run_overhead
mkdir -p "$WORK/stage" .cache/models
[ -e "$WORK/stage/models" ] || ln -s "$PWD/.cache/models" "$WORK/stage/models"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); torch capability:" \
     "$($PY -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')"
# the LLM stage once (cached in $WORK/stage: later calls reuse it)
$PY -m mice_exp stage=llm dataset.max_apis=3 paths.cache="$WORK/stage" tracking.enabled=false > "$WORK/stage.log" 2>&1 \
  || { tail -5 "$WORK/stage.log"; exit 1; }
for i in $(seq 1 "$RUNS"); do
  rm -rf "$WORK/run"; mkdir -p "$WORK/run/cache"
  cp -r "$WORK/stage/llm" "$WORK/run/cache/"; ln -s "$PWD/.cache/models" "$WORK/run/cache/models"
  echo "run $i: load average before $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "run $i: %e s wall, %U s user, %S s sys, peak RSS %M KB" \
    $PY -m mice_exp dataset.max_apis=3 paths.cache="$WORK/run/cache" tracking.uri="sqlite:///$WORK/run/mlflow.db" \
    > "$WORK/run_$i.log" 2>&1 || { tail -5 "$WORK/run_$i.log"; exit 1; }
  tail -1 "$WORK/run_$i.log"
  echo "run $i: load average after $(cut -d' ' -f1-3 /proc/loadavg)"
done
