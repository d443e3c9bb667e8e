"""sweep-k's settings: which drafters, draft lengths and batch sizes are timed, and how long."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spectool.constants import DEFAULT_MODEL, MAX_NUM_SEQS, METHODS
from spectool.errors import SpectoolError, check
from spectool.settings.data import PolicyData, Rendering, Split
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups
from spectool.settings.speculation import DraftSampling
from spectool.settings.training import DEFAULT_TTT_STEPS


@dataclass(kw_only=True)
class SweepConfig(PolicyData, Rendering, Split, DraftSampling, EngineSettings, EngineShare):
    out: str = ""
    """Run directory (a killed sweep resumes there)."""
    draft: str | None = None
    """Draft folder (needed for eagle3 unless --dummy-weights)."""
    drafts: list[str] = field(default_factory=list)
    """Draft folders of several families, comma-separated (each folder's family is read from its config.json):
    one per family in --methods, e.g. --methods eagle3,peagle,dflash --drafts E,P,D."""
    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, 'smollm2-135m' (embedded); with --dummy-weights a config.json folder or a
    templates/models name."""
    ks: list[int] = field(default_factory=lambda: list(range(1, DEFAULT_TTT_STEPS + 1)))
    """Draft lengths to measure, comma-separated (init-draft trains 5 positions by default)."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 8, 32])
    """Concurrent sequences, comma-separated."""
    methods: list[str] = field(default_factory=lambda: ["eagle3"])
    """eagle3,peagle,dflash,ngram,draft_model,mtp (comma-separated; mtp: the model's own MTP layers)."""
    draft_model: str | None = None
    """For --methods draft_model: a smaller causal LM with the policy's tokenizer, or 'policy' (the policy drafts
    for itself: the greedy-drafting oracle); with --dummy-weights a config.json folder or a templates/models name
    of the policy's vocabulary (e.g. qwen3-0.6b for the Qwen3 shapes)."""
    max_tokens: int = 128
    """Max generated tokens per completion. The default suits the embedded demo's short answers; time a reasoning
    policy at its RL lengths (4096-16384), where the context each step attends over is longer."""
    temperature: float = 1.0
    """Sampling temperature."""
    min_seqs: int = 8
    """Sequences decoded per arm and batch size at least (in waves of the batch size, 4 waves at least)."""
    min_seconds: float = 5.0
    """Timed decoding per engine run and batch size at least (more waves over the same prompts). The noise between
    engine runs is the larger part, so time goes to rounds (--repeats) rather than to longer runs."""
    min_gain: float = 0.03
    """Recommend speculation only where its speedup's lower bound (95%, every arm at that batch size counted) is
    above 1 + this."""
    repeats: int = 3
    """Rounds: each runs plain decoding and every arm in a fresh engine (the noise between engine runs is most of the
    noise); 1 measures no noise between runs and recommends nothing."""
    seed: int = 0
    """Sampling and data seed."""
    dummy_weights: bool = False
    """What-if: --model is a config.json folder or a templates/models name; random weights, dummy draft."""
    acceptance_rates: list[float] | None = None
    """Synthetic acceptance per position (unconditional, non-increasing), e.g. 0.8,0.6,0.45."""
    acceptance_length: float | None = None
    """Synthetic mean acceptance length at the largest --k (instead of --acceptance-rates): one conditional
    rate c for every position, so position j is accepted with c^j at every k."""
    lengths: str | None = None
    """Output lengths fixed | long-tail | a harvest run's, EOS ignored, so every arm decodes the same tokens (fair
    timing at T>0). Default: fixed with --dummy-weights, else the policy's own (EOS ends a completion). The lengths
    are capped at --max-tokens, whose default (128) is the demo's: at reasoning lengths pass the RL run's (4096-16384)
    or a harvest run of it, since acceptance and a verify step's cost both change deep into a long response."""
    prompt_len: int = 128
    """With --dummy-weights: prompt tokens (random ids). The default is a short gym prompt; a chat-templated
    reasoning prompt (a system turn, the template's tokens) is several hundred: pass the RL run's longest."""

    def validate(self) -> None:
        validate_groups(self)
        check(bool(self.out), "--out", self.out, "must name the run directory")
        self._validate_synthetic()
        check(len(self.ks) > 0 and all(k >= 1 for k in self.ks), "--k", self.ks, "must be a list of integers >= 1")
        check(len(self.batch_sizes) > 0 and all(1 <= b <= MAX_NUM_SEQS for b in self.batch_sizes), "--batch-sizes",
              self.batch_sizes, f"must be a non-empty list of integers in [1, {MAX_NUM_SEQS}] (the most sequences "
              "spectool lets vLLM decode at once; a larger batch would be measured as queued waves of it)")
        check(len(self.methods) > 0 and all(m in METHODS for m in self.methods), "--methods", self.methods,
              f"must be a list of {', '.join(METHODS)}")
        if "eagle3" in self.methods and self.draft is None and not self.drafts and not self.dummy_weights:
            raise SpectoolError("--draft is required for method eagle3 (or use --methods ngram)")
        folder_methods = [m for m in self.methods if m in ("peagle", "dflash", "dspark")]
        check(not folder_methods or bool(self.drafts or self.draft) or self.dummy_weights, "--drafts", self.drafts,
              f"must name the draft folders of {', '.join(folder_methods)} (one per family)")
        check(("draft_model" in self.methods) == (self.draft_model is not None), "--draft-model", self.draft_model,
              "goes with --methods draft_model, and that method needs it")
        check(1 <= self.max_tokens <= 32768, "--max-tokens", self.max_tokens, "must be in [1, 32768]")
        check(0 <= self.temperature <= 10, "--temperature", self.temperature, "must be in [0, 10]")
        check(self.min_seqs >= 1, "--min-seqs", self.min_seqs, "must be >= 1")
        check(0 <= self.min_seconds <= 3600, "--min-seconds", self.min_seconds, "must be in [0, 3600]")
        check(0 <= self.min_gain < 1, "--min-gain", self.min_gain, "must be in [0, 1)")
        check(1 <= self.repeats <= 100, "--repeats", self.repeats, "must be in [1, 100]")

    def _validate_synthetic(self) -> None:
        r, a = self.acceptance_rates, self.acceptance_length
        check(r is None or a is None, "--acceptance-rates", r, "and --acceptance-length exclude each other; give one")
        if self.dummy_weights and r is None and a is None:
            raise SpectoolError("--dummy-weights needs --acceptance-length A or --acceptance-rates r1,r2,...: random "
                                "weights accept nothing meaningful, so acceptance is synthetic")
        if r is not None:
            check(len(r) >= max(self.ks) and all(0 <= x <= 1 for x in r) and all(x >= y for x, y in zip(r, r[1:])),
                  "--acceptance-rates", r, f"must be {max(self.ks)}+ non-increasing rates in [0, 1] (one per position "
                  "up to the largest --k)")
        if a is not None:
            check(1 <= a <= max(self.ks) + 1, "--acceptance-length", a, f"must be in [1, {max(self.ks) + 1}] (1 + the "
                  "largest --k)")
        if r is not None or a is not None:
            check(set(self.methods) <= {"eagle3", "peagle", "dflash", "dspark", "draft_model", "mtp"}, "--methods",
                  self.methods, "must be drafter families or draft_model with synthetic acceptance (ngram proposes "
                  "from the text itself)")
        check(self.prompt_len >= 1, "--prompt-len", self.prompt_len, "must be >= 1")
        if self.lengths is not None:
            check_lengths(self.lengths)


def check_lengths(value: str, flag: str = "--lengths") -> None:
    from spectool.costmodel import LENGTH_SHAPES  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    check(value in LENGTH_SHAPES or Path(value).is_dir(), flag, value,
          f"must be {' | '.join(LENGTH_SHAPES)} or a harvest run directory")
