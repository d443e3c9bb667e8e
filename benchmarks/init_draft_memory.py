"""init-draft's memory plan (memory.draft_step_rows) against one real draft training step, side by side: what one
step's forward and backward add (its float32 features, the draft's activations, logits and attention scores, the
gradients) as the plan predicts it and as measured, over record lengths and draft vocabularies.

On a GPU it measures torch.cuda.max_memory_allocated; on a CPU the peak resident set, each point in a fresh process
(large tensors are mapped and unmapped by the allocator, so the set follows them).

  PYTHONPATH=src python benchmarks/init_draft_memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from memory_plan import growth_bytes  # benchmarks/ is on the path of a script run from it

# (records, tokens each, prompt tokens, draft vocab, unroll steps, anchor fraction, loss)
GRID = [(1, 1024, 64, 2048, 5, 1.0, "mix"), (1, 2048, 64, 2048, 5, 1.0, "mix"), (4, 512, 64, 8192, 5, 1.0, "mix"),
        (1, 2048, 64, 2048, 5, 0.25, "mix"), (2, 1024, 64, 4096, 3, 1.0, "ce")]
H, INTER, HEADS, KV, TARGET_H, V = 256, 768, 8, 2, 256, 8192


def one(records: int, T: int, P: int, vocab: int, steps: int, fraction: float, loss: str) -> dict:
    from spectool.draft.model import DraftConfig, Eagle3Draft
    from spectool.draft.ttt import ttt_step_loss
    from spectool.memory import GIB, DraftShape, Plan, draft_step_rows, step_tokens

    torch.manual_seed(0)
    c = DraftConfig(hidden_size=H, intermediate_size=INTER, num_attention_heads=HEADS, num_key_value_heads=KV,
                    head_dim=H // HEADS, vocab_size=V, draft_vocab_size=vocab, target_hidden_size=TARGET_H,
                    aux_layer_ids=[1, 2, 3], max_position_embeddings=4 * T)
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    draft = Eagle3Draft(c).to(dev)
    items = [(torch.randint(0, V, (T,)), torch.randn(T, 3 * TARGET_H).half(), torch.randn(T, TARGET_H).half())
             for _ in range(records)]
    W = torch.randn(vocab, TARGET_H, device=dev) * 0.05

    def step() -> None:
        out, _ = ttt_step_loss(draft, items, [P] * records, W, steps, 0.8, dev, loss, fraction,
                               torch.Generator().manual_seed(0))
        out.backward()

    grown = growth_bytes(step)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    d = DraftShape(trainable, 0, H, INTER, HEADS, vocab, 1, steps, fraction)
    plan = Plan("step", 1e9)
    tokens = step_tokens(records * T, records, T)
    draft_step_rows(plan, d, 3, TARGET_H, tokens, T, records * T)
    plan.add("gradients", 4 * trainable)
    rows = {k.split(" (")[0]: round(v, 4) for k, v in plan.rows}
    return {"records": records, "T": T, "vocab": vocab, "steps": steps, "anchor_fraction": fraction, "loss": loss,
            "device": dev.type, "plan_gib": round(plan.used_gib, 4), "rows": rows,
            "measured_gib": round(grown / GIB, 4), "measured_over_plan": round(grown / GIB / plan.used_gib, 2)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(one(*[int(x) if x.isdigit() else (float(x) if "." in x else x) for x in sys.argv[2:]])))
        return
    for point in GRID:
        r = subprocess.run([sys.executable, __file__, "--one", *map(str, point)], capture_output=True, text=True, check=True)
        print(r.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
