#!/usr/bin/env bash
# The first GPU run, for a lent machine of 15 device-minutes in all (its start, the install, every call): parts
# most valuable first, each within one 10-minute call (each capped at CAP seconds, default 570; engine starts
# take about a minute there). Run them in this order and stop where the time ends. Work folders live under
# /tmp/gpu-run, which survives between calls on the same machine; each part copies its outputs and logs to OUT.
#
# part       what it proves                                                device s measured (docs/gpu.md)
# install    the environment: GPU, torch, vLLM, spectool and compat's view   bundle install: 76 s and 82 s (H200,
#            of the build (the offline bundle itself is installed before,   0.26.0, five calls, start included);
#            in its own calls)                                              this check: not measured
# pipeline   the pipeline on the embedded model: init-draft, export,       not measured
#            rollout --compare at T=0 and T=1
# verify     verify with greedy proposals on that export (its lossy        not measured
#            control included); needs pipeline
# trl        TRL's GRPOTrainer, one process, colocated engine, the draft   not measured
#            refreshed online (benchmarks/trl_arms.py --arms online: the
#            pipeline's draft when it ran here, else --tiny)
# sweep-aa   sweep-k's decision, A/A (issue 49): plain decoding in fresh    not measured
#            engines one after the other at batch 1 and 64 until UNTIL s
#            (default 200), then the run-to-run noise and the A/A false
#            recommendations (benchmarks/sweep_calibration.py)
# --- the rest ---
# trl-arms   the plain and frozen arms beside it                           not measured
# pushes     every family's refresh push with CUDA graphs on (eagle3,      about 125 s a family, dflash 124-128 s;
#            peagle, dflash) and MTP's push                                mtp 105 s (H200, 0.26.0)
# measure    the memory plan against a real update, the bfloat16 check's   150 s (H200, 0.26.0)
#            tolerance
# tests      pytest -m gpu's tiny pipeline, test_compat, the engine-       more than 200 s (stopped at a 200 s cap,
#            process and bfloat16 engine tests                             H200, 0.26.0)
# pipe-b     train-rl on the pipeline's draft, verify with probabilistic   not measured
#            proposals, the quality preset (needs pipeline)
# what-if    the Qwen3-8B weightless sweep-k and forecast: two calls       more than 130 s (plain arm only in a
#            (the second resumes from rows.jsonl)                          130 s cap, H200, 0.26.0)
# sampling   greedy vs probabilistic proposals at T=1 with DRAFT=<draft    about 120 s a proposal mode, compile
#            folder> HARVEST=<its harvest run>, batch sizes BATCHES        cache warm (H200, 0.26.0)
#
# What each part must print:
#   install   "torch ... cuda True", "vllm 0.26.0" (or the release installed) and spectool's "served build" line
#   pipeline  times.tsv with exit 0 on every stage; for rollout-t0 and rollout-t1 the speedup, plain and
#             speculative tokens/s and the mean acceptance length (T=0: output identical to plain decoding)
#   verify    "verdict: LOSSLESS" and "lossy control rejected"
#   trl       the online arm: logprob checks under the bfloat16 tolerance (0.1), an acceptance length, refreshes
#             each checked in the engine (draft_check_excess <= 1)
#   pushes    3 passed, then 1 passed; measure: memory-plan "measured / plan" between 0.8 and 1.1; tests: "passed"
#             with no "failed"; trl-arms: two arms, each with logprob checks under 0.1
# Usage: bash benchmarks/gpu_first_run.sh PART [OUT]
#   python: $PYTHON if set, else .venv/bin/python (scripts/setup.sh), else the offline bundle's environment
#   (/tmp/site/env.sh, sourced here).
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS="install | pipeline | sweep-aa | verify | trl | trl-arms | pushes | measure | tests | pipe-b | what-if | sampling"
PART=${1:?$PARTS}
OUT=${2:-${OUT:-runs/gpu-first-run}}
CAP=${CAP:-570}
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
elif [[ -f /tmp/site/env.sh ]]; then . /tmp/site/env.sh; PY=python3
else echo "no python with vLLM: run scripts/setup.sh (.venv), install the offline bundle (/tmp/site/env.sh), or set PYTHON" >&2; exit 2
fi
WORK=/tmp/gpu-run
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
run() {  # run NAME CMD...: time it under the part's cap, keep stdout+stderr under OUT
  local name=$1; shift
  local t0=$SECONDS
  timeout "$CAP" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  printf '%s\t%ss\texit %s\n' "$name" $((SECONDS - t0)) "$rc" | tee -a "$OUT/parts.tsv"
}
pipeline() {  # pipeline ONLY-STAGES: benchmarks/gpu_pipeline.sh's stages, in $WORK/pipeline (later parts read it)
  ONLY="$1" PYTHON="$PY" run "pipeline-${1// /-}" bash benchmarks/gpu_pipeline.sh "$WORK/pipeline"
  cp "$WORK"/pipeline/*.out "$WORK"/pipeline/times.tsv "$OUT"/ 2>/dev/null
  tail -n 30 "$OUT/pipeline-${1// /-}.log"  # the numbers it must print (gpu_pipeline.sh's summary)
}
trl_arms() {  # trl_arms ARMS: on the pipeline's draft when it ran on this machine, else the tiny policy and draft
  local on=(--tiny) name="trl-${1//,/-}"
  [[ -f "$WORK/pipeline/draft/config.json" ]] && on=(--draft "$WORK/pipeline/draft")
  run "$name" "$PY" benchmarks/trl_arms.py "${on[@]}" --steps 3 --arms "$1" --out "$WORK/$name"
  cp -r "$WORK/$name" "$OUT"/ 2>/dev/null
  tail -n 20 "$OUT/$name.log"  # the arms side by side
}
case $PART in
  install)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
    run install $PY -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); \
print('vllm', vllm.__version__); from spectool.engine.compat import support; s = support(); \
print('served build', s.version, 'cpu' if s.cpu_build else 'gpu', s.draft_reload, s.warning() or 'tested')"
    cat "$OUT/gpu.csv" "$OUT/install.log" ;;
  pipeline) pipeline "init-draft export rollout-t0 rollout-t1" ;;
  sweep-aa)
    run sweep-aa-collect "$PY" benchmarks/sweep_calibration.py collect --pool "$WORK/sweep-aa" --pattern plain \
      --batch-sizes 1,64 --min-seconds 5 --runs 40 --until "${UNTIL:-200}"
    run sweep-aa "$PY" benchmarks/sweep_calibration.py analyse --pool "$WORK/sweep-aa" --rounds 2,3 --arms 1
    cp "$WORK/sweep-aa/pool.jsonl" "$WORK/sweep-aa/calibration.json" "$OUT"/ 2>/dev/null
    cat "$OUT/sweep-aa.log" ;;
  verify) pipeline "verify-greedy" ;;
  trl) trl_arms online ;;
  trl-arms) trl_arms plain,frozen ;;
  pushes)
    run pushes $PY -m pytest -q -p no:cacheprovider -rA tests/test_gpu.py -k cuda_graphs
    run mtp-push $PY -m pytest -q -p no:cacheprovider tests/test_mtp.py -k engine_drafts_with_mtp ;;
  measure)
    run memory-plan $PY benchmarks/memory_plan.py
    run bf16-tolerance $PY benchmarks/bf16_tolerance.py --prompts 32 --samples 4 --lrs 1e-6,3e-6,1e-5 ;;
  tests)
    run pytest-gpu $PY -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_compat.py \
      tests/test_engine_process.py tests/test_bf16_engine.py ;;
  pipe-b)
    pipeline "train-rl verify-probabilistic init-draft-quality draft-quality"
    cp "$WORK"/pipeline/rl/metrics.jsonl "$OUT"/ 2>/dev/null ;;
  what-if)  # two calls: the second resumes the sweep from its rows.jsonl, then the forecast runs; one round (the
    # forecast's fit needs the timings; a recommendation would need --repeats 3, three times the engine runs)
    run sweep $PY -m spectool.cli sweep-k --model qwen3-8b --dummy-weights --acceptance-length 3.32 --k 1,2,3 --repeats 1 \
      --batch-sizes 1,16,64,256 --lengths long-tail --max-tokens 1024 --out "$WORK/sweep-qwen3-8b"
    [[ -f "$WORK/sweep-qwen3-8b/sweep.json" ]] && run forecast $PY -m spectool.cli forecast --sweep "$WORK/sweep-qwen3-8b" \
      --acceptance-rates 0.89,0.79,0.64 --generation-share 0.66 --batch 512 --max-concurrency 256 --out "$WORK/forecast-qwen3-8b"
    cp -r "$WORK/sweep-qwen3-8b" "$WORK/forecast-qwen3-8b" "$OUT"/ 2>/dev/null ;;
  sampling)
    run draft-sampling env PYTHON="$PY" bash benchmarks/draft_sampling.sh "${DRAFT:?DRAFT=<draft folder>}" \
      "${HARVEST:?HARVEST=<harvest run>}" "$WORK/draft-sampling"
    cp -r "$WORK/draft-sampling" "$OUT"/ 2>/dev/null ;;
  *) echo "unknown part $PART: $PARTS" >&2; exit 2 ;;
esac
cat "$OUT/parts.tsv"
