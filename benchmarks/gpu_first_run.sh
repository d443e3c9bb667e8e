#!/usr/bin/env bash
# The first GPU run, in seven parts that each fit one 10-minute device call (engine
# starts take about a minute there). Work folders live under /tmp/gpu-run, which survives between
# calls on the same machine; each part copies its outputs and logs to OUT (the device's $OUT).
#   tests     pytest of the GPU pipeline test, test_compat, and the engine tests that run as they
#             would on a GPU: the engine core in its own process (vLLM 0.26's policy and draft
#             reloads, float32) and the bfloat16 paths (rollout, chunked policy sync, draft push)
#   measure   the memory plan against a real update (benchmarks/memory_plan.py), the bfloat16
#             check tolerance (benchmarks/bf16_tolerance.py)
#   pipe-a    gpu_pipeline.sh: init-draft, export, rollout --compare at T=0 and T=1, verify (greedy)
#   pipe-b    gpu_pipeline.sh: train-rl (policy sync + draft refresh, logprob checks), verify
#             (probabilistic), the quality preset and its engine-measured acceptance (needs pipe-a)
#   what-if   docs/commands.md's Qwen3-8B what-if: weightless sweep-k at batch 1-256, then forecast
#   pushes    every drafter family's refresh push with CUDA graphs on (eagle3, peagle, dflash: the pushed
#             engine drafts what a fresh one drafts, every captured tensor where it was, the runner named;
#             mtp: tests/test_mtp.py's push on the GPU), then the engine log's runner lines
#   trl       TRL's GRPOTrainer, one process, colocated engine: plain, frozen and online-refreshed arms
#             (benchmarks/trl_arms.py --tiny: the plumbing on a GPU, acceptance and stage times)
#   sampling  greedy vs probabilistic proposals at T=1 (benchmarks/draft_sampling.sh) with DRAFT=<draft folder>
#             HARVEST=<its harvest run> (carried; a CPU-trained draft works), batch sizes BATCHES (default 1,8)
# Measured on the first lent H200 (docs/gpu.md): the bundle's install 76 s of device time; the `tests` part's
# tiny pipeline alone more than 200 s; `sampling` about 120 s a proposal mode with the compile cache warm. On the
# second (docs/gpu.md): the install 82 s; `pushes` about 125 s a family (more than one call: run -k dflash apart);
# `measure` 150 s.
# What each part must print: pytest "passed" with no "failed"; memory-plan "measured / plan" between 0.8 and
# 1.1; the pipeline's times.tsv with exit 0 on every stage; pushes: 3 passed; trl: three arms, each with
# logprob checks under the bfloat16 tolerance (0.1) and, for frozen/online, an acceptance length.
# Usage (bundle installed): . /tmp/site/env.sh && bash benchmarks/gpu_first_run.sh PART [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:?tests | measure | pipe-a | pipe-b | what-if | pushes | trl | sampling}
OUT=${2:-${OUT:-runs/gpu-first-run}}
PY=${PYTHON:-python3}
WORK=/tmp/gpu-run
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
$PY -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" >> "$OUT/gpu.csv" 2>&1
run() {  # run NAME CMD...: time it, keep stdout+stderr under OUT
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  printf '%s\t%ss\texit %s\n' "$name" $((SECONDS - t0)) "$rc" | tee -a "$OUT/parts.tsv"
}
case $PART in
  tests)
    run pytest-gpu $PY -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_compat.py \
      tests/test_engine_process.py tests/test_bf16_engine.py ;;
  measure)
    run memory-plan $PY benchmarks/memory_plan.py
    run bf16-tolerance $PY benchmarks/bf16_tolerance.py --prompts 32 --samples 4 --lrs 1e-6,3e-6,1e-5 ;;
  pipe-a)
    ONLY="init-draft export rollout-t0 rollout-t1 verify-greedy" run pipeline-a bash benchmarks/gpu_pipeline.sh "$WORK/pipeline"
    cp "$WORK"/pipeline/*.out "$WORK"/pipeline/times.tsv "$OUT"/ 2>/dev/null ;;
  pipe-b)
    ONLY="train-rl verify-probabilistic init-draft-quality draft-quality" \
      run pipeline-b bash benchmarks/gpu_pipeline.sh "$WORK/pipeline"
    cp "$WORK"/pipeline/*.out "$WORK"/pipeline/times.tsv "$WORK"/pipeline/rl/metrics.jsonl "$OUT"/ 2>/dev/null ;;
  what-if)
    run sweep $PY -m spectool.cli sweep-k --model qwen3-8b --dummy-weights --acceptance-length 3.32 --k 1,2,3 \
      --batch-sizes 1,16,64,256 --lengths long-tail --max-tokens 1024 --out "$WORK/sweep-qwen3-8b"
    run forecast $PY -m spectool.cli forecast --sweep "$WORK/sweep-qwen3-8b" --acceptance-rates 0.89,0.79,0.64 \
      --generation-share 0.66 --batch 512 --max-concurrency 256 --out "$WORK/forecast-qwen3-8b"
    cp -r "$WORK/sweep-qwen3-8b" "$WORK/forecast-qwen3-8b" "$OUT"/ 2>/dev/null ;;
  pushes)
    run pushes $PY -m pytest -q -p no:cacheprovider -rA tests/test_gpu.py -k cuda_graphs
    run mtp-push $PY -m pytest -q -p no:cacheprovider tests/test_mtp.py -k engine_drafts_with_mtp ;;
  trl)
    run trl-arms $PY benchmarks/trl_arms.py --tiny --steps 3 --out "$WORK/trl-arms"
    cp -r "$WORK/trl-arms" "$OUT"/ 2>/dev/null ;;
  sampling)
    run draft-sampling env PYTHON="$PY" bash benchmarks/draft_sampling.sh "${DRAFT:?DRAFT=<draft folder>}" \
      "${HARVEST:?HARVEST=<harvest run>}" "$WORK/draft-sampling"
    cp -r "$WORK/draft-sampling" "$OUT"/ 2>/dev/null ;;
  *) echo "unknown part $PART: tests | measure | pipe-a | pipe-b | what-if | pushes | trl | sampling" >&2; exit 2 ;;
esac
cat "$OUT/parts.tsv"
