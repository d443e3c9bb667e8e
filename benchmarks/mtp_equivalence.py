"""Is SmolLM2 served as MiMo (a Qwen2 trunk with zero q/k/v biases, plus an MTP layer) still SmolLM2?

Converts the embedded SmolLM2-135M with `tests/mimo.py`'s `add_mtp_layers` (once), then compares
the two folders on the same prompts: transformers logits (max |diff|), the plain vLLM engine's
greedy completions (identical tokens?) and the vLLM engine's logprobs of sampled completions
(max |diff|). Prints one JSON line; exits 1 when they differ.

  .venv/bin/python benchmarks/mtp_equivalence.py --out runs/mtp/smollm2-mimo
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default="runs/mtp/smollm2-mimo")
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the converter is a test helper
    from mimo import add_mtp_layers
    from spectool.data import load_source
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from spectool.models import resolve_model
    from spectool.prompts import encode_prompt

    src = resolve_model(a.model)
    out = Path(a.out)
    if not (out / "config.json").exists():
        add_mtp_layers(src.path, out)
    tok = AutoTokenizer.from_pretrained(src.path)
    prompts = [encode_prompt(tok, t.messages) for t in load_source("gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,"
                                                                 "max_digits=1", seed=0).tasks("eval", a.n_prompts)]
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        la = AutoModelForCausalLM.from_pretrained(src.path).eval()(ids).logits
        lb = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    hf_diff = float((la - lb).abs().max())
    runs = {}
    for name, path in (("llama", src.path), ("mimo", str(out))):
        with Engine(EngineConfig(model_path=path, seed=0)) as eng:
            greedy, _ = eng.generate(prompts, Sampling(max_tokens=a.max_tokens, temperature=0.0))
            sampled, _ = eng.generate(prompts, Sampling(max_tokens=a.max_tokens, temperature=1.0, seed=1))
            runs[name] = {"greedy": [c[0].response_ids for c in greedy], "sampled": [c[0].response_ids for c in sampled],
                          "lp": [c[0].logprobs for c in sampled]}
            if name == "mimo":  # the MiMo engine's logprobs of the Llama engine's samples
                cross = eng.sequence_logprobs(prompts, runs["llama"]["sampled"])
    same_greedy = runs["llama"]["greedy"] == runs["mimo"]["greedy"]
    lp_diff = max(abs(x - y) for a_, b_ in zip(runs["llama"]["lp"], cross) for x, y in zip(a_, b_))
    result = {"transformers_max_logit_diff": hf_diff, "vllm_greedy_identical": same_greedy,
              "vllm_max_logprob_diff": lp_diff, "tokens_compared": sum(map(len, cross)), "model": str(out)}
    print(json.dumps(result))
    return 0 if same_greedy and lp_diff < 1e-3 and hf_diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
