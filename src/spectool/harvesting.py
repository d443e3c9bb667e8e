"""Harvest runs: the policy's own rollouts on in-domain prompts, the draft's training data. Used by
`spectool harvest` and by `init-draft` when its --data is a data source.

Workflow: resolve model + data -> open (or resume) the run directory -> start vLLM -> generate
chunk by chunk, each chunk written as one atomic Parquet shard (plus, with --hidden-states, one
safetensors shard of aux hidden states) -> final manifest. A killed harvest resumes at the first
prompt not in a finished shard; a run made with other settings is refused.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spectool.config import SamplingConfig
from spectool.constants import DEFAULT_DATA, DEFAULT_MODEL, GPU_MEMORY_UTILIZATION, check_dtype, check_gpu_memory
from spectool.engine.compat import NO_OFFLINE_DATA_PARALLEL
from spectool.errors import check

log = logging.getLogger(__name__)

CPU_CHUNK_PROMPTS = 16  # prompts per shard on the CPU build: the unit of resume
GPU_CHUNK_SEQUENCES = 1024  # sequences per generate call on a GPU: few enough waves to run at engine speed


def chunk_prompts(samples: int, cpu_build: bool) -> int:
    """Prompts per shard. On a GPU, many sequences per generate call: each call ends in a long tail
    of few live sequences (the measurement behind it: docs/gpu.md)."""
    return CPU_CHUNK_PROMPTS if cpu_build else max(CPU_CHUNK_PROMPTS, GPU_CHUNK_SEQUENCES // samples)


@dataclass
class HarvestConfig:
    """The harvest stage's settings: `spectool harvest`'s flags, and what init-draft harvests with."""

    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, or 'smollm2-135m' (embedded)."""
    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | file.jsonl/.parquet | chat (general prompts)."""
    out: str = ""
    """Run directory to create (or resume)."""
    split: str = "train"
    """train | eval (deterministic, never overlapping)."""
    hidden_states: bool = False
    """Also store the policy's EAGLE-3 aux hidden states (what init-draft trains on)."""
    prompt_col: str = "prompt"
    """Prompt column of a file source."""
    answer_col: str = "answer"
    """Answer column of a file source."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How the policy samples."""
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    """GPU only: the engine's share of GPU memory (weights + KV cache). Lower it if another process shares the GPU."""
    dtype: str = "auto"
    """The engine's precision: auto (float32 on the CPU build, bfloat16 on a GPU) | float32 | bfloat16."""
    tensor_parallel_size: int = 1
    """vLLM's tensor parallelism: the policy split over N GPUs (on the CPU build, N worker processes)."""
    data_parallel_size: int = 1
    """vLLM's data parallelism: N engine replicas (refused with the reason where harvest's engine cannot run it)."""

    def validate(self) -> None:
        check_dtype(self.dtype)
        check(self.tensor_parallel_size >= 1, "--tensor-parallel-size", self.tensor_parallel_size, "must be >= 1")
        check(self.data_parallel_size == 1, "--data-parallel-size", self.data_parallel_size,
              f"must be 1: {NO_OFFLINE_DATA_PARALLEL}, and harvest is one process writing one resumable run folder; "
              "--tensor-parallel-size N puts N devices under its one engine")
        check(bool(self.out), "--out", self.out, "must name the run directory")
        check(self.split in ("train", "eval"), "--split", self.split, "must be 'train' or 'eval'")
        check_gpu_memory(self.gpu_memory_utilization)
        self.sampling.validate()


@dataclass
class HarvestResult:
    out: str
    n_records: int
    n_new: int
    mean_reward: float
    tokens_per_s: float
    hidden_bytes_per_token: float | None


def harvest(cfg: HarvestConfig) -> HarvestResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from transformers import AutoTokenizer  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    from spectool.data import load_source  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.engine.compat import is_cpu_build  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.engine.engine import Engine, EngineConfig  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.generation import rollout_tasks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.models import resolve_model  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.records import load_records, shard_paths, write_shard  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.runs import MANIFEST, atomic_write_json, claim, load_manifest, make_manifest  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    cfg.validate()
    model = resolve_model(cfg.model)
    source = load_source(cfg.data, seed=cfg.sampling.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col)
    tasks = source.tasks(cfg.split, cfg.sampling.n_prompts)
    out = Path(cfg.out)
    chunk = chunk_prompts(cfg.sampling.samples, is_cpu_build())
    # more prompts (or another GPU share) may resume a run; the model is compared by identity, not name
    claim(out, "harvest", {**asdict(cfg), "model_identity": model.identity},
          may_change={"sampling.n_prompts", "gpu_memory_utilization", "tensor_parallel_size"})
    if (out / MANIFEST).exists():
        chunk = load_manifest(out, "harvest").get("chunk_prompts", CPU_CHUNK_PROMPTS)  # a resume keeps its shards
    from spectool.data.sources import MIX_SEPARATOR, mix_counts  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    manifest = make_manifest("harvest", model=model.name, model_path=model.path, model_identity=model.identity,
                             model_fingerprint=model.fingerprint,
                             data=cfg.data, chunk_prompts=chunk, status="running",
                             prompts_per_source=mix_counts(cfg.data, tasks, source) if MIX_SEPARATOR in cfg.data else None)
    atomic_write_json(out / MANIFEST, manifest)

    done = set(load_records(out)["prompt_id"])
    todo = [t for t in tasks if t.id not in done]
    n_shards = len(shard_paths(out))
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    from spectool.hidden import default_aux_layer_ids  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    layer_ids = default_aux_layer_ids(model.fingerprint["num_hidden_layers"])  # vLLM's defaults, as drafts use
    import torch  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    share = cfg.gpu_memory_utilization
    if cfg.hidden_states and todo and torch.cuda.is_available():  # the policy shares the GPU with the engine
        from transformers import AutoConfig  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        from spectool.memory import harvest_plan  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        share, plan = harvest_plan(AutoConfig.from_pretrained(model.path), share,
                                   torch.cuda.get_device_properties(0).total_memory)
        log.info(plan.text())
    engine = Engine(EngineConfig(model_path=model.path, seed=cfg.sampling.seed, log_path=str(out / "engine.log"),
                                 gpu_memory_utilization=share, dtype=cfg.dtype,
                                 tensor_parallel_size=cfg.tensor_parallel_size)) if todo else None
    policy = _load_policy(model.path) if cfg.hidden_states and todo else None  # after the engine's start-up check
    n_new, n_tokens, gen_s, hidden_bytes, hidden_tokens = 0, 0, 0.0, 0, 0
    with Progress(TextColumn("harvest"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                  TimeRemainingColumn()) as bar:
        job = bar.add_task("", total=len(tasks), completed=len(tasks) - len(todo), rate="")
        for i in range(0, len(todo), chunk):
            part = todo[i : i + chunk]
            # Per-chunk seed: a resumed harvest samples exactly what an uninterrupted one would.
            s = SamplingConfig(**{**asdict(cfg.sampling), "seed": cfg.sampling.seed + n_shards})
            rows, _, toks, secs = rollout_tasks(engine, tokenizer, source, part, s)
            if policy is not None:
                hidden_bytes += _store_hidden(policy, rows, layer_ids, out / "hidden" / f"shard-{n_shards:05d}.safetensors")
                hidden_tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            write_shard(out, n_shards, rows)
            n_shards += 1
            n_new += len(rows)
            n_tokens += toks
            gen_s += secs
            bar.update(job, advance=len(part), rate=f"{n_tokens / gen_s:.0f} tok/s")

    fix, dtype = (engine.sampler_fix, engine.dtype) if engine else (None, None)
    if engine:
        engine.close()  # the next stage (init-draft's policy and training) finds the device free
    records = load_records(out)
    mean_reward = float(sum(records["reward"]) / max(len(records), 1))
    manifest.update(status="complete", records=len(records), prompts=len(set(records["prompt_id"])),
                    mean_reward=mean_reward, sampler_fix=fix, **({"dtype": dtype} if dtype else {}),
                    aux_layer_ids=layer_ids if cfg.hidden_states else None)
    atomic_write_json(out / MANIFEST, manifest)
    return HarvestResult(
        out=str(out), n_records=len(records), n_new=n_new, mean_reward=mean_reward,
        tokens_per_s=n_tokens / gen_s if gen_s else 0.0,
        hidden_bytes_per_token=hidden_bytes / hidden_tokens if hidden_tokens else None,
    )


def _load_policy(path: str):
    import torch  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).eval()


def _store_hidden(policy, rows: list[dict], layer_ids: list[int], path: Path) -> int:
    """The shard's policy features in the one features format (hidden.save_features); bytes."""
    from spectool.hidden import feature_items, save_features  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    return save_features(path, feature_items(policy, [r["prompt_ids"] + r["response_ids"] for r in rows], layer_ids))
