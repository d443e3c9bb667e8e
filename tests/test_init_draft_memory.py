"""init-draft's one-GPU memory plan (memory.init_draft_plans, check_init_draft; commands/init_draft_inputs.check_memory):
arithmetic at Qwen3-8B, 14B and 32B shapes (config objects, no weights) on stand-in 40 and 80 GiB devices, refusals
that name the flag and whose advice fits, the refusal before anything is harvested; and features served by a
bfloat16 policy training the same draft as a float32 one's, within a stated tolerance."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen3Config  # at collection: its import (seconds) is no test's cost

from spectool.draft.checkpoint import draft_shape

GIB = 1024**3
# Qwen3 dense shapes (hidden, intermediate, layers, heads; 8 KV heads of 128, vocabulary 151,936)
SHAPES = {"8b": (4096, 12288, 36, 32), "14b": (5120, 17408, 40, 40), "32b": (5120, 25600, 64, 64)}
DEFAULTS = dict(max_batch_tokens=8192, batch_size=4, group_tokens=32768)  # init-draft's defaults


def _qwen3(size: str):
    h, i, n, heads = SHAPES[size]
    return Qwen3Config(hidden_size=h, intermediate_size=i, num_hidden_layers=n, num_attention_heads=heads,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False)


def _replan(config, gpu_gib: int, longest: int):
    from spectool.memory import init_draft_plans

    shape = draft_shape(config, "eagle3", 4096, 1, 5, 1.0)  # init-draft's default draft

    def replan(policy_dtype: str, features: str, max_batch_tokens: int = DEFAULTS["max_batch_tokens"]):
        return init_draft_plans(config, shape, total_bytes=gpu_gib * GIB, policy_dtype=policy_dtype, features=features,
                                max_batch_tokens=max_batch_tokens, batch_size=DEFAULTS["batch_size"], longest=longest,
                                group_tokens=DEFAULTS["group_tokens"])
    return replan


def test_the_stand_in_shapes_count_as_qwen3_does():
    from spectool.memory import param_count

    assert [round(param_count(_qwen3(s)) / 1e9, 2) for s in SHAPES] == [8.19, 14.77, 32.76]
    d = draft_shape(_qwen3("8b"), "eagle3", 4096, 1, 5, 1.0)  # fc 3H x H, one layer (2H in), lm_head 4096 x H
    assert d.trainable == 3 * 4096 * 4096 + (2 * 4096 * (4096 + 2 * 1024) + 4096 * 4096) + 3 * 4096 * 12288 \
        + 4096 * 4096 + 4 * 4096
    assert d.frozen == 151936 * 4096  # the float32 token embedding copy


# (shape, GPU GiB, --features, the policy's dtype, longest record, None = fits | the advice the refusal gives); a
# float32 draft (--draft-dtype float32: the plan's larger case)
CASES = [
    ("8b", 80, "online", "bfloat16", 640, None),
    ("8b", 80, "stream", "float32", 4396, None),
    ("8b", 40, "online", "float32", 640, "use --features stream; or --dtype bfloat16"),
    ("8b", 80, "online", "bfloat16", 4396, None),  # refused while the attention materialised its scores
    ("8b", 40, "stream", "bfloat16", 4396, None),  # refused then whatever the flags
    ("8b", 40, "online", "bfloat16", 4396, "use --max-batch-tokens 4352 or less; or --features stream"),
    ("8b", 40, "stream", "bfloat16", 32768, "use --draft-dtype bfloat16"),
    ("8b", 80, "stream", "bfloat16", 16384, None),  # 16k-token records
    ("8b", 80, "online", "bfloat16", 16384, "use --features stream"),
    ("14b", 80, "online", "bfloat16", 640, None),
    ("14b", 40, "stream", "bfloat16", 640, None),
    ("14b", 40, "stream", "float32", 640, "use --dtype bfloat16"),
    ("14b", 40, "online", "bfloat16", 640, "use --features stream"),
    ("14b", 80, "stream", "bfloat16", 4396, None),
    ("14b", 80, "online", "bfloat16", 16384, "lower --ttt-steps, --anchor-fraction or --draft-vocab-size"),
    ("32b", 80, "stream", "bfloat16", 640, None),
    ("32b", 80, "online", "float32", 640, "use --dtype bfloat16 with --features stream"),
    ("32b", 80, "stream", "float32", 4396, "use --dtype bfloat16"),
    ("32b", 40, "stream", "bfloat16", 640, "weights alone take 61.0 GiB in bfloat16: use a GPU with more memory"),
]


@pytest.mark.parametrize(("size", "gpu", "features", "dtype", "longest", "advice"), CASES)
def test_the_plan_fits_or_refuses_naming_a_flag_whose_advice_fits(size, gpu, features, dtype, longest, advice):
    from spectool.errors import SpectoolError
    from spectool.memory import check_init_draft

    config, replan = _qwen3(size), _replan(_qwen3(size), gpu, longest)
    plans = replan(dtype, features)
    assert len(plans) == (1 if features == "online" else 2)  # stream: the feature pass, then training
    args = dict(policy_dtype=dtype, features=features, max_batch_tokens=DEFAULTS["max_batch_tokens"],
                draft_dtype="float32")
    if advice is None:
        check_init_draft(plans, config, replan, **args)
        assert all(p.fits for p in plans)
        return
    with pytest.raises(SpectoolError) as e:
        check_init_draft(plans, config, replan, **args)
    msg = str(e.value)
    assert "does NOT fit" in msg and advice in msg.splitlines()[-1]
    first = msg.splitlines()[-1].split("use ", 1)[1].split("; or ")[0]
    if "--" in first and "GPU" not in first:  # the first advice, applied, fits
        flags = dict(re.findall(r"--([a-z-]+) (\w+)", first))
        fixed = replan(flags.get("dtype", dtype), flags.get("features", features),
                       int(flags.get("max-batch-tokens", DEFAULTS["max_batch_tokens"])))
        assert all(p.fits for p in fixed)
        if "max-batch-tokens" in flags:  # and it is the largest that does (multiples of 256)
            over = replan(flags.get("dtype", dtype), flags.get("features", features),
                          int(flags["max-batch-tokens"]) + 256)
            assert not all(p.fits for p in over)


def test_the_plan_rows_are_the_arithmetic():
    """Qwen3-8B, bfloat16, online, 80 GiB: the policy's bytes in its dtype, the draft's float32 weights, gradients
    and AdamW, the activations (27 H + 3 I float32 values a token and step), the logits (4 float32 copies a step, 3
    more) and the fused attention (per token, step and layer a float32 log-sum-exp per head and 4 H values; one
    step's 4 H float32 gradients) at a step's packed tokens."""
    from spectool.memory import param_count

    config = _qwen3("8b")
    (plan,) = _replan(config, 80, 640)("bfloat16", "online")
    rows = {k.split(" (")[0]: v * GIB for k, v in plan.rows}
    assert rows["policy weights"] == 2 * param_count(config)
    trainable = 285_229_056
    assert rows["draft weights + gradients"] == 8 * trainable and rows["draft AdamW moments"] == 8 * trainable
    assert "draft weight copies" not in rows  # a float32 draft keeps no bfloat16 copies
    tokens = min(4 * 640, max(8192, 640))  # the whole batch of 4 records fits --max-batch-tokens
    assert rows["draft logits"] == 4 * tokens * 4096 * (4 * 5 + 3)
    assert rows["draft activations"] == 4 * tokens * 5 * (27 * 4096 + 3 * 12288)
    assert rows["fused attention"] == tokens * ((4 * 32 + 4 * 4 * 4096) * 5 + 4 * 4 * 4096)
    float32 = {k.split(" (")[0]: v * GIB for k, v in _replan(config, 80, 640)("float32", "online")[0].rows}
    assert float32["policy weights"] == 2 * rows["policy weights"]


def test_held_out_evaluation_sets_the_peak_where_its_logits_outgrow_the_step():
    """Audit 2026-11c L3: evaluation (every --save-every) builds the policy's full-vocabulary logits [B, T, V]; at
    --ttt-steps 1 on 640-token Qwen3-8B records that is 3.70 GiB against about 1.9 GiB of step rows. The plan holds
    the larger of the two: at the defaults (5 steps) the step's rows and no evaluation row, at 1 step the evaluation's
    bytes by hand."""
    from spectool.memory import init_draft_plans

    config, longest = _qwen3("8b"), 640

    def train_plan(steps: int):
        shape = draft_shape(config, "eagle3", 4096, 1, steps, 1.0)
        plans = init_draft_plans(config, shape, total_bytes=80 * GIB, policy_dtype="bfloat16", features="stream",
                                 longest=longest, **DEFAULTS)
        return {k.split(" (")[0]: v * GIB for k, v in plans[-1].rows}

    assert "held-out evaluation beyond the step" not in train_plan(5)
    rows = train_plan(1)
    step = sum(v for k, v in rows.items() if k.startswith(("step features", "draft activations", "draft logits",
                                                            "fused attention")))
    tokens = 4 * 640  # 4 records of 640 fit --max-batch-tokens 8192
    by_hand = tokens * 151936 * (2 + 4 + 4) + tokens * 4096 * 4 * (1 + 1)  # bf16 logits, f32 copy and exp; Vd rows
    assert abs(by_hand / GIB - 3.70) < 0.01 and by_hand > step  # step: about 1.9 GiB
    assert rows["held-out evaluation beyond the step"] == pytest.approx(by_hand - step, rel=1e-9)


def test_a_bfloat16_draft_plans_its_activations_at_autocasts_bytes_and_keeps_float32_state():
    """--draft-dtype bfloat16: activations at 3.5 bytes a value (autocast keeps the norms and the residual stream in
    float32: measured 0.85-0.96x float32's peak), the attention kernel's values in 2, a bfloat16 copy of the weights
    (autocast's), the weights, gradients and AdamW moments still float32."""
    from spectool.memory import init_draft_plans

    config = _qwen3("8b")
    shape = draft_shape(config, "eagle3", 4096, 1, 5, 1.0)
    rows = {}
    for dtype in ("float32", "bfloat16"):
        (plan,) = init_draft_plans(config, shape, total_bytes=80 * GIB, policy_dtype="bfloat16", features="online",
                                   max_batch_tokens=8192, batch_size=4, longest=4396, group_tokens=32768,
                                   draft_dtype=dtype)
        rows[dtype] = {k.split(" (")[0]: v * GIB for k, v in plan.rows}
    f32, bf16 = rows["float32"], rows["bfloat16"]
    assert bf16["draft activations"] == pytest.approx(f32["draft activations"] * 3.5 / 4)
    assert bf16["draft weights + gradients"] == f32["draft weights + gradients"] == 8 * shape.trainable
    assert bf16["draft AdamW moments"] == f32["draft AdamW moments"]
    assert bf16["draft weight copies"] == 2 * shape.trainable and "draft weight copies" not in f32
    assert bf16["fused attention"] < f32["fused attention"] and bf16["draft logits"] == f32["draft logits"]


def test_the_attention_row_grows_linearly_with_the_record():
    """One record alone in its micro-batch at 4k, 8k and 16k tokens: doubling the record doubles the plan's
    attention (it quadrupled while the scores were materialised) and every other per-step row."""
    from spectool.memory import init_draft_plans

    config = _qwen3("8b")
    shape = draft_shape(config, "eagle3", 4096, 1, 5, 1.0)

    def step_rows(T: int) -> dict[str, float]:
        (plan,) = init_draft_plans(config, shape, total_bytes=80 * GIB, policy_dtype="bfloat16", features="stream",
                                   max_batch_tokens=T, batch_size=1, longest=T, group_tokens=32768)[1:]
        return {k.split(" (")[0]: v for k, v in plan.rows
                if k.split(" (")[0] in ("step features", "draft activations", "draft logits", "fused attention")}

    rows = {T: step_rows(T) for T in (4096, 8192, 16384)}
    assert len(rows[4096]) == 4
    for small, large in ((4096, 8192), (8192, 16384)):
        for name, gib in rows[small].items():
            assert rows[large][name] == pytest.approx(2 * gib), name


def test_online_features_stay_on_the_policys_device(monkeypatch):
    """--features online asks feature_items for features left where the policy computed them (no host round trip)."""
    from spectool import features

    seen = {}
    monkeypatch.setattr(features, "feature_items", lambda *a, **k: seen.update(k) or [])
    features.OnTheFly(None, lambda i: [1, 2], [0]).items([0])
    assert seen == {"on_device": True}


def _stand_in_gpu(monkeypatch, gib: int) -> None:
    """torch sees one CUDA device of `gib` GiB, compute capability 9.0 (no CUDA call reaches the driver)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: SimpleNamespace(total_memory=gib * GIB))


def _weightless_policy(folder, size: str):
    from conftest import make_tokenizer

    _qwen3(size).save_pretrained(folder)  # config.json only: no weights
    make_tokenizer(folder)
    return folder


@pytest.mark.parametrize(("size", "gpu", "dtype", "features", "refused"), [
    ("14b", 40, "float32", "stream", "use --dtype bfloat16"),
    ("32b", 80, "auto", "online", "--features stream"),
    ("8b", 80, "auto", "online", None),
])
def test_init_draft_refuses_before_harvesting(tmp_path, monkeypatch, capsys, size, gpu, dtype, features, refused):
    """On a stand-in GPU, init-draft prints its plan and refuses (naming the flag) before anything is harvested;
    a plan that fits goes on (stopped at the next check). The longest record is bounded before the harvest by the
    data source's longest prompt + --max-tokens."""
    from spectool.commands import init_draft
    from spectool.commands import init_draft_inputs as draft_inputs
    from spectool.config.init_draft import InitDraftConfig
    from spectool.errors import SpectoolError
    from spectool.settings.sampling import SamplingConfig

    policy = _weightless_policy(tmp_path / size, size)
    _stand_in_gpu(monkeypatch, gpu)

    def stop(what: str):
        def fn(*a, **k):
            raise RuntimeError(what)
        return fn

    monkeypatch.setattr(init_draft, "check_speculation", lambda *a, **k: None)  # not under test: vLLM's registry
    monkeypatch.setattr(init_draft, "check_disk_budget", stop("past the plan"))  # what runs next, then Accelerator
    monkeypatch.setattr(draft_inputs, "harvest", stop("harvest reached"))
    cfg = InitDraftConfig(out=str(tmp_path / "out"), model=str(policy), data="gym:chain_sum", dtype=dtype,
                          features=features, harvest=SamplingConfig(n_prompts=8, samples=1, max_tokens=512))
    if refused:
        with pytest.raises(SpectoolError, match=re.escape(refused)):
            init_draft.run(cfg)
    else:
        with pytest.raises(RuntimeError, match="past the plan"):
            init_draft.run(cfg)
        out = capsys.readouterr().out
        assert "init-draft memory plan, --features online" in out and "(fits)" in out
        assert "policy weights (bfloat16, resident" in out  # auto on a GPU: features from a bfloat16 policy
    assert not (tmp_path / "out" / "harvest").exists()


@pytest.fixture
def one_thread():
    """Tiny tensors on one thread: on this 2-core machine, under load, two threads' spin-waits cost ten times the
    work (measured: 20 steps of this test's draft 0.3 s of CPU on one thread, 5 s on two)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_a_bfloat16_served_feature_set_trains_the_same_draft(tiny_policy, one_thread):
    """The draft's features and targets from the policy in bfloat16 (as init-draft serves them on a GPU) against
    float32: stored in half precision either way, they train the same draft (same seed, same batches, init-draft's
    step and evaluation, 12 steps) within the tolerance stated here: every step's loss within 2% (measured on this
    CPU, data seeds 1-3: at most 0.33%), held-out T=1 acceptance (p_accept_sampled) within 0.01 per position
    (measured: at most 0.0008), every trained weight within 3% relative (measured: at most 0.96%)."""
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft
    from spectool.draft.ttt import heldout_metrics, ttt_step_loss
    from spectool.draft.vocab import build_vocab
    from spectool.hidden import default_aux_layer_ids, feature_items

    P, n_train, seed = 8, 24, 1
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(6, 512, (n_train + 4, 40), generator=g).tolist()  # [records, T]: 8 prompt, 32 response ids
    layers = default_aux_layer_ids(4)
    target_ids, _ = build_vocab([x[P:] for x in seqs[:n_train]], 512, 128)
    runs = {}
    for dtype in (torch.float32, torch.bfloat16):
        policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=dtype).eval().requires_grad_(False)
        items = feature_items(policy, seqs, layers)
        assert items[0][1].dtype == torch.float16  # stored in half precision whichever dtype served them
        torch.manual_seed(0)
        draft = new_draft(policy, target_ids, layers, 1)
        W = policy.get_output_embeddings().weight  # [V, H] in the policy's dtype, as init-draft keeps it
        opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0)
        losses = []
        for step in range(12):
            idx = [(4 * step + j) % n_train for j in range(4)]
            loss, _ = ttt_step_loss(draft, [items[i] for i in idx], [P] * 4, W[target_ids].float(), 3, 0.8, "cpu",
                                    "mix")
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        metrics = heldout_metrics(draft, items[n_train:], [P] * 4, W, target_ids, 3, 4, "cpu", walk=False)
        runs[dtype] = losses, metrics, {k: v.detach().clone() for k, v in draft.named_parameters() if v.requires_grad}
    (l32, m32, w32), (l16, m16, w16) = runs[torch.float32], runs[torch.bfloat16]
    assert l32[-1] < 0.8 * l32[0]  # it trained
    assert max(abs(a - b) / a for a, b in zip(l32, l16)) < 0.02
    assert max(abs(a - b) for a, b in zip(m32["p_accept_sampled"], m16["p_accept_sampled"])) < 0.01
    assert max(float((w32[k] - w16[k]).norm() / w32[k].norm()) for k in w32) < 0.03


def _tiny_step_inputs(records: int = 2, T: int = 48, P: int = 8, seed: int = 0):
    """A tiny EAGLE-3 draft (two KV heads for four query heads) and `records` records of T tokens with random
    half-precision features, as init-draft's feature items hold them."""
    from spectool.draft.model import DraftConfig, Eagle3Draft

    torch.manual_seed(seed)
    c = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    vocab_size=256, draft_vocab_size=64, target_hidden_size=64, aux_layer_ids=[1, 2, 3])
    draft = Eagle3Draft(c)
    g = torch.Generator().manual_seed(seed + 1)
    items = [(torch.randint(0, 256, (T,), generator=g), torch.randn(T, 192, generator=g).half(),
              torch.randn(T, 64, generator=g).half()) for _ in range(records)]
    return draft, items, [P] * records, torch.randn(64, 64, generator=g) * 0.5  # W_dv [Vd, H]


@pytest.mark.bf16
def test_a_bfloat16_autocast_step_keeps_float32_weights_and_adamw_within_tolerance(tmp_path, one_thread):
    """init-draft's train_step under --draft-dtype bfloat16 (torch.autocast on this CPU) against float32 from the same
    draft and batch: the parameters, their gradients and AdamW's moments stay float32; the loss differs (the forward
    did run in bfloat16) by less than 0.5% and the updated weights by less than 2% relative (one AdamW step of lr
    1e-3; measured on this CPU over draft seeds 0-4: loss at most 0.003%, weights 0.63-0.73%)."""
    from accelerate import Accelerator

    from spectool.commands.init_draft import train_step
    from spectool.config.init_draft import InitDraftConfig
    from spectool.draft.training import DraftTrainer

    runs = {}
    for dtype in ("float32", "bfloat16"):
        draft, items, prompt_lens, W = _tiny_step_inputs()
        cfg = InitDraftConfig(out=str(tmp_path / dtype), ttt_steps=3, draft_dtype=dtype, loss="mix", anchor_fraction=1.0)
        tr = DraftTrainer(Accelerator(cpu=True), draft, len(items), tmp_path / dtype, batch_size=len(items), epochs=1,
                          lr=1e-3, warmup_steps=1, seed=0)
        before = {k: v.detach().clone() for k, v in tr.unwrapped.named_parameters() if v.requires_grad}
        loss, per_step, _ = train_step(cfg, tr, items, prompt_lens, W, torch.Generator().manual_seed(0))
        params = [p for p in tr.unwrapped.parameters() if p.requires_grad]
        assert all(p.dtype == torch.float32 for p in tr.unwrapped.parameters())
        states = [tr.opt.state[p] for p in params]
        assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
        moved = max(float((p.detach() - before[k]).abs().max()) for k, p in tr.unwrapped.named_parameters()
                    if p.requires_grad)
        assert moved > 0  # the optimizer stepped
        runs[dtype] = loss, {k: v.detach().clone() for k, v in tr.unwrapped.named_parameters() if v.requires_grad}
    (l32, w32), (l16, w16) = runs["float32"], runs["bfloat16"]
    assert l16 != l32  # bfloat16 did compute the forward
    assert abs(l16 - l32) / l32 < 0.005
    assert max(float((w32[k] - w16[k]).norm() / w32[k].norm()) for k in w32) < 0.02


def test_draft_dtype_auto_follows_the_device(monkeypatch):
    """--draft-dtype auto: bfloat16 on a GPU of compute capability 8.0+, float32 below it and on a CPU."""
    from spectool.precision import draft_dtype

    assert draft_dtype("auto") == "float32" and draft_dtype("bfloat16") == "bfloat16"  # this CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, want in (((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert draft_dtype("auto") == want


def test_each_rank_plans_its_share_of_a_batch(tmp_path, monkeypatch, capsys):
    """Under a launcher of 8 processes (WORLD_SIZE), --batch-size 32 is 4 records a rank: the plan's step is 4
    records packed (4 x the longest record), not 32 (which --max-batch-tokens would cap at 8,192)."""
    from spectool.commands import init_draft
    from spectool.config.init_draft import InitDraftConfig
    from spectool.settings.sampling import SamplingConfig

    policy = _weightless_policy(tmp_path / "8b", "8b")
    _stand_in_gpu(monkeypatch, 80)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setattr(init_draft, "check_speculation", lambda *a, **k: None)

    def stop(*a, **k):
        raise RuntimeError("past the plan")

    monkeypatch.setattr(init_draft, "check_disk_budget", stop)  # what runs after the plan
    cfg = InitDraftConfig(out=str(tmp_path / "out"), model=str(policy), data="gym:chain_sum", features="online",
                          batch_size=32, harvest=SamplingConfig(n_prompts=8, samples=1, max_tokens=512))
    with pytest.raises(RuntimeError, match="past the plan"):
        init_draft.run(cfg)
    out = capsys.readouterr().out
    longest = int(re.search(r"linear in the (\d+)-token longest record", out).group(1))
    assert f"step features (float32, {4 * longest} tokens packed)" in out and 4 * longest < 8192
