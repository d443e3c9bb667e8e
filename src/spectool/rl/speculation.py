"""What train-rl's `speculation` and `draft_refresh` settings resolve to, for either backend
(the built-in trainer and TRL's GRPOTrainer): the draft folder (a sweep's own when k is auto),
checked against the policy, the k schedule, and the refresher's settings. The user's config is
left as given."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from spectool.draft.checkpoint import draft_folder
from spectool.draft.guard import Flags, check_speculation
from spectool.engine.proposals import describe
from spectool.engine.proposals import resolve as resolve_proposals
from spectool.rl.config import RLConfig
from spectool.schedule import read_schedule, schedule_method

log = logging.getLogger(__name__)


@dataclass
class Speculation:
    schedule: list[tuple[int, int, int]] | None  # k per batch size (k: auto), else None
    draft_path: str | None  # the draft folder as configured or named by the sweep, checked against the policy
    k: int  # the largest k the engine uses (0: plain decoding)
    method: str = "eagle3"  # a drafter family; "mtp": the policy's own MTP layers (draft_path: its folder)
    proposals: str = "greedy"  # how the drafter proposes (engine/proposals.py: speculation.draft_sampling resolved)
    draft_sampling: str = "auto"  # the setting as the user gave it (auto stays auto: what the TRL backend passes on)


def resolve(cfg: RLConfig, model) -> Speculation:
    """`model`: the resolved policy (models.ModelRef); a draft for another policy, or trained for
    fewer positions than k, is refused, naming the setting."""

    s = cfg.speculation
    if not s.enabled:
        return Speculation(None, None, 0)
    proposals = resolve_proposals(s.draft_sampling)[0]
    log.info(f"train-rl: {describe(s.draft_sampling)}")
    if s.method == "mtp":
        note = check_speculation(model, "mtp", None, s.k, RL_FLAGS).note  # refreshing them: DraftRefresher.from_mtp
        if note:
            log.info(f"train-rl: {note}")
        return Speculation(None, model.path, s.k, "mtp", proposals, s.draft_sampling)
    schedule, folder, method = None, s.draft, s.method
    if folder is not None:  # a folder, or a hub id resolved through huggingface_hub's cache
        folder = str(draft_folder(folder, "speculation.draft"))
    if s.k == "auto":
        schedule, folder = read_schedule(s.sweep, folder, proposals, flag="speculation.")  # the resolved folder
        method = schedule_method(s.sweep)  # the family the sweep chose (its draft folder's)
    k = max(k for _, _, k in schedule) if schedule else s.k
    return Speculation(schedule, check_speculation(model, method, folder, k, RL_FLAGS).draft, k, method, proposals,
                       s.draft_sampling)


RL_FLAGS = Flags(draft="speculation.draft", k="speculation.k", method="speculation.method:")
