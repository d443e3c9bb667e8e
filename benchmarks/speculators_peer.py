"""Peer run: speculators 0.9's own DFlash module and loss (the vLLM project's draft library), trained
on the same harvest, draft vocabulary, block size, depth and budget (records x epochs, batch) as a
spectool DFlash draft, saved in speculators' format and served by the same engine. Prints the
training time of both and writes the peer folder, which parallel_drafters.sh then sweeps.

    .venv/bin/python benchmarks/speculators_peer.py HARVEST_RUN SPECTOOL_DFLASH_DRAFT OUT_FOLDER

On this CPU speculators needs draft_attn_impl="eager" and loss_implementation="eager" (flex
attention has no CPU backward, the fused losses are Triton kernels). It reads the policy's last
hidden state before the final norm (it applies the norm itself), so that state is computed here
with one policy forward per record (spectool's cache keeps the normed one); its aux layers are
spectool's (the same vLLM convention). Its config is saved with sliding_window_non_causal: true,
so vLLM serves the full-attention blocks non-causally, as speculators trains them (left at its
default, vLLM would serve them causal: review parallel-drafters.md, trap 1).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch


def main(harvest: str, spectool_draft: str, out: str) -> None:
    from speculators.losses.utils import resolve_loss_config
    from speculators.models.dflash.core import DFlashDraftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from spectool.draft.checkpoint import load_draft
    from spectool.draft.vocab import ids_from_d2t
    from spectool.hidden import load_features, policy_features
    from spectool.models import resolve_model
    from spectool.records import load_records
    from spectool.runs import read_json

    draft, meta = load_draft(Path(spectool_draft))
    c = draft.config
    run = read_json(Path(spectool_draft) / "init_draft.json")
    model = resolve_model(meta["policy"])
    policy = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval()
    vc = AutoConfig.from_pretrained(model.path)
    vc.num_hidden_layers = c.num_hidden_layers  # speculators: the draft's depth travels in the verifier config
    target = ids_from_d2t(draft.d2t)
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
    t2d[target] = True
    torch.manual_seed(run["seed"])
    peer = DFlashDraftModel.from_training_args(
        vc, t2d=t2d, d2t=draft.d2t.clone(), draft_vocab_size=c.draft_vocab_size, block_size=run["ttt_steps"] + 1,
        verifier_name_or_path=model.path, target_layer_ids=list(c.aux_layer_ids), mask_token_id=c.mask_token_id,
        draft_attn_impl="eager")
    loss_config = resolve_loss_config("kl_div", "eager")

    records = load_records(Path(harvest))
    shards = sorted((Path(harvest) / "hidden").glob("shard-*.safetensors"))
    items = [x for s in shards for x in load_features(s)]  # (ids, aux, last) per record, vLLM's aux convention
    n_layers = policy.config.num_hidden_layers
    import hashlib

    held = [int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) % 1000 < run["eval_fraction"] * 1000
            for p in records["prompt_id"]]  # init-draft's split: the same training records
    train = [i for i, h in enumerate(held) if not h]
    opt = torch.optim.AdamW([p for p in peer.parameters() if p.requires_grad], lr=run["lr"], weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train) / run["batch_size"])
    total = steps_per_epoch * run["epochs"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / run["warmup_steps"])
                                              * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    peer.train()
    seconds, step, tokens = 0.0, 0, 0
    for epoch in range(run["epochs"]):
        g = torch.Generator().manual_seed(run["seed"] * 1000 + epoch)
        order = [train[i] for i in torch.randperm(len(train), generator=g).tolist()]
        for b in range(0, len(order), run["batch_size"]):
            batch = order[b : b + run["batch_size"]]
            ids = [items[i][0] for i in batch]
            with torch.no_grad():  # the pre-norm last hidden state speculators wants, one record at a time
                pre = [policy_features(policy, x[None], [n_layers])[0][0] for x in ids]
            packed = torch.cat(ids)[None]  # [1, total]
            aux = torch.cat([items[i][1].float() for i in batch])[None]
            loss_mask = torch.cat([torch.tensor([0] * len(p) + [1] * len(r)) for p, r in
                                   zip((records[i]["prompt_ids"] for i in batch), (records[i]["response_ids"] for i in batch))])[None]
            doc = torch.cat([torch.full((len(x),), j) for j, x in enumerate(ids)])[None]
            pos = torch.cat([torch.arange(len(x)) for x in ids])[None]
            t0 = time.perf_counter()  # the peer's own step only (the pre-norm states are an adapter's cost)
            _, loss, _ = peer(aux, packed, loss_mask, torch.cat(pre)[None], doc, position_ids=pos,
                              loss_config=loss_config, max_anchors=512)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            seconds += time.perf_counter() - t0
            step, tokens = step + 1, tokens + packed.shape[1]
            if step % 25 == 0:
                print(f"speculators peer: step {step}/{total} loss {float(loss):.3f}", flush=True)
    peer.save_pretrained(out)
    cfg_path = Path(out) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["sliding_window_non_causal"] = True  # served as trained: non-causal blocks
    cfg_path.write_text(json.dumps(cfg, indent=2))
    mine = read_json(Path(spectool_draft) / "manifest.json")["result"]
    result = {"steps": step, "train_tokens_per_s": tokens / seconds, "spectool_steps": mine["steps"],
              "spectool_train_tokens_per_s": mine["train_tokens_per_s"],
              "speed_ratio_speculators_to_spectool": tokens / seconds / mine["train_tokens_per_s"]}
    (Path(out) / "peer.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
