"""init-draft --recompute-loss: peak memory and time of one training forward + backward with each unroll step's
loss kept for the backward or recomputed in it, on a tiny random draft (hidden 32, 4 heads over 2 KV heads, 3 steps)
whose draft vocabulary is large against its width, as a real draft's is (Qwen3-8B: 32k over 4,096). Each point runs
in a fresh process and reports the growth of its peak resident set over the step.

  PYTHONPATH=src python benchmarks/loss_recompute.py [--families eagle3,dflash] [--length 8192] [--vocab 4096]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time


def point(family: str, length: int, vocab: int, recompute: bool) -> str:
    import torch

    from spectool.draft.dflash import DFlashConfig, DFlashDraft
    from spectool.draft.model import DraftConfig, Eagle3Draft
    from spectool.draft.ttt import ttt_step_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    H = 32
    base = dict(hidden_size=H, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                vocab_size=vocab, draft_vocab_size=vocab, target_hidden_size=H, aux_layer_ids=[1, 2, 3])
    d = (DFlashDraft(DFlashConfig(**base, mask_token_id=vocab - 1)) if family == "dflash"
         else Eagle3Draft(DraftConfig(**base)))
    g = torch.Generator().manual_seed(0)
    items = [(torch.randint(0, vocab - 1, (length,), generator=g), torch.randn(length, 3 * H, generator=g),
              torch.randn(length, H, generator=g))]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    loss, _ = ttt_step_loss(d, items, [16], torch.randn(vocab, H), 3, 0.8, "cpu", "mix", recompute=recompute)
    loss.backward()
    seconds = time.perf_counter() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return f"| {family} | {length:,} | {vocab:,} | {'recomputed' if recompute else 'kept'} | {grown:,.0f} | {seconds:.2f} |"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="eagle3,dflash")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--point", nargs=4, help=argparse.SUPPRESS)  # family length vocab recompute: one child process
    a = ap.parse_args()
    if a.point:
        print(point(a.point[0], int(a.point[1]), int(a.point[2]), a.point[3] == "1"))
        return
    print("| family | record | draft vocab | step losses | peak growth MiB | step s |\n|---|---:|---:|---|---:|---:|")
    for family in a.families.split(","):
        for recompute in ("0", "1"):
            out = subprocess.run([sys.executable, __file__, "--point", family, str(a.length), str(a.vocab), recompute],
                                 capture_output=True, text=True, check=True)
            print(out.stdout.strip())


if __name__ == "__main__":
    main()
