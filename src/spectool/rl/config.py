"""train-rl's configuration: a YAML file (templates/rl.yaml) plus `--set a.b=value` overrides,
validated before anything starts; every error names the key to change."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from spectool.constants import DEFAULT_DATA
from spectool.errors import SpectoolError, check
from spectool.settings.data import PolicyData, Rendering
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups
from spectool.settings.refresh import RefreshSettings
from spectool.settings.speculation import Speculation, check_trainable
from spectool.settings.spelling import TYPE_WORDS, key
from spectool.settings.tracking import Tracking

BACKENDS = ("builtin", "trl")


@dataclass
class RolloutSection(Rendering):
    """rl.yaml's rollout section: how each step's rollouts are sampled, and how a prompt is rendered (the commands'
    Rendering group, settings/data.py)."""

    prompts_per_step: int = 16
    """Prompts per RL step."""
    group_size: int = 8
    """Samples per prompt (GRPO compares the samples within a group)."""
    max_tokens: int = 128
    """Most new tokens per sample (reasoning policies need their RL length, 4096-16384)."""
    temperature: float = 1.0
    """Sampling temperature."""
    mode: str = "sync"
    """sync (generate, then train) | async (the next step's rollouts generate while this one trains: one step off
    policy; backend builtin only)."""
    eval_every: int = 10
    """Held-out reward (greedy, eval split) every N steps; 0: never."""
    eval_prompts: int = 32
    """Held-out prompts per evaluation."""
    eval_samples: int = 1
    """1: greedy; n > 1: n samples per held-out prompt at the rollout temperature (their mean reward)."""


@dataclass
class SpeculationSection(Speculation):
    """rl.yaml's speculation section: what drafts the rollouts (the commands' Speculation group, settings/speculation.py:
    method, draft, k, sweep, draft_sampling)."""

    enabled: bool = True
    """false: plain decoding (the draft, if set, is not used)."""
    draft: str | None = None
    """A draft folder (init-draft or export output) of that family, or a hub id ORG/NAME of one (read from
    huggingface_hub's cache)."""


@dataclass
class PolicySection:
    """rl.yaml's policy section: the GRPO update."""

    lr: float = 1e-6
    """The policy's AdamW learning rate."""
    steps: int = 50
    """RL steps (a resumed run may run longer)."""
    eps_low: float = 0.2
    """The clipped ratio's lower margin (1 - eps_low)."""
    eps_high: float = 0.2
    """The clipped ratio's upper margin (1 + eps_high)."""
    kl_beta: float = 0.0
    """The KL penalty's coefficient against the reference policy (0: none)."""
    scale_adv_by_std: bool = True
    """Advantages divided by their group's standard deviation."""
    logprob_check_every: int = 5
    """Every N steps, the engine's logprobs of the sampled tokens are held against the trainer's (the run stops past
    logprob_tolerance)."""
    logprob_tolerance: float = 0.0
    """Mean |engine - trainer| logprob that stops the run; 0: by the engine's dtype (precision.py)."""
    micro_batch_size: int = 8
    """Sequences per training forward (gradients accumulated over the step)."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""


@dataclass
class EngineSection(EngineSettings, EngineShare):
    """rl.yaml's engine section: the engine groups every entry point takes (settings/engine.py), with the colocated
    trainer's share of the GPU left to it."""

    gpu_memory_utilization: float = 0.5
    """GPU only: the engine's share of GPU memory (weights + KV cache); the rest is the colocated trainer's."""
    kv_cache_gib: float = 2.0
    """CPU build only: the engine's KV cache (GiB)."""


@dataclass
class RLConfig(PolicyData, Tracking):
    """train-rl's settings: rl.yaml (templates/rl.yaml) and its --set overrides. The policy and its data, and the
    trackers, are the commands' groups (settings/data.py, settings/tracking.py), at the top level."""

    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | hub:ORG/NAME[:split=S,config=C] | file.jsonl/.parquet: prompts with answers (the
    rewards need them: the commands' `chat`, general prompts without answers, is refused here)."""
    out: str = "runs/rl"
    """The run directory (a killed run resumes there)."""
    seed: int = 0
    """Sampling, data and draft seed."""
    backend: str = "builtin"
    """builtin (one process) | trl (TRL's GRPOTrainer: accelerate/DeepSpeed/FSDP, LoRA)."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """How each step's rollouts are sampled."""
    speculation: SpeculationSection = field(default_factory=SpeculationSection)
    """What drafts the rollouts."""
    policy: PolicySection = field(default_factory=PolicySection)
    """The GRPO update."""
    draft_refresh: RefreshSettings = field(default_factory=RefreshSettings)
    """How and when the draft trains online (the refresher's own settings, one shape: settings/refresh.py)."""
    engine: EngineSection = field(default_factory=EngineSection)
    """The rollout engine (settings/engine.py, the commands' engine settings)."""
    checkpoint_every: int = 10
    """Policy, draft and optimizer state every N steps (the resume point)."""
    def validate(self) -> None:
        r, s, p, d, e = self.rollout, self.speculation, self.policy, self.draft_refresh, self.engine
        validate_groups(self, key(""))
        validate_groups(r, key("rollout."))
        validate_groups(s, key("speculation."))
        validate_groups(e, key("engine."))
        check(d.mode != "off", "draft_refresh.mode", d.mode,
              "must be frozen, online or auto; speculation is switched off by speculation.enabled: false")
        d.validate(key("draft_refresh."))
        check(r.prompts_per_step >= 1, "rollout.prompts_per_step", r.prompts_per_step, "must be >= 1")
        check(r.group_size >= 2, "rollout.group_size", r.group_size, "must be >= 2 (GRPO compares samples within a group)")
        check(r.max_tokens >= 1, "rollout.max_tokens", r.max_tokens, "must be >= 1")
        check(0 < r.temperature <= 10, "rollout.temperature", r.temperature, "must be in (0, 10]")
        check(r.mode in ("sync", "async"), "rollout.mode", r.mode, "must be sync or async")
        check(r.eval_every >= 0 and r.eval_prompts >= 1, "rollout.eval_every/eval_prompts", (r.eval_every, r.eval_prompts),
              "must be eval_every >= 0 and eval_prompts >= 1")
        check(r.eval_samples >= 1, "rollout.eval_samples", r.eval_samples, "must be >= 1 (1 = greedy)")
        check_trainable(s.method, key("speculation."))
        check(not s.enabled or s.draft is not None or s.k == "auto" or s.method == "mtp", "speculation.draft", s.draft,
              "must be a draft folder (init-draft / export) while speculation.enabled is true; set speculation.enabled: "
              "false for plain decoding")
        check(0 < p.lr < 1, "policy.lr", p.lr, "must be in (0, 1)")
        check(p.steps >= 1, "policy.steps", p.steps, "must be >= 1")
        check(0 <= p.eps_low < 1 and p.eps_high >= 0, "policy.eps_low/eps_high", (p.eps_low, p.eps_high),
              "must be eps_low in [0, 1), eps_high >= 0")
        check(p.kl_beta >= 0, "policy.kl_beta", p.kl_beta, "must be >= 0")
        check(p.logprob_check_every >= 1, "policy.logprob_check_every", p.logprob_check_every, "must be >= 1")
        check(p.logprob_tolerance >= 0, "policy.logprob_tolerance", p.logprob_tolerance, "must be >= 0 (0: by engine dtype)")
        check(p.micro_batch_size >= 1, "policy.micro_batch_size", p.micro_batch_size, "must be >= 1")
        check(p.max_grad_norm > 0, "policy.max_grad_norm", p.max_grad_norm, "must be > 0")
        check(d.ttt_steps == 0 or d.ttt_steps >= (s.k if isinstance(s.k, int) else 1), "draft_refresh.ttt_steps",
              d.ttt_steps, "must be >= speculation.k (every draft position the engine uses is trained), or 0: the draft's own")
        check(e.kv_cache_gib > 0, "engine.kv_cache_gib", e.kv_cache_gib, "must be > 0")
        check(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every, "must be >= 1")
        check(self.backend in BACKENDS, "backend", self.backend, f"must be {' | '.join(BACKENDS)}")
        check(self.backend != "trl" or r.mode == "sync", "rollout.mode", r.mode,
              "must be sync with backend trl (TRL generates, then trains; its async mode is TRL's own)")

    def as_dict(self) -> dict:
        return asdict(self)


def to_yaml(cfg: RLConfig) -> str:
    import yaml  # noqa: PLC0415 (heavy, loaded only on this path)

    return yaml.safe_dump(cfg.as_dict(), sort_keys=False)


def _build(cls, data: dict, prefix: str):
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SpectoolError(f"unknown config key {prefix + unknown[0]} (known in {prefix or 'top level'}: "
                            f"{', '.join(sorted(known))})")
    kwargs = {}
    for name, value in data.items():
        default = known[name].default_factory() if callable(known[name].default_factory) else known[name].default
        if is_dataclass(default):
            if not isinstance(value, dict):
                raise SpectoolError(f"config key {prefix + name} must be a section (a mapping), not {value!r}")
            kwargs[name] = _build(type(default), value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, default, prefix + name)
    return cls(**kwargs)


def _coerce(value: Any, default: Any, key: str) -> Any:
    """Type-check a leaf against its default (int/float/bool/str; None defaults take str or null)."""
    if value is None or default is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise SpectoolError(f"{key}={value!r}: must be {TYPE_WORDS[bool]}")
        return value
    if isinstance(default, int) and not isinstance(value, bool) and isinstance(value, int):
        return value
    if isinstance(default, float) and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            return float(value)  # YAML 1.1 reads 2e-6 (no dot) as a string
        except ValueError:
            pass
    if isinstance(default, str) and isinstance(value, bool):
        return "on" if value else "off"  # YAML 1.1 reads off/on as booleans
    if isinstance(default, str) and isinstance(value, str):
        return value
    if key == "speculation.k" and value == "auto":
        return value
    raise SpectoolError(f"{key}={value!r}: must be {TYPE_WORDS[type(default)]}"
                        + (" or 'auto'" if key == "speculation.k" else ""))


def _set(tree: dict, assignment: str) -> None:
    import yaml  # noqa: PLC0415 (heavy, loaded only on this path)

    if "=" not in assignment:
        raise SpectoolError(f"--set {assignment!r} must look like section.key=value")
    path, raw = assignment.split("=", 1)
    node = tree
    parts = path.strip().split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise SpectoolError(f"--set {assignment!r}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


def load_config(path: str | None, overrides: list[str] = ()) -> RLConfig:
    """The validated config: template defaults <- YAML file <- --set overrides."""
    import yaml  # noqa: PLC0415 (heavy, loaded only on this path)

    tree: dict = {}
    if path:
        p = Path(path)
        if not p.exists():
            raise SpectoolError(f"--config {path} does not exist (start from templates/rl.yaml)")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise SpectoolError(f"--config {path} is not valid YAML: {e}") from None
        if not isinstance(tree, dict):
            raise SpectoolError(f"--config {path} must be a mapping of keys to values")
    tree = copy.deepcopy(tree)
    for a in overrides:
        _set(tree, a)
    engine = tree.get("engine")
    if isinstance(engine, dict) and engine.get("max_model_len") == 0:  # rl.yaml's old spelling of derived: null now
        engine["max_model_len"] = None
    cfg = _build(RLConfig, tree, "")
    cfg.validate()
    return cfg


# a resumed run may run longer, log elsewhere, or cut the draft's steps into other micro-batches (the same gradient
# while a step fits in one; split, within 1-2%: ttt.micro_batches), or give another context (one shorter than the
# run needs is refused, so completions are never cut: an older run's 0 for derived is null now)
RESUMABLE_KEYS_IGNORED = {"policy.steps", "out", "report_to", "draft_refresh.max_batch_tokens", "engine.max_model_len"}
