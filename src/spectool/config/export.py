"""export's settings: the draft folder to write, for which framework, and its check on the engine."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spectool.constants import DEFAULT_K, check_k
from spectool.errors import check
from spectool.settings.data import Rendering
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups


@dataclass(kw_only=True)
class ExportConfig(Rendering, EngineSettings, EngineShare):
    draft: str = ""
    """Draft folder from init-draft."""
    out: str = ""
    """Destination folder (replaced only after verification)."""
    format: str = "vllm"
    """vllm (the folder as vLLM loads it: every family) | speculators (EAGLE-3 drafts only)."""
    model: str | None = None
    """Policy (default: the one the draft was trained for)."""
    base_model: str | None = None
    """The policy's hub id (ORG/NAME) the model card and the speculators config name (default: --model's: a hub id as
    given, the embedded default's, a hub-cache folder's; a local folder elsewhere by its own name)."""
    system_prompt: str | None = None
    """The system turn of the verification prompts (default: the draft's harvest's, from its manifest)."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template of the verification prompts, a JSON object (TRL's
    chat_template_kwargs; default: the draft's harvest's)."""
    target: str = "vllm"
    """The framework to load it: vllm | nemo-rl | verl | trl-serve (skyrl is refused, with why); writes its config snippet."""
    k: int = DEFAULT_K
    """Default k recorded (speculators) and used for verification."""
    verify: bool = True
    """Load into vLLM and check acceptance before moving into place."""
    min_acceptance_length: float = 1.2
    """Refuse below this mean acceptance length."""
    push_to_hub: str | None = None
    """A hub model repo (ORG/NAME) to upload the export to with huggingface_hub, once verified and in place (created if
    missing; the token: `hf auth login` or HF_TOKEN)."""

    def validate(self) -> None:
        validate_groups(self)
        check(bool(self.draft) and bool(self.out), "--draft/--out", (self.draft, self.out), "must both be given")
        check(self.push_to_hub is None or re.fullmatch(r"[\w.-]+/[\w.-]+", self.push_to_hub) is not None,
              "--push-to-hub", self.push_to_hub, "must be a hub repo id, ORG/NAME")
        check(self.base_model is None or re.fullmatch(r"[\w.-]+/[\w.-]+", self.base_model) is not None,
              "--base-model", self.base_model, "must be a hub repo id, ORG/NAME")
        check(self.push_to_hub is None or self.verify, "--push-to-hub", self.push_to_hub,
              "uploads a verified export only: drop --no-verify")
        check(self.format in ("vllm", "speculators"), "--format", self.format, "must be 'vllm' or 'speculators'")
        check(self.target in ("vllm", "nemo-rl", "verl", "skyrl", "trl-serve"), "--for", self.target,
              "must be vllm, nemo-rl, verl, skyrl or trl-serve")
        check_k(self.k, "--k")
