"""What each RL framework needs to load a spectool draft, as a ready config snippet
(`spectool export --for ...`), and what it then does with the draft.

Checked against the frameworks' sources (../shared/reviews/rl-frameworks.md has the file:line facts):
- NeMo RL @7ea279a: `policy.generation.vllm_kwargs` is spread into `vllm.LLM(**)`
  (nemo_rl/models/generation/vllm/vllm_worker.py:374, 570-597); `policy.draft.{enabled, model_name,
  loss_weight}` (nemo_rl/models/policy/__init__.py:490-503) trains NeMo's own Megatron copy, always
  capturing vLLM's default aux layers (2, N/2, N-3) (megatron/train.py:281).
- verl 0.9.1: `actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config`
  (verl/trainer/config/rollout/rollout.yaml:139-142, read at vllm_async_server.py:287); rollouts load
  with `load_format: dummy` by default (rollout.yaml:100), so the draft needs its own load format.
- SkyRL 0.3.0: accepts `generator.inference_engine.speculative_config` but calls
  `drafter.model.load_weights(<policy tensors>)` after every weight sync
  (new_inference_worker_wrap.py:120, 169), which an EAGLE-3 drafter refuses on vLLM 0.32.
- TRL 1.16 server mode: `trl vllm-serve --speculative_config JSON` (trl/scripts/vllm_serve.py:263-264).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from spectool.errors import SpectoolError
from spectool.families import family as drafter_family

TARGETS = ("vllm", "nemo-rl", "verl", "skyrl", "trl-serve")


@dataclass
class Snippet:
    filename: str  # written into the export folder
    text: str
    note: str  # what the framework then does with the draft


def check_target(target: str, aux_layer_ids: list[int], num_layers: int, family: str = "eagle3") -> None:
    """Refuse, before anything is written, a target that cannot run this draft."""
    if target not in TARGETS:
        raise SpectoolError(f"--for {target!r}: one of {', '.join(TARGETS)}")
    if family != "eagle3" and target in ("nemo-rl", "skyrl"):
        raise SpectoolError(
            f"--for {target}: a {family} draft. NeMo RL's policy.draft trains an EAGLE-3 Megatron copy of the draft "
            "(megatron/train.py), and its DFlash/DSpark co-training (Automodel) starts from a hub model_name, not a "
            "spectool folder; SkyRL reloads the policy's weights into any drafter after each sync. Neither is "
            "checked to serve this family: use --for vllm, verl or trl-serve (they pass speculative_config to vLLM "
            "as is, and vLLM serves it: export's own load proves it)")
    if target == "skyrl":
        raise SpectoolError(
            "--for skyrl: SkyRL (0.3.0 and main) loads the policy's weights into the drafter after every weight sync "
            "(new_inference_worker_wrap.py: _reload_spec_decode_drafter), which an EAGLE-3 drafter refuses on vLLM "
            "0.32 (ValueError: no module or parameter named 'model'): the run would stop at its first sync. SkyRL "
            "supports its own MTP heads only; use --for verl, nemo-rl or trl-serve")
    want = vllm_default_aux_ids(num_layers)
    if target == "nemo-rl" and list(aux_layer_ids) != want:
        raise SpectoolError(
            f"--for nemo-rl: the draft reads aux layers {list(aux_layer_ids)}, but NeMo RL always feeds its draft "
            f"vLLM's default layers {want} (megatron/train.py builds the capture without the checkpoint's ids): "
            "its online training would learn from other layers than the draft was made for. Retrain the draft "
            "with the default aux layers (init-draft does for policies of 6+ layers), or export --for vllm and "
            "use it frozen")


def vllm_default_aux_ids(num_layers: int) -> list[int]:
    """vLLM's (and NeMo RL's) default EAGLE-3 aux layers: inputs of layers 2, N/2, N-3."""
    return [2, num_layers // 2, num_layers - 3]


def snippet(target: str, draft_path: str, k: int, policy: str, family: str = "eagle3") -> Snippet:
    spec = {**drafter_family(family).speculative_entries(draft_path), "num_speculative_tokens": k}
    if target == "vllm":
        return Snippet("vllm.json", json.dumps({"speculative_config": spec}, indent=2) + "\n",
                       "vLLM: pass speculative_config to LLM(...) or `vllm serve --speculative-config`; frozen.")
    if target == "nemo-rl":
        return Snippet("nemo-rl.yaml", _yaml({"policy": {
            "generation": {"vllm_kwargs": {"speculative_config": spec}},
            "draft": {"enabled": True, "model_name": draft_path, "loss_weight": 1.0}}}) + (
            "# Frozen draft instead: drop policy.draft (NeMo then loads the draft with load_format auto).\n"
            "# policy.draft needs megatron_cfg.enabled: true, dtensor_cfg.enabled: false, sequence_packing off.\n"),
            "NeMo RL: with policy.draft it trains its own Megatron copy of this draft, initialised from it, on the "
            "first draft position only (joint loss); without it the draft stays frozen.")
    if target == "verl":
        v = {**spec, "draft_load_config": {"load_format": "auto"}}
        return Snippet("verl.yaml", _yaml({"actor_rollout_ref": {"rollout": {"engine_kwargs": {"vllm": {
            "speculative_config": v}}}}}) + "# Avoid hybrid level-2 sleep: it drops the drafter's weights (vllm#52479).\n",
            "verl: frozen (verl refreshes only MTP drafters); draft_load_config loads the real draft even though verl's "
            "rollout loads the policy with dummy weights.")
    if target == "trl-serve":
        return Snippet("trl-serve.sh", f"trl vllm-serve --model {policy} --speculative_config '{json.dumps(spec)}'\n",
                       "TRL server mode: frozen (TRL's weight sync never reaches the drafter; it needs CUDA). For an "
                       "online-refreshed draft use colocate mode with spectool.integrations.trl.")
    raise SpectoolError(f"--for {target!r}: one of {', '.join(TARGETS)}")


def _yaml(tree: dict) -> str:
    import yaml  # noqa: PLC0415 (heavy, loaded only on this path)

    return yaml.safe_dump(tree, sort_keys=False)
