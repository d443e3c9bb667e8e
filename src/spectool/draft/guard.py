"""The one pre-flight of a drafter, before anything is harvested, trained, written or started: every command,
train-rl's speculation and the TRL integration call `check_speculation`, which asks in turn

1. the family (families.py): known, and served by the installed build (dspark: GPU builds only);
2. the draft itself: a draft folder against the policy (draft/checkpoint.check_draft: family, fingerprint,
   shapes, aux layer ids, vocabulary map, positions trained for k), or the policy's own MTP layers
   (draft/mtp_folder.require_mtp, and what vLLM does with k beyond them);
3. the installed vLLM, whether it serves this family for this policy's architecture, and on which model
   runner (engine/serves.py).
The online refresher asks its share (`check_refreshable`: the folder against the policy's config, the
build's answer) when it is built from a folder.

A "no" names the setting as the caller's user spells it (`Flags`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spectool.draft.checkpoint import check_draft
from spectool.draft.mtp_folder import k_note, require_mtp
from spectool.draft.preflight import check_folder
from spectool.engine.compat import is_cpu_build
from spectool.engine.serves import check_serves
from spectool.families import check_served, family, folder_family


@dataclass(frozen=True)
class Flags:
    """The settings as the caller's user spells them, for the messages."""

    draft: str = "--draft"
    k: str = "--k"
    method: str = "--method"


CLI = Flags()


@dataclass(frozen=True)
class Checked:
    draft: str | None  # the draft folder, checked (None: the policy's MTP layers, or no folder yet)
    note: str | None  # what vLLM does with k beyond the MTP layers, for the caller to say
    runner: str  # the model runner the build will serve it with: "V1" | "V2" | "V1 or V2" (compat.runner)


def check_speculation(model, method: str, draft: str | None, k: int, flags: Flags = CLI) -> Checked:
    """`model`: the resolved policy (models.ModelRef); `method`: a drafter family; `draft`: its folder (None
    for mtp, or before init-draft has made one); `k`: the largest k the run uses."""
    family(method)
    check_served(method, is_cpu_build(), flags.method)
    note = None
    if method == "mtp":
        note = k_note(k, require_mtp(model.path, f"{flags.method} mtp"))
    if draft is not None:
        draft = check_draft(draft, model, max(k, 1), flag=flags.draft, k_flag=flags.k, method=method,
                            method_flag=flags.method)
    runner = check_serves(model.path, method, k, flags.method, flags.k)
    return Checked(draft, note, runner)


def check_refreshable(folder, config) -> None:
    """The refresher's share of the pre-flight (DraftRefresher.from_folder, whoever builds it): the folder's aux
    layer ids and vocabulary map against the policy's config (a transformers config), and whether the installed
    vLLM serves the folder's family for the policy's architecture (the engine the pushes go into)."""
    found = folder_family(folder) or "eagle3"
    check_folder(Path(folder), found, config.num_hidden_layers, config.vocab_size)
    check_serves(config.to_dict(), found, 1, "the draft's family")
