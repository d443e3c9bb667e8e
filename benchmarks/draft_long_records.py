"""One draft training step (forward, backward, AdamW) on long records: peak memory and step time at 1k, 4k, 8k and 16k
tokens, the draft's fused attention (model.prefix_attention: scaled_dot_product_attention, no [queries x keys]
scores) against the attention it replaced (the scores materialised in float32 per unroll step and layer, copied
below from the commit before), and the fused attention under bfloat16 autocast (--draft-dtype bfloat16).

The policy is a random tiny Llama with a 32k-token position limit (4 layers, hidden 128, 4 heads over 2 KV heads);
its features are computed once per length in the parent and saved; each point runs in a fresh process and measures
the growth of its peak resident set over one step (memory_plan.growth_bytes), then times a second step. The
materialised arm is not run where its scores alone (the old plan: 1.5 copies a unroll step and 2 more) would take
more than half of the memory the host has free: it prints "does not fit" with those planned bytes.
Linear memory means a flat peak per token across the lengths.

  PYTHONPATH=src python benchmarks/draft_long_records.py [--lengths 1024,4096,8192,16384] [--out benchmarks/data/...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from memory_plan import growth_bytes  # benchmarks/ is on the path of a script run from it

HIDDEN, LAYERS, HEADS, KV, INTER, VOCAB, DRAFT_VOCAB = 128, 4, 4, 2, 256, 512, 256
PROMPT, STEPS, MAX_POSITIONS = 64, 5, 32768
ARMS = ("materialised", "fused", "fused-bf16")
GIB = 1024**3


def policy():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HIDDEN // HEADS,
                      max_position_embeddings=MAX_POSITIONS, rope_theta=10000.0)
    cfg._attn_implementation = "sdpa"  # the features' forward at 16k tokens without [T, T] scores
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


# --- the attention before the fused one (src/spectool/draft/model.py at b45b7d1), the "materialised" arm ----------


def materialised_attention(a, x, pos, kv, mask, inv_freq, out=slice(None)):
    """The replaced chain_attention: scores [B, heads, n, T] in float32 for every unroll step and layer."""
    from spectool.draft.model import rope

    B, n, _ = x.shape
    rep, scale = a.nh // a.nkv, a.hd**-0.5
    k = rope(a.k_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2), pos, inv_freq).repeat_interleave(rep, dim=1)
    v = a.v_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2).repeat_interleave(rep, dim=1)
    xq, mask = x[:, out], mask[out]
    n = xq.shape[1]
    q = rope(a.q_proj(xq).view(B, n, a.nh, a.hd).transpose(1, 2), pos[out], inv_freq)  # [B, nh, n, hd]
    if kv["k0"] is None:
        kv["k0"], kv["v0"] = k, v  # [B, nh, T, hd]
    else:
        kv["k"].append(k)
        kv["v"].append(v)
    T = kv["k0"].shape[2]
    s0 = ((q @ kv["k0"].transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))  # [B, nh, n, T]
    diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in kv["k"]]  # each [B, nh, n, 1]
    w = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1)
    o = w[..., :T] @ kv["v0"]
    for i, vv in enumerate(kv["v"]):
        o = o + w[..., T + i : T + i + 1] * vv
    return a.o_proj(o.transpose(1, 2).reshape(B, n, a.nh * a.hd))


def materialised_unroll(self, aux, input_ids, steps, start=0, anchors=None, segments=None):
    """The replaced Eagle3Draft.unroll (EAGLE-3 chain), with its [T, T] causal mask (one record a row: `segments`,
    a packed row's records, is not read)."""
    from spectool.draft.model import anchor_rows

    B, T, _ = aux.shape
    layers = [self.midlayer, *self.layers.values()]
    causal = torch.ones(T, T, dtype=torch.bool, device=aux.device).tril()  # [T, T]
    keys = [{"k0": None, "v0": None, "k": [], "v": []} for _ in layers]
    rows, every = anchor_rows(start, anchors), torch.arange(T, device=aux.device)
    h = self.fc(aux)
    logits = []
    for j in range(steps):
        at = rows if j else slice(None)
        ids = F.pad(input_ids[:, j + 1 :], (0, j + 1), value=0)[:, at]
        pos = every[at] + j
        resid = h
        x = torch.cat([self.midlayer.input_layernorm(self.embed_tokens(ids)), self.midlayer.hidden_norm(h)], -1)
        for i, (layer, kv) in enumerate(zip(layers, keys)):
            if i > 0:
                x = layer.input_layernorm(resid)
            out = rows if not j and i == len(layers) - 1 else slice(None)
            r = materialised_attention(layer.self_attn, x, pos, kv, causal[at], self.inv_freq, out) + resid[:, out]
            resid = layer.mlp(layer.post_attention_layernorm(r)) + r
        h = resid
        logits.append(self.lm_head(self.norm(h)))
    return logits


def materialised_scores_bytes(T: int) -> int:
    """The old plan's scores: heads x T x T float32, 1.5 copies a unroll step and layer and 2 more."""
    return int(4 * HEADS * T * T * (1.5 * STEPS + 2))


# --- one point, in a fresh process ---------------------------------------------------------------------------------


def one(arm: str, T: int, features: str) -> dict:
    from safetensors.torch import load_file

    from spectool.draft.checkpoint import new_draft
    from spectool.draft.model import Eagle3Draft
    from spectool.draft.ttt import ttt_step_loss
    from spectool.hidden import default_aux_layer_ids
    from spectool.memory import GIB, DraftShape, Plan, draft_step_rows
    from spectool.precision import draft_autocast

    f = load_file(features)
    items = [(f["ids"], f["aux"], f["last"])]
    pol = policy()
    torch.manual_seed(0)
    target_ids = torch.arange(DRAFT_VOCAB)
    draft = new_draft(pol, target_ids, default_aux_layer_ids(LAYERS), 1)
    if arm == "materialised":
        draft.unroll = materialised_unroll.__get__(draft, Eagle3Draft)
    W = pol.get_output_embeddings().weight[target_ids].float()  # [Vd, H]
    del pol
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4)
    dtype = "bfloat16" if arm.endswith("bf16") else "float32"

    def step() -> None:
        with draft_autocast(dtype, "cpu"):
            loss, _ = ttt_step_loss(draft, items, [PROMPT], W, STEPS, 0.8, "cpu", "mix", 1.0)
        loss.backward()
        opt.step()
        opt.zero_grad()

    grown = growth_bytes(step)
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    plan = Plan("step", 1e9)
    shape = DraftShape(trainable, 0, HIDDEN, INTER, HEADS, DRAFT_VOCAB, 1, STEPS, 1.0)
    draft_step_rows(plan, shape, 3, HIDDEN, T, T, T, dtype)
    plan.add("gradients and AdamW", 12 * trainable)
    return {"arm": arm, "T": T, "peak_growth_gib": grown / GIB, "bytes_per_token": grown / T, "step_s": seconds,
            "plan_gib": plan.used_gib if arm != "materialised" else None}


def cpu_name() -> str:
    """The CPU's model name and its bfloat16 units (AMX, AVX512-BF16), from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    return f"{name} ({', '.join(sorted(flags & {'amx_bf16', 'avx512_bf16'})) or 'no bfloat16 units'})"


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,4096,8192,16384")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default=f"benchmarks/data/draft_long_records_{time.strftime('%Y-%m-%d')}.json")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.one[2])))
        return
    from safetensors.torch import save_file

    from spectool.hidden import default_aux_layer_ids, feature_items

    lengths, arms = [int(x) for x in a.lengths.split(",")], a.arms.split(",")
    pol, rows = policy(), []
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "memory_available_gib": available_bytes() / GIB}
    print(f"{'arm':<13} {'T':>6} {'peak GiB':>9} {'B/token':>9} {'vs 1st':>7} {'step s':>8} {'plan GiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for T in lengths:
            g = torch.Generator().manual_seed(T)
            ids = torch.randint(0, VOCAB, (T,), generator=g).tolist()
            ((i, aux, last),) = feature_items(pol, [ids], default_aux_layer_ids(LAYERS), max_tokens=T)
            path = f"{tmp}/features-{T}.safetensors"
            save_file({"ids": i, "aux": aux, "last": last}, path)
            for arm in arms:
                planned = materialised_scores_bytes(T)
                if arm == "materialised" and planned > 0.5 * available_bytes():
                    r = {"arm": arm, "T": T, "fits": False, "planned_scores_gib": planned / GIB}
                    print(f"{arm:<13} {T:>6}  does not fit: its scores alone are planned at {planned / GIB:.1f} GiB "
                          f"(the host has {available_bytes() / GIB:.1f} GiB free)", flush=True)
                    rows.append(r)
                    continue
                run = subprocess.run([sys.executable, __file__, "--one", arm, str(T), path], capture_output=True,
                                     text=True)
                if run.returncode:
                    sys.exit(f"{arm} at {T} tokens failed:\n{run.stderr[-3000:]}")
                out = run.stdout
                r = json.loads(out.strip().splitlines()[-1]) | {"fits": True}
                first = next((x for x in rows if x["arm"] == arm and x.get("fits")), r)
                r["per_token_vs_first"] = r["bytes_per_token"] / first["bytes_per_token"]
                rows.append(r)
                plan = f"{r['plan_gib']:9.2f}" if r["plan_gib"] is not None else f"{'-':>9}"
                print(f"{arm:<13} {T:>6} {r['peak_growth_gib']:9.2f} {r['bytes_per_token']:9.0f} "
                      f"{r['per_token_vs_first']:7.2f} {r['step_s']:8.2f} {plan}", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"machine": machine, "shape": {
        "policy": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV, "max_positions": MAX_POSITIONS},
        "draft": "one EAGLE-3 layer of the policy's width", "draft_vocab": DRAFT_VOCAB, "unroll_steps": STEPS,
        "prompt": PROMPT, "records_per_step": 1}, "rows": rows}, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
