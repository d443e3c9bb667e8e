"""GPU memory plans, printed and checked before anything starts, for each command that starts an
engine next to a model on one GPU: train-rl's built-in backend (policy, gradients, AdamW, autocast
copies, reference policy, online draft, activations, engine share), harvest --hidden-states (the
float32 policy beside the engine) and the TRL integration (GRPOTrainer's policy beside its colocated
engine). A plan that cannot fit is refused, naming the settings that would make it fit.

The activation figure is an estimate (per token and layer, the values a decoder layer keeps for
backward with fused attention; the logits with their log-softmax and gradient in float32); the
rest is exact arithmetic on parameter counts. The estimate was checked against a real GRPO update on
a CPU (benchmarks/memory_plan.py: measured / plan 0.83-1.03); nothing here has run on a GPU yet."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.families import MTP_PREFIX
from spectool.hidden import MAX_BATCH_TOKENS, MIN_BATCH_TOKENS, forward_token_bytes

GIB = 1024**3
ACTIVATION_SHARE = 0.10  # of the GPU kept free for a no-grad forward's activations and the allocator
MIN_ENGINE_GIB = 2.0  # beyond its weights: the least KV cache and buffers worth starting an engine with
ENGINE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # a weight as the engine holds it (precision.engine_dtype)


@dataclass
class Plan:
    """What one GPU would hold, item by item (GiB), against its size."""

    title: str
    total_gib: float
    rows: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    estimated: str = "activations estimated"  # which rows are estimates ("": none)

    def add(self, item: str, nbytes: float) -> None:
        if nbytes:
            self.rows.append((item, nbytes / GIB))

    @property
    def used_gib(self) -> float:
        return sum(g for _, g in self.rows)

    @property
    def fits(self) -> bool:
        return self.used_gib <= self.total_gib

    def text(self) -> str:
        w = max(len(r) for r, _ in self.rows)
        lines = [f"{self.title} (GiB{'; ' + self.estimated if self.estimated else ''}):"]
        lines += [f"  {r:<{w}}  {g:7.1f}" for r, g in self.rows]
        lines.append(f"  {'total':<{w}}  {self.used_gib:7.1f} of {self.total_gib:.1f} on this GPU"
                     f" ({'fits' if self.fits else 'does NOT fit'})")
        return "\n".join(lines + [f"  {n}" for n in self.notes])

    def check(self, advice: str) -> None:
        if not self.fits:
            raise SpectoolError(f"{self.text()}\n{advice}")


def _moe(config) -> tuple[int, int, int, int]:
    """(experts, experts per token, expert intermediate size, shared-expert intermediate size) of a
    mixture-of-experts config (Qwen3-MoE / Qwen2-MoE: num_experts, Mixtral: num_local_experts); experts 0
    for a dense one."""
    e = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0
    i = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    return e, getattr(config, "num_experts_per_tok", 0) or 0, i, getattr(config, "shared_expert_intermediate_size", 0) or 0


def _moe_layers(config) -> int:
    """How many decoder layers hold experts (Qwen's decoder_sparse_step and mlp_only_layers)."""
    if not _moe(config)[0]:
        return 0
    step, dense = getattr(config, "decoder_sparse_step", 1) or 1, set(getattr(config, "mlp_only_layers", []) or [])
    return sum(1 for n in range(config.num_hidden_layers) if n not in dense and (n + 1) % step == 0)


def layer_params(config, moe: bool) -> int:
    """Parameters of one decoder layer: attention, norms and its MLP (dense, or every expert with
    the router and any shared expert)."""
    h, i = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    attn = h * heads * hd * 2 + h * kv * hd * 2
    if not moe:
        return attn + 3 * h * i + 2 * h
    e, _, ei, shared = _moe(config)
    return attn + e * 3 * h * ei + e * h + (3 * h * shared + h if shared else 0) + 2 * h


def param_count(config) -> int:
    """Parameters of a decoder-only transformers config (attention, MLP or experts, embeddings, norms)."""
    h, n, v = config.hidden_size, config.num_hidden_layers, config.vocab_size
    m = _moe_layers(config)
    emb = v * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return m * layer_params(config, True) + (n - m) * layer_params(config, False) + emb + h


def activation_bytes(config, tokens: int, value_bytes: int = 2, checkpointing: bool = False) -> int:
    """Activations one training forward keeps for backward over `tokens` (micro-batch x padded
    length): per token and decoder layer about 11 H + 3 I values (norm inputs, q/k/v, the attention
    output, the gated MLP's three intermediates; fused attention keeps no T x T scores) in the
    compute dtype, or with gradient checkpointing each layer's input and one layer's full set; plus
    the logits, their log-softmax and its gradient in float32."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    e, top_k, ei, shared = _moe(config)
    if e:  # a token runs through its top-k experts (and any shared one): their intermediates are what it keeps
        i = top_k * ei + shared
    layer = 11 * h + 3 * i
    kept = n * h + layer if checkpointing else n * layer
    return tokens * (kept * value_bytes + 3 * config.vocab_size * 4)


DRAFT_ADAMW_BYTES = 8  # per draft parameter: AdamW's two float32 moments


def draft_bytes(draft_params: int, config, embedding_copy: bool = True) -> int:
    """An online draft on the trainer's device: float32 weights, gradients and AdamW (16 B/param),
    plus (EAGLE-3) its float32 copy of the policy's token embedding; MTP layers read the policy's."""
    if not draft_params:
        return 0
    return (8 + DRAFT_ADAMW_BYTES) * draft_params + (4 * config.vocab_size * config.hidden_size if embedding_copy else 0)


def draft_params(folder, mtp: bool) -> int:
    """Parameters a refreshed draft trains: an EAGLE-3 folder's tensors, or a model folder's MTP layers."""

    return safetensors_params(folder, MTP_PREFIX + "." if mtp else "")


def safetensors_params(folder, prefix: str = "") -> int:
    """Parameters stored in a folder's safetensors files (headers only), names starting with `prefix`."""

    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    n = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k.startswith(prefix):
                    n += math.prod(st.get_slice(k).get_shape())
    return n


def drafter_logits(max_num_seqs: int, k: int, vocab: int, value_bytes: int) -> int:
    """The V2 runner's drafter-logits buffer [max_num_seqs, k, vocab] (value_bytes: compat.drafter_logits_bytes),
    preallocated under probabilistic proposals out of the engine's share, before the KV cache is sized."""
    return max_num_seqs * k * vocab * value_bytes


def output_bin_counts(max_num_seqs: int, vocab: int) -> int:
    """The V2 runner's `output_bin_counts` [max_num_seqs, vocab] int32, preallocated by every GPU engine, drafting or
    not, out of its share (v1/worker/gpu/sample/penalties.py:38-41@0.26, :45-49@0.33): 0.58 GiB at 1,024 sequences
    of Qwen3's 151,936-token vocabulary. Counted on every GPU plan (a V1 engine holds none: the safe side)."""
    return 4 * max_num_seqs * vocab


def add_engine_share(plan: Plan, share: float, total_bytes: int, logits: int, setting: str, bins: int = 0) -> None:
    """The engine's share as rows: the buffers it preallocates first (drafter logits, output_bin_counts), then
    weights and KV cache."""
    plan.add("engine share: drafter logits [max_num_seqs x k x vocab]", logits)
    plan.add("engine share: output_bin_counts [max_num_seqs x vocab] int32", bins)
    plan.add(f"engine share: weights, KV cache ({setting})", share * total_bytes - logits - bins)


def engine_floor(config, logits: int, dtype: str) -> float:
    """The least engine share worth starting (GiB): the policy's weights in the engine's `dtype` (a float32 engine's
    are twice a bfloat16 one's), the buffers it preallocates (`logits`: drafter logits + output_bin_counts), a little
    KV."""
    return (ENGINE_DTYPE_BYTES[dtype] * param_count(config) + logits) / GIB + MIN_ENGINE_GIB


def check_engine_floor(plan: Plan, config, share: float, logits: int, dtype: str, setting: str, who: str,
                       other_fixes: str, past_the_gpu: str = "") -> None:
    """Refuse an engine share (`setting` = `share`) that cannot hold the policy's weights in the engine's `dtype`, the
    drafter logits and a little KV cache (vLLM would start with no KV blocks), naming the share that would
    (`other_fixes` after it; `past_the_gpu` after "use GPUs with more memory" when no share would do)."""
    floor = engine_floor(config, logits, dtype)
    if share * plan.total_gib >= floor:
        return
    need = math.ceil(100 * floor / plan.total_gib) / 100
    raise SpectoolError(f"{plan.text()}\n{who} ({share} x {plan.total_gib:.0f} GiB) cannot hold the policy's {dtype} "
                        f"weights, the drafter logits and a little KV cache ({floor:.1f} GiB): raise {setting} to {need} "
                        f"or more{other_fixes if need < 1 else ''}" + ("" if need < 1 else
                        f", which is more than the GPU: use GPUs with more memory{past_the_gpu}"))


def train_rl_plan(config, *, engine_share: float, total_bytes: int, micro_tokens: int, kl_beta: float,
                  autocast_bf16: bool, draft_params: int = 0, draft_embedding: bool = True, logits: int = 0,
                  bins: int = 0, refresh: RefreshStep | None = None) -> Plan:
    """train-rl's built-in backend on one GPU: float32 master weights, gradients and AdamW; the
    bfloat16 weight copies autocast keeps for backward; a reference copy when kl_beta > 0; the
    online draft; activations of one micro-batch (`micro_tokens` = micro_batch_size x longest
    prompt + rollout.max_tokens); the online draft's refresh step (`refresh`: memory.refresh_step) beyond
    them; the engine's share, of which `logits` bytes of drafter logits and `bins` of output_bin_counts."""
    p = param_count(config)
    plan = Plan(f"train-rl memory plan: {p / 1e9:.2f}B-parameter policy", total_bytes / GIB)
    plan.add("policy weights (float32)", 4 * p)
    plan.add("gradients (float32)", 4 * p)
    plan.add("AdamW moments (float32)", 8 * p)
    plan.add("bfloat16 weight copies (autocast)", 2 * p if autocast_bf16 else 0)
    plan.add("reference policy (policy.kl_beta > 0)", 4 * p if kl_beta > 0 else 0)
    plan.add("online draft + AdamW", draft_bytes(draft_params, config, draft_embedding))
    activations = activation_bytes(config, micro_tokens, 2 if autocast_bf16 else 4)
    plan.add(f"activations (policy.micro_batch_size: {micro_tokens} tokens)", activations)
    add_refresh_step(plan, refresh, activations, "draft_refresh.max_batch_tokens")
    add_engine_share(plan, engine_share, total_bytes, logits, "engine.gpu_memory_utilization", bins)
    return plan


def check_train_rl(plan: Plan, config, engine_share: float, logits: int = 0, dtype: str = "bfloat16") -> None:
    """Refuse a built-in plan that cannot fit, naming what would: a smaller engine share (if the
    engine still holds its weights in its `dtype` and a little cache), else the trainer's own settings,
    else the TRL backend. A plan that fits is still refused when the engine's share cannot hold its
    weights, the drafter logits and a little KV cache (vLLM would start with no KV blocks)."""
    if plan.fits:
        check_engine_floor(plan, config, engine_share, logits, dtype, "engine.gpu_memory_utilization",
                           "the engine's share", ", or lower rollout.prompts_per_step x group_size (the drafter-logits rows)")
        return
    p = param_count(config)
    total, engine = plan.total_gib, engine_share * plan.total_gib
    room = total - (plan.used_gib - engine)  # what the engine could have
    state = 16 * p / GIB  # weights, gradients, AdamW
    if room >= engine_floor(config, logits, dtype):
        advice = f"lower engine.gpu_memory_utilization to {math.floor(100 * room / total) / 100:.2f} or less"
    elif state + engine_floor(config, logits, dtype) > total:
        advice = (f"no setting fits it: the float32 weights, gradients and AdamW alone take {state:.1f} GiB")
    else:
        rows = dict(plan.rows)
        knobs = ["lower policy.micro_batch_size or rollout.max_tokens"]
        if any(r.startswith("reference policy") for r in rows):
            knobs.append("set policy.kl_beta: 0 (no reference copy)")
        if any(r.startswith("draft refresh step") and "draft_refresh.max_batch_tokens shrinks" in r for r in rows):
            knobs.append("lower draft_refresh.max_batch_tokens")
        if any(r.startswith("online draft") for r in rows):
            knobs.append("set draft_refresh.mode: frozen")
        advice = "the trainer leaves the engine too little: " + ", ".join(knobs)
    plan.check(f"train-rl's built-in backend cannot fit this on one GPU: {advice}. Or run "
               "`spectool train-rl --backend trl` (TRL's GRPOTrainer: DeepSpeed/FSDP sharding, LoRA, several GPUs)")


def harvest_plan(config, wanted: float, total_bytes: int, dtype: str = "bfloat16",
                 flag: str = "--gpu-memory-utilization", bins: int = 0) -> tuple[float, Plan]:
    """harvest --hidden-states: the float32 policy computes features beside the engine. vLLM refuses
    to start unless share x total is free, so the engine's share leaves room for the policy and a
    no-grad forward (ACTIVATION_SHARE). Returns (the share to use, the plan); refuses when the
    engine would get less than its weights in its `dtype` and a little cache."""
    p = param_count(config)
    total = total_bytes / GIB
    share = min(wanted, 1 - 4 * p / total_bytes - ACTIVATION_SHARE)
    plan = Plan(f"harvest --hidden-states memory plan: {p / 1e9:.2f}B-parameter policy", total)
    plan.add("policy weights (float32, features)", 4 * p)
    plan.add("feature forward activations (reserve)", ACTIVATION_SHARE * total_bytes)
    plan.add("engine share: output_bin_counts [max_num_seqs x vocab] int32", bins)
    plan.add(f"engine share ({flag} {share:.2f}): weights, KV cache", max(share, 0) * total_bytes - bins)
    if share < wanted:
        plan.notes.append(f"{flag} {wanted} lowered to {share:.2f}: vLLM starts only if its share is free")
    if share * total < engine_floor(config, bins, dtype):
        raise SpectoolError(f"{plan.text()}\nthe float32 policy leaves the engine {max(share, 0):.0%} of the GPU, less "
                            "than its weights and a little cache: harvest without --hidden-states (init-draft computes "
                            "the features from the records in a second pass), or use a larger GPU")
    return share, plan


def trl_plan(config, *, param_bytes: int, engine_share: float, total_bytes: int, micro_tokens: int, ref_model: bool,
             shards: int, trainable_fraction: float, checkpointing: bool, draft_params: int = 0,
             draft_embedding: bool = True, processes: int = 1, weights_sharded: bool = True, logits: int = 0,
             bins: int = 0, refresh: RefreshStep | None = None) -> Plan:
    """TRL's GRPOTrainer on one of its GPUs, colocated with its engine: the policy in its own dtype
    (`param_bytes` per parameter), gradients and AdamW's two moments for the trainable part (torch
    keeps both in the parameters' dtype), divided over `shards` ranks (FSDP / ZeRO; 1 otherwise: the
    weights too when `weights_sharded`, FSDP full shard and ZeRO-3; else only gradients and AdamW:
    FSDP SHARD_GRAD_OP, ZeRO-1/2), a reference copy (beta > 0, sharded like the weights). Sharded
    weights add what is whole at a time: one decoder layer unsharded for its forward and backward (two,
    with prefetch) and, with a refreshed draft, the policy's embedding and lm_head the refresh
    gathers (policy_weights.embeddings). Then spectool's online draft (weights, gradients and AdamW
    state whole on each of the `processes` data-parallel ranks: the draft is replicated, not sharded),
    one micro-batch's activations, the draft's refresh step beyond them (`refresh`: memory.refresh_step), the
    engine's share (of which `logits` bytes of drafter logits and `bins` of output_bin_counts)."""
    p = param_count(config)
    train = p * trainable_fraction
    w_shards = shards if weights_sharded else 1
    plan = Plan(f"TRL GRPOTrainer memory plan, one GPU: {p / 1e9:.2f}B-parameter policy", total_bytes / GIB)
    plan.add(f"policy weights ({param_bytes} B/param{f', / {w_shards} shards' if w_shards > 1 else ''})",
             param_bytes * p / w_shards)
    plan.add(f"gradients (trainable parameters{f', / {shards} shards' if shards > 1 else ''})", param_bytes * train / shards)
    plan.add("AdamW moments (the policy's dtype, trainable)", 2 * param_bytes * train / shards)
    plan.add("reference policy (beta > 0)", param_bytes * p / w_shards if ref_model else 0)
    if w_shards > 1:
        plan.add("two decoder layers unsharded (forward / backward, prefetch)",
                 2 * param_bytes * layer_params(config, bool(_moe_layers(config))))
        if draft_params:
            emb = config.vocab_size * config.hidden_size * (1 if getattr(config, "tie_word_embeddings", False) else 2)
            plan.add("embedding + lm_head gathered whole for the draft refresh", param_bytes * emb)
    ranks = f"each of {processes} ranks" if processes > 1 else "this rank"
    plan.add(f"spectool draft weights + gradients (float32, on {ranks})",
             draft_bytes(draft_params, config, draft_embedding) - DRAFT_ADAMW_BYTES * draft_params)
    plan.add(f"spectool draft AdamW state (2 float32 moments, whole on {ranks})", DRAFT_ADAMW_BYTES * draft_params)
    activations = activation_bytes(config, micro_tokens, checkpointing=checkpointing)
    plan.add(f"activations (per_device_train_batch_size: {micro_tokens} tokens)", activations)
    add_refresh_step(plan, refresh, activations, "refresh.max_batch_tokens")
    add_engine_share(plan, engine_share, total_bytes, logits, "vllm_gpu_memory_utilization", bins)
    return plan


def rollout_plan(config, *, engine_share: float, total_bytes: int, logits: int, bins: int, dtype: str,
                 who: str = "rollout") -> Plan:
    """An engine alone on one GPU (rollout, and each arm of --compare): its share, of which the buffers it
    preallocates (`logits` bytes of drafter logits, `bins` of output_bin_counts) and the policy's weights in the
    engine's `dtype`; the rest is KV cache. Refused (check_engine_floor) when the share cannot hold them and a
    little KV cache."""
    p = param_count(config)
    plan = Plan(f"{who} memory plan: {p / 1e9:.2f}B-parameter policy", total_bytes / GIB, estimated="")
    plan.add(f"policy weights ({dtype}, in the engine)", ENGINE_DTYPE_BYTES[dtype] * p)
    add_engine_share(plan, engine_share, total_bytes, logits, "--gpu-memory-utilization", bins)
    plan.rows[-1] = ("engine share: KV cache and the rest", plan.rows[-1][1] - ENGINE_DTYPE_BYTES[dtype] * p / GIB)
    return plan


# init-draft: the policy serves features, then (or meanwhile, --features online) the draft trains on the same GPU.
# What autograd holds per unroll step in draft/ttt.py + draft/loss.py + model.chain_attention, linear in the step's
# tokens: the draft's fused attention (model.prefix_attention: one causal scaled_dot_product_attention per unroll step
# and layer, no [queries x keys] scores) keeps its kernel's padded queries, keys, values and output over every
# position of the record and a float32 log-sum-exp per head, and backward adds one step's and layer's gradients; the
# rest of a layer keeps DRAFT_ACTIVATION_H x H + 3 I values a token, more than a policy layer's 11 H + 3 I
# (activation_bytes): its first layer reads a 2H-wide input through four norms that compute in float32, rope keeps
# rotated copies. Fitted to one real step on this CPU (benchmarks/init_draft_memory.py: 1 x 1,024 to 1 x 2,048 tokens,
# 4 x 512, unroll 3 and 5, anchors 1 and 0.25; benchmarks/draft_long_records.py: 1,024-16,384 tokens): measured /
# planned 0.88-1.03 (docs/gpu.md "init-draft's memory plan"). The logit counts were fitted before, with the scores.
DRAFT_LOGIT_COPIES = 4  # per unroll step: the draft's logits, its log-softmax, the target softmax and exp(log q) (TV)
DRAFT_LOGIT_TRANSIENT = 3  # of one step: the target logits, their shifted copy, a gradient in backward
DRAFT_ACTIVATION_H = 27  # per token, unroll step and layer, in H values (and 3 I): 11 H as activation_bytes, 16 fitted
DRAFT_ATTENTION_KEPT = 4  # per token of the record, unroll step and layer, in H values: padded q, k, v, the output
DRAFT_ATTENTION_TRANSIENT = 4  # of one step and layer, in H float32 values a token: the gradients of q, k, v and o
RESERVE_SHARE = 0.05  # of the GPU: CUDA context, cuBLAS workspaces, allocator fragmentation (a choice, not measured)
# bytes a draft activation takes, by --draft-dtype (resolved): under bfloat16 autocast the matmuls' outputs are
# bfloat16, but the norms and the residual stream stay float32 and autocast keeps bfloat16 copies of float32 inputs,
# so a step measured 0.86-0.96x float32's peak at 4,096-16,384 tokens on this CPU (benchmarks/draft_long_records.py,
# 2026-11-28), not half: 3.5 bytes a value fits it
DRAFT_DTYPE_BYTES = {"float32": 4, "bfloat16": 3.5}
ATTENTION_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # the attention kernel's inputs and output: autocast's dtype


@dataclass
class DraftShape:
    """What init-draft trains, in numbers: parameters (trainable; frozen float32 copies such as EAGLE-3's token
    embedding), the draft's width and heads, its vocabulary, layers, unroll steps and the share of anchors a step
    runs past the first step (--anchor-fraction)."""

    trainable: int
    frozen: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    layers: int
    steps: int
    anchor_fraction: float = 1.0
    reads_policy_embedding: bool = False  # MTP: the draft reads the policy's embedding and lm_head (no copies)


def step_tokens(max_batch_tokens: int, batch_size: int, longest: int) -> int:
    """Tokens of a step's largest micro-batch (init_draft.train_step): records packed (no padding) up to
    --max-batch-tokens, the whole batch when it fits, a record longer than it alone; at most batch_size x longest."""
    return min(batch_size * longest, max(max_batch_tokens, longest))


def draft_step_rows(plan: Plan, d: DraftShape, n_aux: int, target_hidden: int, tokens: int, longest: int,
                    max_batch_tokens: int, draft_dtype: str = "float32") -> None:
    """One training step of the draft over `tokens` packed tokens (records of at most `longest`): its features
    widened to float32, the hidden activations of every unroll step and layer (DRAFT_ACTIVATION_H x H + 3 I values a
    token; DRAFT_DTYPE_BYTES each: fewer under --draft-dtype bfloat16's autocast), the logits over its vocabulary
    (float32: the loss widens them) and the fused attention's own (attention_bytes): every row linear in the tokens,
    none in `longest` x tokens. Steps after the first run at the sampled anchors only."""
    vb = DRAFT_DTYPE_BYTES[draft_dtype]
    steps = 1 + (d.steps - 1) * d.anchor_fraction  # unroll steps, counted at full width
    plan.add(f"step features (float32, {tokens} tokens packed)", 4 * tokens * (n_aux + 1) * target_hidden)
    plan.add(f"draft activations ({draft_dtype}, {d.steps} unroll steps x {d.layers} layer(s))",
             int(vb * tokens * steps * d.layers * (DRAFT_ACTIVATION_H * d.hidden + 3 * d.intermediate)))
    plan.add(f"draft logits ({d.vocab} vocab, --max-batch-tokens {max_batch_tokens})",
             4 * tokens * d.vocab * (DRAFT_LOGIT_COPIES * steps * d.anchor_fraction + DRAFT_LOGIT_TRANSIENT))
    plan.add(f"fused attention (linear in the {longest}-token longest record)", attention_bytes(d, tokens, draft_dtype))


@dataclass
class RefreshStep:
    """The online refresh's largest draft step: its bytes, the tokens of its largest micro-batch, and the longest
    sequence's, below which no --max-batch-tokens shrinks it (a longer sequence trains alone)."""

    nbytes: int
    tokens: int
    longest: int


def refresh_step(d: DraftShape, n_aux: int, target_hidden: int, tokens: int, longest: int) -> RefreshStep:
    """The online refresh's draft step over `tokens` packed tokens (its largest micro-batch, ttt.micro_batches; float32,
    every anchor): the rows draft_step_rows counts for init-draft's step, which runs the same loss."""
    step = Plan("", 0.0)
    draft_step_rows(step, d, n_aux, target_hidden, tokens, longest, tokens)
    return RefreshStep(int(step.used_gib * GIB), tokens, longest)


def add_refresh_step(plan: Plan, step: RefreshStep | None, activations: int, setting: str) -> None:
    """The refresh's step runs between policy steps, when the policy's activations are freed: what it needs beyond
    them, and whether `setting` (its micro-batch budget) can shrink it."""
    if step is None:
        return
    how = (f"{step.tokens} tokens packed: {setting} shrinks it" if step.tokens > step.longest else
           f"one {step.longest}-token sequence alone: no {setting} shrinks it")
    plan.add(f"draft refresh step beyond the policy's activations ({how})", max(0, step.nbytes - activations))


def eval_tokens(max_batch_tokens: int, batch_size: int, longest: int) -> int:
    """Tokens of a held-out evaluation batch (init_draft's `heldout`): whole records of at most `longest` up to
    --max-batch-tokens (at least one), at most batch_size of them."""
    return max(1, min(batch_size, max_batch_tokens // longest)) * longest


def eval_bytes(d: DraftShape, vocab: int, policy_bytes: float, tokens: int) -> int:
    """Held-out evaluation over `tokens` (ttt.heldout_metrics + loss.acceptance_metrics, every --save-every; no
    gradients, so the step's rows are freed by then): the policy's full-vocabulary logits [B, T, V] in its dtype, the
    float32 copy logsumexp reads and its exp temporary, and float32 [B, T, Vd] rows: the draft's logits of every
    unroll step and the policy's probabilities on the draft vocabulary."""
    return int(tokens * (vocab * (policy_bytes + 8) + 4 * d.vocab * (1 + d.steps)))


def eval_row(plan: Plan, step_rows_gib: float, d: DraftShape, vocab: int, policy_bytes: float, tokens: int) -> None:
    """What held-out evaluation needs beyond the training step's rows (`step_rows_gib`, freed by then): the peak is the
    larger of the two (evaluation's at --ttt-steps 1 or few anchors and a large vocabulary)."""
    plan.add(f"held-out evaluation beyond the step ({tokens} tokens, full-vocabulary policy logits)",
             max(0.0, eval_bytes(d, vocab, policy_bytes, tokens) - step_rows_gib * GIB))


def attention_bytes(d: DraftShape, tokens: int, draft_dtype: str = "float32") -> int:
    """What the draft's fused attention adds over `tokens` packed tokens beyond the activations' q, k, v and output:
    per unroll step (every step runs the kernel over all of the record's positions, sampled anchors or not) and
    layer the kernel's padded queries, keys, values and output (DRAFT_ATTENTION_KEPT x H values a token in the
    compute dtype) and its float32 log-sum-exp per head; in backward one step's and layer's float32 gradients.
    Linear in `tokens`, whatever the records' lengths."""
    kept = 4 * d.heads + ATTENTION_DTYPE_BYTES[draft_dtype] * DRAFT_ATTENTION_KEPT * d.hidden
    return int(tokens * (kept * d.steps * d.layers + 4 * DRAFT_ATTENTION_TRANSIENT * d.hidden))


def init_draft_plans(config, d: DraftShape, *, total_bytes: int, policy_dtype: str, features: str,
                     max_batch_tokens: int, batch_size: int, longest: int, group_tokens: int,
                     n_aux: int = 3, draft_dtype: str = "float32") -> list[Plan]:
    """init-draft on one GPU, after its harvest's engine has stopped. `online`: one plan, the policy resident beside
    the training draft (features computed per batch, kept on the device). `stream` / `cache`: two phases, the
    policy's feature pass (then the policy is freed but for its output embedding) and the training.
    Feature forwards take up to half of what is free (hidden.batch_tokens), at most `group_tokens` at a time (a
    stream shard; online: a step's records); `longest`: the longest record's tokens (after a harvest: exact;
    before: the longest prompt + --max-tokens); `draft_dtype`: the draft's compute (--draft-dtype, resolved: its
    weights and AdamW stay float32; bfloat16 autocast keeps a bfloat16 copy of its weights, and its activations take
    DRAFT_DTYPE_BYTES a value)."""
    p, v, h = param_count(config), config.vocab_size, config.hidden_size
    wb = ENGINE_DTYPE_BYTES[policy_dtype]
    total = total_bytes / GIB
    tokens = step_tokens(max_batch_tokens, batch_size, longest)
    tied = getattr(config, "tie_word_embeddings", False)

    def base(title: str) -> Plan:
        plan = Plan(f"init-draft memory plan, {title}: {p / 1e9:.2f}B-parameter policy", total)
        plan.add(f"reserve: CUDA context, fragmentation ({RESERVE_SHARE:.0%} of the GPU)", RESERVE_SHARE * total_bytes)
        return plan

    def forward_row(plan: Plan, tokens_cap: int) -> None:
        per = forward_token_bytes(config, n_aux, wb)
        free = total_bytes - plan.used_gib * GIB
        n = min(tokens_cap, MAX_BATCH_TOKENS, max(int(0.5 * free / per), MIN_BATCH_TOKENS))  # hidden.batch_tokens
        plan.add(f"feature forward ({n} tokens; it takes up to half of what is free)", n * per)

    def draft_rows(plan: Plan) -> None:
        plan.add("draft weights + gradients (float32)", 8 * d.trainable)
        plan.add("draft AdamW moments (float32)", DRAFT_ADAMW_BYTES * d.trainable)
        plan.add("draft's frozen token embedding (float32)", 4 * d.frozen)
        plan.add("draft weight copies (bfloat16, autocast)", 2 * d.trainable if draft_dtype == "bfloat16" else 0)

    if features == "online":
        plan = base("--features online")
        plan.add(f"policy weights ({policy_dtype}, resident: --features online)", wb * p)
        draft_rows(plan)
        plan.add("a batch's features on the device (half precision)", 2 * batch_size * longest * (n_aux + 1) * h)
        before = plan.used_gib
        draft_step_rows(plan, d, n_aux, h, tokens, longest, max_batch_tokens, draft_dtype)
        eval_row(plan, plan.used_gib - before, d, v, wb, eval_tokens(max_batch_tokens, batch_size, longest))
        forward_row(plan, batch_size * longest)  # before the step; freed by then, counted beside it (an upper bound)
        return [plan]
    feat = base(f"--features {features}, the feature pass")
    feat.add(f"policy weights ({policy_dtype})", wb * p)
    forward_row(feat, group_tokens)
    train = base(f"--features {features}, training (the policy freed)")
    head = (1 if tied or not d.reads_policy_embedding else 2) * v * h
    plan_head = "embedding and lm_head" if head > v * h else "output embedding (the targets)"
    train.add(f"the policy's {plan_head} ({policy_dtype}, kept)", wb * head)
    draft_rows(train)
    before = train.used_gib
    draft_step_rows(train, d, n_aux, h, tokens, longest, max_batch_tokens, draft_dtype)
    eval_row(train, train.used_gib - before, d, v, wb, eval_tokens(max_batch_tokens, batch_size, longest))
    return [feat, train]


def largest_fitting(fits, below: int, step: int = 256) -> int:
    """The largest multiple of `step` under `below` for which `fits(n)` holds (monotone: fewer fit no worse); 0 if none."""
    lo, hi = 0, (below - 1) // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid - 1)
    return lo * step


def check_init_draft(plans: list[Plan], config, replan, *, policy_dtype: str, features: str, max_batch_tokens: int,
                     dtype_flag: bool = True, draft_dtype: str = "bfloat16") -> None:
    """Refuse init-draft plans that cannot fit, before anything is harvested, naming the settings that would:
    `--dtype bfloat16` (a float32 policy's features), `--features stream` (online keeps the policy beside the
    training), `--max-batch-tokens N` (the largest that fits), alone or together. `replan(**settings)` builds the
    plans again with `policy_dtype`, `features` or `max_batch_tokens` changed; `dtype_flag`: --dtype sets the
    policy's dtype (not for --method mtp); `draft_dtype`: the draft's compute (a float32 one is advised bfloat16 where
    nothing else fits)."""
    if all(p.fits for p in plans):
        return
    dtypes = [policy_dtype] + (["bfloat16"] if policy_dtype == "float32" and dtype_flag else [])
    sources = [features] + (["stream"] if features == "online" else [])
    fixes, found = [], []
    for dt, src in ((dt, src) for dt in dtypes for src in sources):
        def fits(n: int = max_batch_tokens, dt=dt, src=src) -> bool:
            return all(p.fits for p in replan(policy_dtype=dt, features=src, max_batch_tokens=n))
        flags = ([f"--dtype {dt}"] if dt != policy_dtype else []) + ([f"--features {src}"] if src != features else [])
        if any(set(f) <= set(flags) for f in found):
            continue  # a fix with fewer changes already works
        if flags and fits():
            fixes.append(" with ".join(flags))
            found.append(flags)
        elif n := largest_fitting(fits, max_batch_tokens):
            fixes.append(" with ".join([*flags, f"--max-batch-tokens {n} or less"]))
    weights = min(ENGINE_DTYPE_BYTES[d] for d in dtypes) * param_count(config) / GIB
    if fixes:
        advice = "use " + "; or ".join(fixes)
    elif weights + RESERVE_SHARE * plans[0].total_gib > plans[0].total_gib:
        advice = (f"the policy's weights alone take {weights:.1f} GiB in {min(dtypes, key=ENGINE_DTYPE_BYTES.get)}: "
                  "use a GPU with more memory")
    else:
        advice = ("no --dtype, --features or --max-batch-tokens fits it: the draft's activations and logits over the "
                  "longest record (alone in its micro-batch) are what remain; "
                  + ("use --draft-dtype bfloat16 (on a GPU with bfloat16 units), " if draft_dtype == "float32" else "")
                  + "lower --ttt-steps, --anchor-fraction or --draft-vocab-size, harvest shorter records (--max-tokens), "
                  "or use a GPU with more memory")
    bad = next(p for p in plans if not p.fits)
    text = "\n".join(p.text() for p in plans)
    raise SpectoolError(f"{text}\ninit-draft cannot fit {bad.title.split(': ')[0].split(', ', 1)[1]} on this GPU: "
                        f"{advice}")
