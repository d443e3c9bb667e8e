"""Pre-flight checks of a draft against the policy and the run: what vLLM would load without a word and
then serve badly (acceptance collapse, verification still paid). Each check names the field and the fix.

- Aux layer ids: vLLM collects a policy layer's output by id (0: the embeddings, L: the last layer's
  output; DFlash's `target_layer_ids` count from the first layer's output, so they are aux ids - 1);
  an id past the policy's layers is never collected.
- Vocabulary map: vLLM maps a draft token d to policy token d + d2t[d]; a map that lands outside
  the policy's vocabulary proposes tokens that can never be accepted, and a reduced vocabulary whose weights hold
  no map is served with vLLM's own zeros (draft token d read as policy token d: other tokens than the draft meant).
The position range (a draft's and a model's, and the run that passes it) is positions.py's; the method
against the folder's architecture is families.py's (check_folder_family).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from spectool.errors import SpectoolError


def check_aux_ids(config: dict, family: str, num_layers: int, where: str) -> None:
    """A draft config's aux layer ids against the policy's layer count, in the field the config spells."""
    if family == "dflash":
        field = "dflash_config.target_layer_ids"
        ids = (config.get("dflash_config") or {}).get("target_layer_ids") or []
        lo, hi, note = -1, num_layers - 1, "layer outputs, aux ids - 1: -1 is the embeddings, L-1 the last layer's"
    else:
        field = "eagle_aux_hidden_state_layer_ids"
        ids = config.get(field) or (config.get("eagle_config") or {}).get(field) or []
        lo, hi, note = 0, num_layers, "0: the embeddings, L: the last layer's output"
    bad = [i for i in ids if not lo <= int(i) <= hi]
    if bad:
        raise SpectoolError(f"{where}: {field} {list(ids)} has {bad} outside [{lo}, {hi}] for a policy of {num_layers} "
                            f"layers ({note}); the draft was made for another policy or with an off-by-one convention: "
                            "re-export it for this policy")
    if list(ids) != sorted(set(ids)):
        raise SpectoolError(f"{where}: {field} {list(ids)} must be distinct and increasing (vLLM concatenates the "
                            "layers in that order)")


def check_vocab_map(d2t: torch.Tensor, vocab_size: int, where: str) -> None:
    """d2t [D]: draft token d is policy token d + d2t[d], which must lie in [0, vocab_size)."""
    target = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.reshape(-1).to(torch.int64)
    bad = ((target < 0) | (target >= vocab_size)).nonzero().reshape(-1)
    if bad.numel():
        d = int(bad[0])
        raise SpectoolError(f"{where}: the vocabulary map d2t sends {bad.numel()} draft tokens outside the policy's "
                            f"vocabulary [0, {vocab_size}) (e.g. draft token {d} -> {int(target[d])}): those proposals "
                            "can never be accepted; the draft was made for another tokenizer, re-export it for this policy")


def check_map_present(draft_vocab: int, vocab_size: int, has_map: bool, where: str) -> None:
    """A draft vocabulary smaller than the policy's (`draft_vocab` < `vocab_size`) needs its map d2t in the weights:
    vLLM 0.32 (model_executor/models/llama_eagle3.py) starts the map at zeros and keeps them when the weights hold
    none, so draft token d is proposed as policy token d, which is not the token the draft meant: acceptance drops
    without a word while every verify step is paid."""
    if draft_vocab < vocab_size and not has_map:
        raise SpectoolError(
            f"{where}: the draft's vocabulary is {draft_vocab} of the policy's {vocab_size} but its weights hold no d2t "
            f"map: vLLM would read draft token d as policy token d (its map left at zeros) and propose other tokens than "
            f"the draft means, at lower acceptance, without a word. Add the map its converter left out (d2t [{draft_vocab}]"
            ", int64: the policy id of draft token d, minus d) to its safetensors, or use the folder the draft was "
            "trained or exported in")


def check_folder(folder: Path, family: str | None, num_layers: int, vocab_size: int) -> None:
    """A draft folder's aux layer ids and vocabulary map against the policy (config.json; the weights, every
    *.safetensors file as vLLM loads them: none, a config-only what-if folder, is not read)."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg = json.loads((folder / "config.json").read_text())
    if family in ("eagle3", "peagle", "dflash"):
        check_aux_ids(cfg, family, num_layers, f"{folder}/config.json")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return
    d2t = None
    for weights in files:
        try:
            with safe_open(str(weights), "pt") as f:
                d2t = f.get_tensor("d2t") if "d2t" in f.keys() else d2t
        except Exception as e:  # noqa: BLE001 - safetensors' own error type; a cut-short or foreign file
            raise SpectoolError(f"{weights} is not a readable safetensors file ({e}): it was cut short or is not a "
                                "draft's; re-run init-draft (or copy the folder again)") from None
    where = str(files[0] if len(files) == 1 else folder)
    check_map_present(int(cfg.get("draft_vocab_size") or vocab_size), vocab_size, d2t is not None, where)
    if d2t is not None:
        check_vocab_map(d2t, vocab_size, where)
