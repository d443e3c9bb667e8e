"""Harvest runs: the policy's own rollouts on in-domain prompts, the draft's training data. Used by
`spectool harvest` and by `init-draft` when its --data is a data source.

Workflow: resolve model + data -> open (or resume) the run directory -> start vLLM -> generate
chunk by chunk, each chunk written as one atomic Parquet shard (plus, with --hidden-states, one
safetensors shard of aux hidden states) -> final manifest. A killed harvest resumes at the first
prompt not in a finished shard; a run made with other settings is refused.

At scale, through vLLM: --tensor-parallel-size splits the policy over devices; --data-parallel-size N
runs N engine replicas, one per process of a launcher (`torchrun --nproc_per_node N -m spectool.cli
harvest ...`: vLLM's external-launcher mode, as TRL's colocate engines run), each on every N-th
prompt, writing its own shards into the one run folder (the main process claims it and writes the
manifest once every replica is done).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spectool.errors import check
from spectool.prompts import check_conversations, rendering
from spectool.settings.data import PolicyData, Rendering, Split
from spectool.settings.engine import EngineSettings, EngineShare, engine_kwargs
from spectool.settings.groups import validate_groups
from spectool.settings.sampling import SamplingConfig

log = logging.getLogger(__name__)

CPU_CHUNK_PROMPTS = 16  # prompts per shard on the CPU build: the unit of resume
GPU_CHUNK_SEQUENCES = 1024  # sequences per generate call on a GPU: few enough waves to run at engine speed


def chunk_prompts(samples: int, cpu_build: bool) -> int:
    """Prompts per shard. On a GPU, many sequences per generate call: each call ends in a long tail
    of few live sequences (the measurement behind it: docs/gpu.md)."""
    return CPU_CHUNK_PROMPTS if cpu_build else max(CPU_CHUNK_PROMPTS, GPU_CHUNK_SEQUENCES // samples)


@dataclass(kw_only=True)
class HarvestConfig(PolicyData, Rendering, Split, EngineSettings, EngineShare):
    """The harvest stage's settings: `spectool harvest`'s flags, and what init-draft harvests with."""

    text_prompts: str | None = None
    """How a text prompt is rendered: chat-template (the default: one user turn, as train-rl gives it) | raw (its own
    tokens, as TRL's GRPOTrainer tokenizes a standard-format dataset's text prompts: a draft for such a TRL run).
    Conversations always go through the chat template, as TRL renders them."""
    out: str = ""
    """Run directory to create (or resume)."""
    split: str = "train"
    """train | eval (deterministic, never overlapping)."""
    hidden_states: bool = False
    """Also store the policy's EAGLE-3 aux hidden states (what init-draft trains on)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """How the policy samples."""
    tensor_parallel_size: int = 1
    """vLLM's tensor parallelism: the policy split over N GPUs (on the CPU build, N worker processes)."""
    data_parallel_size: int = 1
    """vLLM's data parallelism: N engine replicas, one per process: launch with `torchrun --nproc_per_node N`
    (times --tensor-parallel-size)."""

    def validate(self) -> None:
        validate_groups(self)
        check(self.tensor_parallel_size >= 1, "--tensor-parallel-size", self.tensor_parallel_size, "must be >= 1")
        procs, launched = self.data_parallel_size * self.tensor_parallel_size, int(os.environ.get("WORLD_SIZE", "1"))
        # vLLM's offline engine runs data parallelism only as one process per replica (vllm.LLM refuses it in one)
        check(self.data_parallel_size == 1 or launched == procs, "--data-parallel-size", self.data_parallel_size,
              f"runs one engine replica per process (vLLM's offline engine refuses data parallelism inside one): "
              f"launch {procs} processes, `torchrun --nproc_per_node {procs} -m spectool.cli harvest ... "
              f"--data-parallel-size {self.data_parallel_size}` (this launch has {launched})")
        check(self.data_parallel_size >= 1, "--data-parallel-size", self.data_parallel_size, "must be >= 1")
        check(bool(self.out), "--out", self.out, "must name the run directory")
        self.sampling.validate()


@dataclass
class HarvestResult:
    out: str
    n_records: int
    n_new: int
    mean_reward: float
    tokens_per_s: float
    hidden_bytes_per_token: float | None
    finish_reasons: dict = field(default_factory=dict)  # the run's records: "length" (cut at --max-tokens), "stop" (EOS)
    cut_warning: str | None = None  # context.cut_warning: too many completions cut at the length cap


@dataclass
class _Place:
    """Where this process stands in a launch: its replica (every `replicas`-th prompt), whether it writes (the
    first process of a tensor-parallel group), the shard index its replica starts from."""

    replica: int
    replicas: int
    writer: bool
    first: int = 0


@dataclass
class _Counts:
    """What this process generated and stored (summed over the replicas at the end)."""

    records: int = 0
    tokens: int = 0
    seconds: float = 0.0
    hidden_bytes: int = 0
    hidden_tokens: int = 0


def harvest(cfg: HarvestConfig) -> HarvestResult:
    model, source, tasks, context = checked_inputs(cfg)
    out = Path(cfg.out)
    place = _place(cfg)
    manifest, todo = _open_run(cfg, model, source, tasks, out, place)
    engine = _start_engine(cfg, model, out, place, context) if todo else None
    counts = _generate(cfg, model, source, engine, tasks, todo, out, place, manifest["chunk_prompts"])
    return _finish(cfg, engine, counts, manifest, out, place)


def checked_inputs(cfg: HarvestConfig) -> tuple:
    """What a harvest refuses before its folder is claimed or an engine starts (its settings, a --system-prompt over
    the data's own system turns, a context past the model's limit or shorter than the run needs): (model, source,
    tasks, context). init-draft asks it before claiming its own --out (a refused run writes nothing)."""
    from spectool.data import load_source  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.models import resolve_model  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    cfg.validate()
    model = resolve_model(cfg.model)
    source = load_source(cfg.data, seed=cfg.sampling.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col)
    tasks = source.tasks(cfg.split, cfg.sampling.n_prompts)
    check_conversations(tasks, cfg)
    return model, source, tasks, _context(cfg, model, tasks)


def _context(cfg: HarvestConfig, model, tasks: list) -> int:
    """The engine's context (context.resolve_max_model_len) for the run's prompts, rendered as the engine gets them."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    from spectool.context import resolve_max_model_len  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.prompts import encode_tasks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    longest = max(map(len, encode_tasks(AutoTokenizer.from_pretrained(model.path), tasks, cfg)), default=0)
    return resolve_max_model_len(model.path, longest, cfg.sampling.max_tokens, user=cfg.max_model_len)


def _place(cfg: HarvestConfig) -> _Place:
    if cfg.data_parallel_size > 1:  # the launcher's process group (gloo on the CPU, NCCL on GPUs), which vLLM joins
        from accelerate import PartialState  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        PartialState()
    from spectool import ranks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    replica, tp_rank = divmod(ranks.rank(), cfg.tensor_parallel_size)  # a tensor-parallel group is one replica
    return _Place(replica, cfg.data_parallel_size, writer=tp_rank == 0)


def _open_run(cfg: HarvestConfig, model, source, tasks, out: Path, place: _Place) -> tuple[dict, list]:
    """Claim (or resume) the run folder and write its running manifest; (manifest, the prompts still to do).
    The main process owns the folder, the other replicas stop with it if refused or if any cannot see it (a launch
    across nodes needs it on a shared filesystem: ranks.shared_folder); more prompts (or another GPU
    share, another parallelism) may resume a run; the model is compared by identity, not name."""
    from spectool import ranks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.data.sources import MIX_SEPARATOR, mix_counts  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.engine.compat import is_cpu_build  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.records import load_records, next_shard_index  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.runs import MANIFEST, atomic_write_json, claim, load_manifest, make_manifest  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    chunk = chunk_prompts(cfg.sampling.samples, is_cpu_build())
    may_change = {"sampling.n_prompts", "gpu_memory_utilization", "enforce_eager", "tensor_parallel_size",
                  "data_parallel_size", "max_model_len"}
    ranks.claim_folder(out, lambda: claim(out, "harvest", {**asdict(cfg), "model_identity": model.identity},
                                          may_change=may_change))  # one folder every replica sees
    if (out / MANIFEST).exists():
        chunk = load_manifest(out, "harvest").get("chunk_prompts", CPU_CHUNK_PROMPTS)  # a resume keeps its shards
    manifest = make_manifest("harvest", model=model.name, model_path=model.path, model_identity=model.identity,
                             model_fingerprint=model.fingerprint, model_weights=model.weights,
                             data=cfg.data, rendering=rendering(cfg), chunk_prompts=chunk, status="running",
                             prompts_per_source=mix_counts(cfg.data, tasks, source) if MIX_SEPARATOR in cfg.data else None)
    done = set(load_records(out)["prompt_id"])
    place.first = next_shard_index(out)  # every replica reads the same folder, before any of them writes
    ranks.barrier()  # ... so the main process writes nothing before all have read it
    if ranks.rank() == 0:
        atomic_write_json(out / MANIFEST, manifest)
    return manifest, [t for t in tasks if t.id not in done]


def _start_engine(cfg: HarvestConfig, model, out: Path, place: _Place, context: int):
    """The engine (every process of a launch starts one: they join one group, even a replica with no prompts
    left); with --hidden-states on a GPU its share leaves room for the float32 policy (memory.harvest_plan)."""
    import torch  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    from spectool.engine.engine import Engine, EngineConfig  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    share = cfg.gpu_memory_utilization
    if cfg.hidden_states and torch.cuda.is_available():  # the policy shares the GPU with the engine
        from transformers import AutoConfig  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        from spectool.engine.compat import batch_defaults  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
        from spectool.memory import harvest_plan, output_bin_counts  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
        from spectool.precision import engine_dtype  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        gpu, config = torch.cuda.get_device_properties(0), AutoConfig.from_pretrained(model.path)
        seqs = batch_defaults(False, gpu.name, gpu.total_memory)[0]  # the engine is given no batch: vLLM's own
        share, plan = harvest_plan(config, share, gpu.total_memory, engine_dtype(cfg.dtype),
                                   bins=output_bin_counts(seqs, config.vocab_size))
        log.info(plan.text())
    return Engine(EngineConfig(model_path=model.path, seed=cfg.sampling.seed, log_path=str(out / "engine.log"),
                               **{**engine_kwargs(cfg), "gpu_memory_utilization": share},
                               tensor_parallel_size=cfg.tensor_parallel_size, external_launcher=place.replicas > 1,
                               max_model_len=context))


def _generate(cfg: HarvestConfig, model, source, engine, tasks: list, todo: list, out: Path, place: _Place,
              chunk: int) -> _Counts:
    """This replica's prompts (every `replicas`-th still to do), chunk by chunk: each chunk one atomic shard
    (index first + replica + j * replicas), with its features beside it under --hidden-states."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from transformers import AutoTokenizer  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    from spectool.generation import rollout_tasks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.hidden import default_aux_layer_ids  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.records import write_shard  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    mine = todo[place.replica::place.replicas]
    tokenizer = AutoTokenizer.from_pretrained(model.path)
    layer_ids = default_aux_layer_ids(model.fingerprint["num_hidden_layers"])  # vLLM's defaults, as drafts use
    policy = _load_policy(model.path) if cfg.hidden_states and mine and place.writer else None  # after the engine's check
    c = _Counts()
    one = place.replicas == 1
    with Progress(TextColumn("harvest" if one else f"harvest, replica {place.replica}"), BarColumn(),
                  MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                  disable=not place.writer) as bar:
        job = bar.add_task("", total=len(tasks) if one else len(mine), completed=len(tasks) - len(todo) if one else 0,
                           rate="")
        for j, i in enumerate(range(0, len(mine), chunk)):
            part = mine[i : i + chunk]
            index = place.first + place.replica + j * place.replicas
            # Per-shard seed: a resumed harvest samples exactly what an uninterrupted one would.
            s = SamplingConfig(**{**asdict(cfg.sampling), "seed": cfg.sampling.seed + index})
            live = _live_rate(bar, job, c) if place.writer else None  # long completions: tokens while they grow
            rows, _, toks, secs = rollout_tasks(engine, tokenizer, source, part, s, cfg, live)  # prompts as cfg renders them
            c.tokens, c.seconds = c.tokens + toks, c.seconds + secs
            bar.update(job, advance=len(part), rate=f"{c.tokens} tokens, {c.tokens / c.seconds:.0f} tok/s")
            if not place.writer:  # the replica's other tensor-parallel processes generated the same rows
                continue
            if policy is not None:
                c.hidden_bytes += _store_hidden(policy, rows, layer_ids, out / "hidden" / f"shard-{index:05d}.safetensors",
                                                model.weights)
                c.hidden_tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            write_shard(out, index, rows)
            c.records += len(rows)
    return c


LOG_PROGRESS_S = 30.0  # without a terminal (a log file), a line this often while a chunk generates


def _live_rate(bar, job, c: _Counts):
    """The progress bar's tokens and rate while a chunk generates (Engine.generate's progress callback); without a
    terminal, where the bar is drawn only at the end, a log line every LOG_PROGRESS_S seconds."""
    t0 = last = time.perf_counter()

    def update(tokens: int) -> None:
        nonlocal last
        now = time.perf_counter()
        done, spent = c.tokens + tokens, c.seconds + now - t0
        bar.update(job, rate=f"{done} tokens, {done / max(spent, 1e-9):.0f} tok/s")
        if not bar.console.is_interactive and now - last >= LOG_PROGRESS_S:
            last = now
            log.info("harvest: %d tokens generated, %.0f tokens/s", done, done / max(spent, 1e-9))

    return update


def _finish(cfg: HarvestConfig, engine, c: _Counts, manifest: dict, out: Path, place: _Place) -> HarvestResult:
    """Every replica's counts summed once all shards are written (before vLLM leaves the group); the engine
    closed (init-draft's policy and training find the device free); the main process's complete manifest."""
    from spectool import ranks  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.context import cut_warning, finish_counts  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.hidden import default_aux_layer_ids  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.records import load_records  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.runs import MANIFEST, atomic_write_json  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    fix, dtype = (engine.sampler_fix, engine.dtype) if engine else (None, None)
    mine = (c.records, c.tokens if place.writer else 0, c.seconds if place.writer else 0.0, c.hidden_bytes,
            c.hidden_tokens)
    n_new, n_tokens, gen_s, hidden_bytes, hidden_tokens = (sum(x) for x in zip(*ranks.gather(mine)))
    if engine:
        engine.close()
    if ranks.rank() != 0:
        return HarvestResult(str(out), 0, n_new, 0.0, 0.0, None)  # the main process reports the run
    records = load_records(out)
    mean_reward = float(sum(records["reward"]) / max(len(records), 1))
    ended = finish_counts(records["finish_reason"])  # every record of the run, a resumed one's earlier shards too
    warning = cut_warning(ended, cfg.sampling.max_tokens)
    if warning:
        log.warning("harvest: %s", warning)
    layer_ids = default_aux_layer_ids(manifest["model_fingerprint"]["num_hidden_layers"])
    manifest.update(status="complete", records=len(records), prompts=len(set(records["prompt_id"])),
                    mean_reward=mean_reward, finish_reasons=ended, sampler_fix=fix, **({"dtype": dtype} if dtype else {}),
                    aux_layer_ids=layer_ids if cfg.hidden_states else None)
    atomic_write_json(out / MANIFEST, manifest)
    return HarvestResult(
        out=str(out), n_records=len(records), n_new=n_new, mean_reward=mean_reward,
        tokens_per_s=n_tokens / gen_s * place.replicas if gen_s else 0.0,  # replicas generate side by side
        hidden_bytes_per_token=hidden_bytes / hidden_tokens if hidden_tokens else None,
        finish_reasons=ended, cut_warning=warning,
    )


def _load_policy(path: str):
    import torch  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    # this process's GPU (a launcher's LOCAL_RANK: one replica per device)
    dev = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dev).eval()


def _store_hidden(policy, rows: list[dict], layer_ids: list[int], path: Path, weights: str) -> int:
    """The shard's policy features in the one features format (hidden.save_features), with the weights that computed
    them (models.weights_digest: init-draft reads them only for a --model with these weights); bytes."""
    from spectool.hidden import feature_items, save_features  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    return save_features(path, feature_items(policy, [r["prompt_ids"] + r["response_ids"] for r in rows], layer_ids),
                         {"model_weights": weights})
