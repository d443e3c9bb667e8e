"""init-draft's settings: the groups it takes (settings/), what it alone sets, and its named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spectool.constants import DEFAULT_DATA
from spectool.errors import check
from spectool.settings.data import PolicyData, Rendering
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups
from spectool.settings.sampling import SamplingConfig
from spectool.settings.speculation import check_trainable
from spectool.settings.tracking import Tracking
from spectool.settings.training import DraftTraining, Features


@dataclass(kw_only=True)
class InitDraftConfig(PolicyData, Rendering, DraftTraining, Features, Tracking, EngineSettings, EngineShare):
    out: str = ""
    """Draft folder to create (or resume with the same settings)."""
    data: str = DEFAULT_DATA
    """A harvest run directory, or a data source to harvest first."""
    system_prompt: str | None = None
    """When --data is a data source: a system turn put first in every prompt of its harvest, as the RL run's prompts
    have it (refused with data whose prompts have a system turn of their own). A harvest run keeps its own."""
    method: str = "eagle3"
    """eagle3: a new EAGLE-3 draft (a chain) | peagle: P-EAGLE, all k positions in one forward | dflash: a DFlash
    block drafter (one forward, the policy's hidden states as context) | mtp: fine-tune the model's own MTP layers
    (trunk frozen; --out is then a model folder, the policy with its new MTP tensors). For peagle and dflash
    --ttt-steps is the trained block size: the largest k the draft serves."""
    init_from: str | None = None
    """Warm-start from a draft of the same family (EAGLE-3, P-EAGLE or DFlash): a spectool or vLLM draft folder, a
    speculators-format EAGLE-3 folder, or a hub id ORG/NAME of one (read from huggingface_hub's cache)."""
    remap_vocab: bool = False
    """With --init-from: rebuild the draft vocabulary from this data (--draft-vocab-size); shared rows kept.
    Default: keep the warm start's map."""
    seed: int = 0
    """Seed."""
    harvest: SamplingConfig = field(default_factory=lambda: SamplingConfig(n_prompts=256, samples=4, max_tokens=128))
    """How the policy is sampled when --data is a data source."""
    dtype: str = "auto"
    """The policy's precision, in the harvest's engine and in the forward that computes the draft's features: auto
    (float32 on the CPU build; on a GPU bfloat16, and below compute capability 8.0 a float16 engine with float32
    features) | float32 | bfloat16 | float16 (float32 features). --method mtp computes its features in float32."""
    preset: str | None = None
    """Named settings (see `spectool init-draft --help`); a flag given on the command line overrides them."""

    def validate(self) -> None:
        validate_groups(self)
        check(bool(self.out), "--out", self.out, "must name the draft folder")
        check(self.preset is None or self.preset in INIT_DRAFT_PRESETS, "--preset", self.preset,
              f"must be one of {', '.join(INIT_DRAFT_PRESETS)}")
        check_trainable(self.method)
        check(self.method != "mtp" or self.init_from is None, "--init-from", self.init_from,
              "is refused with --method mtp: training starts from the model's own MTP layers")
        check(not self.remap_vocab or self.init_from is not None, "--remap-vocab", self.remap_vocab,
              "needs --init-from (a fresh draft always builds its vocabulary from the data)")
        self.harvest.validate()


# init-draft's named settings: field -> value ("harvest.<field>" for the sampling of --data). The
# quality preset: the best draft 2 CPU cores train in under an hour on the embedded default (measured
# in docs/results.md): the in-domain task mixed with a wider one, 8 samples per prompt, and many small
# steps (the demo draft was short of steps, not of data: its train and held-out metrics were equal).
INIT_DRAFT_PRESETS: dict[str, dict[str, object]] = {
    "quality": {
        "data": f"{DEFAULT_DATA}@3+gym:chain_sum:min_terms=2,max_terms=3,min_digits=1,max_digits=2@1",
        "harvest.n_prompts": 256, "harvest.samples": 8, "harvest.max_tokens": 128,
        "epochs": 4,
    },
}


def apply_preset(cfg: InitDraftConfig, given: set[str]) -> InitDraftConfig:
    """`cfg` with its preset's values for every setting not in `given` (the fields set on the
    command line, nested ones as "harvest.<field>"); a new object, `cfg` is not changed."""
    if cfg.preset is None:
        return cfg
    cfg.validate()  # names a bad --preset before it is looked up
    values = {k: v for k, v in INIT_DRAFT_PRESETS[cfg.preset].items() if k not in given}
    top = {k: v for k, v in values.items() if "." not in k}
    sampling = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("harvest.")}
    return dataclasses.replace(cfg, **top, harvest=dataclasses.replace(cfg.harvest, **sampling))
