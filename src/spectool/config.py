"""Every command's settings: one typed dataclass each, a docstring per field; the command line is
generated from them (`cli.settings_command`: flag, type, default and help), and `validate()` names
the flag to change. train-rl's YAML settings are rl/config.py's."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from spectool import trackers
from spectool.constants import (  # noqa: F401
    CONTROLS,
    DEFAULT_DATA,
    DEFAULT_FEATURES,
    DEFAULT_K,
    DEFAULT_LOSS,
    DEFAULT_MODEL,
    DEFAULT_POSITION_WEIGHTS,
    DRAFT_DTYPES,
    DRAFT_SAMPLING,
    DRAFTERS,
    FEATURE_SOURCES,
    LOSSES,
    MAX_BATCH_TOKENS,
    MAX_NUM_SEQS,
    METHODS,
    POSITION_WEIGHTS,
    TRAINABLE,
    check_k,
)
from spectool.errors import SpectoolError, check  # noqa: F401
from spectool.prompts import check_rendering
from spectool.settings.engine import EngineSettings, EngineShare, validate_engine


@dataclass
class SamplingConfig:
    n_prompts: int = 64
    """Number of prompts drawn from the split."""
    samples: int = 1
    """Completions per prompt."""
    max_tokens: int = 128
    """Max generated tokens per completion. The default suits the embedded demo's short answers; reasoning policies
    (DAPO-style math and code) need 4096-16384, or their completions end at this cap (the run prints how many did)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    seed: int = 0
    """Sampling and data seed."""

    def validate(self) -> None:
        check(self.n_prompts >= 1, "--n-prompts", self.n_prompts, "must be >= 1")
        check(self.samples >= 1, "--samples", self.samples, "must be >= 1")
        check(1 <= self.max_tokens <= 32768, "--max-tokens", self.max_tokens, "must be in [1, 32768]")
        check(0.0 <= self.temperature <= 10.0, "--temperature", self.temperature, "must be in [0, 10]")
        check(0.0 < self.top_p <= 1.0, "--top-p", self.top_p, "must be in (0, 1]")
        check(self.seed >= 0, "--seed", self.seed, "must be >= 0")
        check(self.temperature > 0 or self.samples == 1, "--samples", self.samples,
              "must be 1 at --temperature 0 (greedy completions of one prompt are identical)")


def check_drafter(method: str, draft: str | None, flag: str = "--method", draft_flag: str = "--draft") -> None:
    """A draft-folder family needs a draft folder; mtp (the model's own MTP layers) takes none."""
    check(method in DRAFTERS, flag, method, f"must be one of {', '.join(DRAFTERS)}")
    check(method != "mtp" or draft is None, draft_flag, draft, f"is refused with {flag} mtp: the model's own MTP "
          "layers draft (its checkpoint holds them); drop it, or use an EAGLE-3 draft without mtp")


def check_draft_sampling(value: str, flag: str = "--draft-sampling") -> None:
    check(value in DRAFT_SAMPLING, flag, value, f"must be one of {', '.join(DRAFT_SAMPLING)}")


def check_lengths(value: str, flag: str = "--lengths") -> None:
    from spectool.costmodel import LENGTH_SHAPES  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    check(value in LENGTH_SHAPES or Path(value).is_dir(), flag, value,
          f"must be {' | '.join(LENGTH_SHAPES)} or a harvest run directory")


@dataclass
class InitDraftConfig(EngineSettings, EngineShare):
    out: str = ""
    """Draft folder to create (or resume with the same settings)."""
    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, or 'smollm2-135m' (embedded)."""
    data: str = DEFAULT_DATA
    """A harvest run directory, or a data source to harvest first."""
    system_prompt: str | None = None
    """When --data is a data source: a system turn put first in every prompt of its harvest, as the RL run's prompts
    have it (refused with data whose prompts have a system turn of their own). A harvest run keeps its own."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template, a JSON object (TRL's chat_template_kwargs), e.g.
    '{"enable_thinking": false}' for Qwen3."""
    prompt_col: str = "prompt"
    """When --data is a file or hub source: its prompt column (a text, or a conversation: a list of messages)."""
    answer_col: str = "answer"
    """When --data is a file or hub source: its answer column (a hub source's may be a nested field: a.b)."""
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
    draft_vocab_size: int = 4096
    """Draft vocabulary size (the most frequent tokens of the policy's responses)."""
    ttt_steps: int = 5
    """Unroll length: trains draft positions 1..N (use >= the largest k you run)."""
    draft_layers: int = 1
    """Decoder layers of the draft (vLLM's EAGLE-3 and DFlash loaders serve any number); each costs about one more
    draft forward per drafted token (init-draft prints the measured draft/policy cost)."""
    step_decay: float = 0.8
    """Loss weight of unroll position j is step_decay^j."""
    anchor_fraction: float | None = None
    """Share of the anchors (response positions a draft proposes from) each step trains, drawn afresh per step, as
    speculators trains DFlash and P-EAGLE (512 per 2,048 tokens = 0.25): a step costs about that share, so more
    passes fit the same time. Default: the family's, as measured (dflash 0.25; eagle3, peagle and mtp 1, every
    anchor: docs/drafters.md, "Sampled anchors")."""
    loss: str = DEFAULT_LOSS
    """Per-position loss against the policy's distribution: ce (soft cross-entropy) | tv (1 - sum min(p, q),
    the rejection probability of a sampling draft) | mix (ce + tv; measured best of the three, docs/results.md) |
    tv-heavy (0.1 ce + 0.9 tv, the field's T=1 recipe: docs/results.md, "The T=1 recipe")."""
    position_weights: str = DEFAULT_POSITION_WEIGHTS
    """How each unroll step's positions are weighted: decay (--step-decay^j, all alike) | rejection (each position
    by the probability a sampling draft is rejected there, Draft-OPD's error positions) | reach (by the
    probability verification reaches that step from its anchor, in place of --step-decay^j). Measured:
    docs/results.md, "The T=1 recipe: position weights"."""
    epochs: int = 2
    """Passes over the harvested records."""
    max_steps: int | None = None
    """Stop after this many steps if --epochs would run longer (a budget for data larger than a run can pass over;
    the learning-rate schedule spans the steps that run)."""
    features: str = DEFAULT_FEATURES
    """Where the policy's features come from: stream (bounded shards on disk, read a shard at a time: memory flat in
    the data's size) | online (the policy's forward per training batch: no disk, a policy forward per record per
    epoch) | cache (one file loaded whole into memory: grows with the data). All three train the same draft;
    measured: docs/drafters.md, "Features at scale"."""
    shard_tokens: int = 32768
    """Tokens per feature shard (stream) and per shuffle group (every --features): with --shuffle-window, what one
    window holds in memory (shard_tokens x window x the features' bytes per token)."""
    shuffle_window: int = 4
    """Shards whose records are shuffled together each epoch (the shards' own order is shuffled too)."""
    max_batch_tokens: int = MAX_BATCH_TOKENS
    """Most tokens per training forward: a step's records are packed into micro-batches within it (no padding; a
    longer record alone), gradients accumulated; a step's memory (the draft's logits over its vocabulary, its activations, its
    fused attention) is linear in it. The default suits the demo's 128-token records; at reasoning lengths set it to
    the longest record (e.g. 16384 for 16k-token records): the GPU memory plan names the largest that fits."""
    batch_size: int = 4
    """Records per step. Small: one epoch at batch 4 trained a better draft than at 8 or 16 on this machine
    (more steps for the same tokens; docs/results.md, "Draft quality")."""
    lr: float = 1e-3
    """AdamW learning rate (short runs on small harvests: higher than the 1e-4 of large-corpus recipes)."""
    draft_dtype: str = "auto"
    """The draft's training compute: auto (bfloat16 autocast on a GPU with bfloat16 units, compute capability 8.0+;
    float32 elsewhere, this CPU build's included) | float32 | bfloat16 (autocast: matmuls in bfloat16, the loss in
    float32). Its weights, gradients and AdamW moments stay float32 either way; the run's init_draft.json records the
    resolved value."""
    recompute_loss: bool = False
    """Recompute each unroll step's loss (softmax of the targets, log-softmax of the draft's logits) in the backward
    instead of keeping them: about 3 fewer [tokens x draft vocabulary] float32 copies a step, the same loss and
    gradients, more time. Measured on a tiny draft (one 8,192-token record, a 4,096-token vocabulary, this CPU): peak
    growth 2.0 -> 1.4 GiB, the step 1.5x slower (benchmarks/loss_recompute.py; docs/drafters.md)."""
    warmup_steps: int = 20
    """Linear warm-up steps, then cosine decay."""
    save_every: int = 50
    """Checkpoint + held-out eval every N steps."""
    report_to: str = "none"
    """Experiment trackers that get every metrics.jsonl line at its step, and these settings as the run's config,
    by TRL's report_to names: tensorboard (events in --out/tensorboard) | trackio (project spectool) | wandb |
    none, or a comma-separated list (pip install 'spectool[trackers]' for the first two; docs/rl.md,
    "Experiment trackers")."""
    eval_fraction: float = 0.05
    """Fraction of prompts held out (by hash of the prompt text)."""
    seed: int = 0
    """Seed."""
    harvest: SamplingConfig = field(default_factory=lambda: SamplingConfig(n_prompts=256, samples=4, max_tokens=128))
    """How the policy is sampled when --data is a data source."""
    dtype: str = "auto"
    """The policy's precision, in the harvest's engine and in the forward that computes the draft's features: auto
    (float32 on the CPU build; on a GPU bfloat16, and below compute capability 8.0 a float16 engine with float32
    features) | float32 | bfloat16 | float16 (float32 features). --method mtp computes its features in float32."""
    disk_budget_gb: float | None = None
    """Most disk (GiB) the policy features may take (--features stream or cache); init-draft refuses to start above
    it, and stream checks again before each shard it writes. Default: the free space where --out lives. A harvest's
    --hidden-states shards are reused and cost none; --features online takes none."""
    preset: str | None = None
    """Named settings (see `spectool init-draft --help`); a flag given on the command line overrides them."""

    def validate(self) -> None:
        validate_engine(self)
        check(bool(self.out), "--out", self.out, "must name the draft folder")
        check_rendering(self)
        check(self.preset is None or self.preset in INIT_DRAFT_PRESETS, "--preset", self.preset,
              f"must be one of {', '.join(INIT_DRAFT_PRESETS)}")
        check(1 <= self.draft_layers <= 4, "--draft-layers", self.draft_layers, "must be in [1, 4]")
        check(self.method in TRAINABLE, "--method", self.method, f"must be one of {', '.join(TRAINABLE)}"
              + (" (DSpark is trained by speculators on a GPU and served by GPU builds of vLLM)"
                 if self.method == "dspark" else ""))
        check(self.method != "mtp" or self.init_from is None, "--init-from", self.init_from,
              "is refused with --method mtp: training starts from the model's own MTP layers")
        check(self.disk_budget_gb is None or self.disk_budget_gb > 0, "--disk-budget-gb", self.disk_budget_gb,
              "must be > 0 (GiB)")
        check(self.ttt_steps >= 1, "--ttt-steps", self.ttt_steps, "must be >= 1 (use >= the largest k you run)")
        check(self.draft_vocab_size >= 2, "--draft-vocab-size", self.draft_vocab_size, "must be >= 2")
        check(not self.remap_vocab or self.init_from is not None, "--remap-vocab", self.remap_vocab,
              "needs --init-from (a fresh draft always builds its vocabulary from the data)")
        check(self.epochs >= 1, "--epochs", self.epochs, "must be >= 1")
        check(self.max_steps is None or self.max_steps >= 1, "--max-steps", self.max_steps, "must be >= 1")
        check(self.features in FEATURE_SOURCES, "--features", self.features,
              f"must be one of {', '.join(FEATURE_SOURCES)}")
        check(self.shard_tokens >= 1, "--shard-tokens", self.shard_tokens,
              "must be >= 1 (a record longer than a shard has one to itself)")
        check(self.shuffle_window >= 1, "--shuffle-window", self.shuffle_window, "must be >= 1")
        check(self.max_batch_tokens >= 64, "--max-batch-tokens", self.max_batch_tokens, "must be >= 64")
        check(self.batch_size >= 1, "--batch-size", self.batch_size, "must be >= 1")
        check(0 < self.lr < 1, "--lr", self.lr, "must be in (0, 1)")
        check(self.draft_dtype in DRAFT_DTYPES, "--draft-dtype", self.draft_dtype, f"must be one of {', '.join(DRAFT_DTYPES)}")
        check(0 < self.step_decay <= 1, "--step-decay", self.step_decay, "must be in (0, 1]")
        check(self.anchor_fraction is None or 0 < self.anchor_fraction <= 1, "--anchor-fraction", self.anchor_fraction,
              "must be in (0, 1] (1: every anchor)")
        check(self.loss in LOSSES, "--loss", self.loss, f"must be one of {', '.join(LOSSES)}")
        check(self.position_weights in POSITION_WEIGHTS, "--position-weights", self.position_weights,
              f"must be one of {', '.join(POSITION_WEIGHTS)}")
        check(0 < self.eval_fraction < 0.5, "--eval-fraction", self.eval_fraction, "must be in (0, 0.5)")
        trackers.parse(self.report_to, "--report-to")  # an unknown name or a missing package, before any work
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
    import dataclasses  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    if cfg.preset is None:
        return cfg
    cfg.validate()  # names a bad --preset before it is looked up
    values = {k: v for k, v in INIT_DRAFT_PRESETS[cfg.preset].items() if k not in given}
    top = {k: v for k, v in values.items() if "." not in k}
    sampling = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("harvest.")}
    return dataclasses.replace(cfg, **top, harvest=dataclasses.replace(cfg.harvest, **sampling))


@dataclass
class ExportConfig(EngineSettings, EngineShare):
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
        validate_engine(self)
        check(bool(self.draft) and bool(self.out), "--draft/--out", (self.draft, self.out), "must both be given")
        check(self.push_to_hub is None or re.fullmatch(r"[\w.-]+/[\w.-]+", self.push_to_hub) is not None,
              "--push-to-hub", self.push_to_hub, "must be a hub repo id, ORG/NAME")
        check(self.base_model is None or re.fullmatch(r"[\w.-]+/[\w.-]+", self.base_model) is not None,
              "--base-model", self.base_model, "must be a hub repo id, ORG/NAME")
        check(self.push_to_hub is None or self.verify, "--push-to-hub", self.push_to_hub,
              "uploads a verified export only: drop --no-verify")
        check_rendering(self)
        check(self.format in ("vllm", "speculators"), "--format", self.format, "must be 'vllm' or 'speculators'")
        check(self.target in ("vllm", "nemo-rl", "verl", "skyrl", "trl-serve"), "--for", self.target,
              "must be vllm, nemo-rl, verl, skyrl or trl-serve")
        check_k(self.k, "--k")


@dataclass
class RolloutConfig(EngineSettings, EngineShare):
    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, or 'smollm2-135m' (embedded)."""
    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | hub:ORG/NAME[:split=S,config=C] (a hub dataset) | file.jsonl/.parquet | chat
    (general prompts)."""
    system_prompt: str | None = None
    """A system turn put first in every prompt, as the RL run's prompts have it (refused with data whose prompts have
    a system turn of their own)."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template, a JSON object (TRL's chat_template_kwargs), e.g.
    '{"enable_thinking": false}' for Qwen3."""
    split: str = "eval"
    """train | eval (held-out prompts)."""
    out: str | None = None
    """Run directory for the records (optional)."""
    prompt_col: str = "prompt"
    """Prompt column of a file or hub source (a text, or a conversation: a list of messages)."""
    answer_col: str = "answer"
    """Answer column of a file or hub source (a hub source's may be a nested field: a.b)."""
    draft: str | None = None
    """Draft folder (init-draft or export output): speculative rollouts."""
    method: str = "eagle3"
    """The draft's family: eagle3 | peagle | dflash | dspark (GPU builds) with --draft | mtp: the model's own MTP
    layers draft (no --draft)."""
    draft_model: str | None = None
    """Instead of --draft: a smaller causal LM with the policy's tokenizer (vLLM's draft-model speculation);
    'policy' drafts with the policy itself, the oracle whose T=1 greedy acceptance bounds every greedy draft's."""
    k: int | str = DEFAULT_K
    """Draft tokens per step, or 'auto': per batch size from --sweep (vLLM's dynamic speculation)."""
    sweep: str | None = None
    """sweep-k or forecast run directory (for --k auto)."""
    compare: bool = False
    """Also run plain decoding on the same prompts; print the speedup."""
    draft_sampling: str = "auto"
    """auto: chosen per build by measurement (greedy on the CPU build, probabilistic on GPU builds) | greedy: the
    draft proposes its argmax | probabilistic: it samples from its own distribution (more accepted at T>0). All exact."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(n_prompts=32))
    """How the policy samples."""
    acceptance_length: float | None = None
    """What-if timing: accept drafted tokens synthetically at this mean length (lossy; no --out)."""

    def validate(self) -> None:
        validate_engine(self)
        check_rendering(self)
        if self.acceptance_length is not None:
            check(self.out is None, "--out", self.out, "is refused with --acceptance-length: synthetic acceptance is "
                  "lossy by design (accepted tokens are the draft's, not the policy's), so its samples are not the "
                  "policy's rollouts and must not become records; drop --out (the speed figures are printed)")
            check((self.draft is not None or self.method == "mtp") and isinstance(self.k, int)
                  and 1 <= self.acceptance_length <= self.k + 1,
                  "--acceptance-length", self.acceptance_length, "needs --draft (or --method mtp) and a number in [1, k + 1]")
        if self.draft_model is not None:
            check(self.draft is None and self.k != "auto" and self.method == "eagle3", "--draft-model", self.draft_model,
                  "is refused with --draft, --method mtp or --k auto (one draft per rollout; a fixed --k)")
        check_drafter(self.method, self.draft)
        check(self.method != "mtp" or self.k != "auto", "--k", self.k, "auto reads a sweep's schedule for a draft "
              "folder (eagle3, peagle, dflash); give a fixed --k with --method mtp")
        check(self.split in ("train", "eval"), "--split", self.split, "must be 'train' or 'eval'")
        if self.k == "auto":
            if self.sweep is None:
                raise SpectoolError("--k auto needs --sweep RUN (a sweep-k or forecast run directory)")
        else:
            check_k(self.k, "--k", auto=True)
        check(not self.compare or self.draft is not None or self.draft_model is not None or self.sweep is not None
              or self.method == "mtp", "--compare", self.compare,
              "needs --draft, --draft-model or --method mtp (or --k auto --sweep RUN)")
        check_draft_sampling(self.draft_sampling)
        self.sampling.validate()


@dataclass
class SweepConfig(EngineSettings, EngineShare):
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
    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | hub:ORG/NAME[:split=S,config=C] (a hub dataset) | file.jsonl/.parquet | chat
    (general prompts)."""
    system_prompt: str | None = None
    """A system turn put first in every prompt, as the RL run's prompts have it (refused with data whose prompts have
    a system turn of their own)."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template, a JSON object (TRL's chat_template_kwargs), e.g.
    '{"enable_thinking": false}' for Qwen3."""
    split: str = "eval"
    """train | eval (held-out prompts)."""
    prompt_col: str = "prompt"
    """Prompt column of a file or hub source (a text, or a conversation: a list of messages)."""
    answer_col: str = "answer"
    """Answer column of a file or hub source (a hub source's may be a nested field: a.b)."""
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
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
    draft_sampling: str = "auto"
    """auto: chosen per build by measurement (greedy on the CPU build, probabilistic on GPU builds) | greedy: the
    draft proposes its argmax | probabilistic: it samples from its own distribution (more accepted at T>0). All exact."""
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

    @property
    def synthetic(self) -> dict | None:
        """{"rates": unconditional per-position rates} for the engine, or None (real acceptance)."""
        if self.acceptance_rates is not None:
            return {"rates": self.acceptance_rates}
        if self.acceptance_length is not None:
            from spectool.costmodel import rates_from_length  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

            return {"rates": rates_from_length(self.acceptance_length, max(self.ks))}
        return None

    def validate(self) -> None:
        validate_engine(self)
        check(bool(self.out), "--out", self.out, "must name the run directory")
        check_rendering(self)
        check_draft_sampling(self.draft_sampling)
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
        check(self.split in ("train", "eval"), "--split", self.split, "must be 'train' or 'eval'")
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
        if self.synthetic:
            check(set(self.methods) <= {"eagle3", "peagle", "dflash", "dspark", "draft_model", "mtp"}, "--methods",
                  self.methods, "must be drafter families or draft_model with synthetic acceptance (ngram proposes "
                  "from the text itself)")
        check(self.prompt_len >= 1, "--prompt-len", self.prompt_len, "must be >= 1")
        if self.lengths is not None:
            check_lengths(self.lengths)


@dataclass
class VerifyConfig(EngineSettings, EngineShare):
    draft: str | None = None
    """Draft folder (init-draft or export output) of the family --method names."""
    method: str = "eagle3"
    """The draft's family: eagle3 | peagle | dflash (with --draft) | mtp: verify the model's own MTP layers
    (no --draft)."""
    draft_model: str | None = None
    """Instead of --draft: a smaller causal LM with the policy's tokenizer (vLLM's draft-model speculation); 'policy'
    drafts with the policy itself (the oracle: its proposals are accepted most, so the acceptance path runs most)."""
    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, or 'smollm2-135m' (embedded)."""
    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | hub:ORG/NAME[:split=S,config=C] (a hub dataset) | file.jsonl/.parquet | chat
    (general prompts)."""
    system_prompt: str | None = None
    """A system turn put first in every prompt, as the RL run's prompts have it (refused with data whose prompts have
    a system turn of their own)."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template, a JSON object (TRL's chat_template_kwargs), e.g.
    '{"enable_thinking": false}' for Qwen3."""
    split: str = "eval"
    """train | eval (held-out prompts)."""
    prompt_col: str = "prompt"
    """Prompt column of a file or hub source (a text, or a conversation: a list of messages)."""
    answer_col: str = "answer"
    """Answer column of a file or hub source (a hub source's may be a nested field: a.b)."""
    k: int = DEFAULT_K
    """Draft tokens per step."""
    n_prompts: int = 4
    """Prompts for the token-distribution test."""
    samples: int = 300
    """Completions per prompt and arm."""
    positions: int = 6
    """Tokens per completion (each position is tested)."""
    depth: int = 0
    """Test positions this deep into a response: each prompt is first extended by this many tokens of one plain sample
    of the policy (seeded, EOS ignored so every prefix reaches the depth), and the tested positions follow it (e.g.
    2100: past a 2,048-token context, where reasoning-length rollouts sample). 0: the response's first tokens."""
    temperature: float = 1.0
    """Sampling temperature."""
    alpha: float = 0.01
    """Family-wise level: the chance that exact sampling is called NOT LOSSLESS is at most this (Bonferroni over plain's
    and speculative's tests)."""
    logprob_tol: float | None = None
    """Largest |engine - policy| logprob that passes, in both arms: the max over tokens for a float32 engine (default
    1e-3), the mean for a bfloat16 one (default 0.1: its rounding gap, precision.py). Unset with a float32 engine on a
    GPU: 1e-3 where the plain engine is that exact, else the speculative engine's gap is held to the plain engine's
    (verify.LogprobRule, printed with the verdict)."""
    control: str = "auto"
    """Lossy controls, comma-separated (LOSSLESS needs the tests to reject each): auto (unpatched on the CPU build,
    truncated elsewhere) | unpatched (the stock CPU rejection sampler) | offbyone (an acceptance rule off by one; CPU
    build) | truncated (top-p 0.9) | temperature (sampled 10% hotter) | none (power not shown: INCONCLUSIVE at best)."""
    out: str | None = None
    """Run directory for the evidence (verify.json)."""
    seed: int = 0
    """Sampling and data seed."""
    draft_sampling: str = "auto"
    """auto: chosen per build by measurement (greedy on the CPU build, probabilistic on GPU builds) | greedy: the
    draft proposes its argmax | probabilistic: it samples from its own distribution (more accepted at T>0). All exact."""
    dtype: str = "float32"
    """The engine's precision: float32 (the proof's default on every device: the policy's logprobs are a float32
    forward) | bfloat16 (the precision GPU rollouts serve) | auto."""

    def validate(self) -> None:
        validate_engine(self)
        check_rendering(self)
        check_drafter(self.method, self.draft)
        if self.draft_model is not None:
            check(self.draft is None and self.method == "eagle3", "--draft-model", self.draft_model,
                  "is refused with --draft or --method mtp (one draft per run)")
        check(self.method == "mtp" or bool(self.draft) or self.draft_model is not None, "--draft", self.draft,
              "must name a draft folder (or --draft-model, or --method mtp)")
        check_draft_sampling(self.draft_sampling)
        check(self.split in ("train", "eval"), "--split", self.split, "must be 'train' or 'eval'")
        check_k(self.k, "--k")
        check(self.n_prompts >= 1, "--n-prompts", self.n_prompts, "must be >= 1")
        check(self.samples >= 20, "--samples", self.samples, "must be >= 20 (the tests need counts)")
        check(self.positions >= 2, "--positions", self.positions, "must be >= 2 (position 1 is never speculated)")
        check(self.depth >= 0, "--depth", self.depth, "must be >= 0 (tokens of the policy's own sample before the tests)")
        check(0 < self.temperature <= 10, "--temperature", self.temperature, "must be in (0, 10]: greedy needs no test")
        check(0 < self.alpha < 0.5, "--alpha", self.alpha, "must be in (0, 0.5)")
        check(self.logprob_tol is None or self.logprob_tol > 0, "--logprob-tol", self.logprob_tol, "must be > 0")
        names = [c.strip() for c in self.control.split(",")]
        check(all(c in CONTROLS for c in names) and ("none" not in names or len(names) == 1), "--control", self.control,
              f"must be one of {', '.join(CONTROLS)}, or several of them comma-separated (none alone)")


@dataclass
class ForecastConfig:
    sweep: str = ""
    """sweep-k run (real, or --dummy-weights with synthetic acceptance) to fit the cost model on."""
    method: str = "eagle3"
    """The sweep's speculation method to forecast: eagle3 | peagle | dflash | dspark | draft_model | mtp (the cost model
    charges a parallel drafter one draft forward per verify step; schedule.json: draft-folder families)."""
    out: str | None = None
    """Folder for forecast.json/.csv/.png and schedule.json."""
    acceptance_rates: list[float] | None = None
    """Per-position acceptance (unconditional); default: the sweep's measured (its largest-k rows)."""
    lengths: str = "long-tail"
    """RL batch output lengths: fixed | long-tail | a harvest run directory (at reasoning lengths, a harvest of the
    RL run's own responses: their tail sets the step's time)."""
    max_tokens: int = 1024
    """Cap on the simulated output lengths."""
    batch: int = 512
    """Sequences in one RL batch (prompts x group size)."""
    max_concurrency: int = 256
    """Sequences the engine runs at once."""
    prompt_len: int = 128
    """Prompt tokens of the simulated sequences (the default is a short gym prompt; a chat-templated reasoning
    prompt is several hundred)."""
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """Draft lengths to consider."""
    generation_share: float | None = None
    """Generation's share of a synchronous RL step (default 0.66, NeMo RL's)."""
    rl_run: str | None = None
    """A train-rl run whose measured generation share is used."""
    min_gain: float = 0.03
    """Speculate at a batch size only above 1 + this predicted speedup."""

    def validate(self) -> None:
        check(bool(self.sweep), "--sweep", self.sweep, "must name a sweep-k run")
        check(self.method in ("eagle3", "peagle", "dflash", "dspark", "draft_model", "mtp"), "--method", self.method,
              "must be eagle3, peagle, dflash, dspark, draft_model or mtp")
        check(self.generation_share is None or 0 < self.generation_share < 1, "--generation-share",
              self.generation_share, "must be a fraction in (0, 1)")
        check(self.generation_share is None or self.rl_run is None, "--rl-run", self.rl_run,
              "and --generation-share exclude each other")
        r = self.acceptance_rates
        check(r is None or (all(0 <= x <= 1 for x in r) and all(x >= y for x, y in zip(r, r[1:]))),
              "--acceptance-rates", r, "must be non-increasing rates in [0, 1]")
        check(self.batch >= 1 and self.max_concurrency >= 1, "--batch/--max-concurrency",
              (self.batch, self.max_concurrency), "must be >= 1")
        check(self.max_tokens >= 1, "--max-tokens", self.max_tokens, "must be >= 1")
        check_lengths(self.lengths)
