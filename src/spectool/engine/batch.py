"""The batch an engine decodes at once: at most what vLLM itself would pick on this device, with the token budget a
parallel drafter needs on the builds that carve its draft slots out of it (compat.batch_defaults, compat.draft_slots).

vLLM's `LLM` picks 1,024 sequences and 16,384 batched tokens a step on a GPU of 70 GiB or more that is not an A100,
256 and 8,192 on any other GPU. A run's batch above that is queued by the scheduler, not refused: spectool never asks
for more sequences than vLLM would pick, since each one preallocates rows of the drafter logits
[max_num_seqs, k, vocab] and of `output_bin_counts` [max_num_seqs, vocab] (memory.py).

On GPU builds before 0.33 a parallel drafter (P-EAGLE, DFlash, DSpark) takes (k - 1) x max_num_seqs slots out of the
scheduler's budget (max_num_batched_tokens): at 1,024 sequences and k = 9 on an 8,192-token budget nothing is left and
vLLM refuses to start; at k = 8 about 113 sequences decode a step. There spectool passes max_num_batched_tokens
explicitly, vLLM's default plus the slots, so the scheduler keeps vLLM's own budget (as 0.33, which takes no slots,
does). A budget the caller set (`extra`, or TRL's 4,096) is kept, and the sequences cut to what it holds a whole
decode step for (1 + k tokens each, after their slots); one that holds none is refused naming --k.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectool.engine.compat import batch_defaults, draft_slots
from spectool.errors import SpectoolError


@dataclass(frozen=True)
class Device:
    """What vLLM reads of the device to pick its batch: torch's name for it and its memory (vLLM reads GPU 0)."""

    name: str = ""
    total_bytes: int = 0


def this_device() -> Device:
    """This process's GPU 0 as vLLM's batch defaults read it; an empty Device (vLLM's small defaults, as vLLM does
    when it cannot ask) where there is none to ask."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    if not torch.cuda.is_available():
        return Device()
    props = torch.cuda.get_device_properties(0)
    return Device(props.name, props.total_memory)


@dataclass(frozen=True)
class Batch:
    max_num_seqs: int  # the most sequences decoded at once (the rest of a run's batch is queued)
    max_num_batched_tokens: int | None  # passed to vLLM (None: vLLM's default, `scheduled_tokens`)
    scheduled_tokens: int  # the scheduler's token budget a step, after a parallel drafter's slots
    draft_slots: int = 0  # slots per sequence the build takes for drafting (compat.draft_slots)

    def kwargs(self) -> dict[str, int]:
        out = {"max_num_seqs": self.max_num_seqs}
        if self.max_num_batched_tokens is not None:
            out["max_num_batched_tokens"] = self.max_num_batched_tokens
        return out

    def note(self, batch: int) -> str:
        """One line for a memory plan: the sequences at once and the token budget, and why."""
        queued = f" (the batch of {batch} is queued)" if batch > self.max_num_seqs else ""
        text = f"max_num_seqs {self.max_num_seqs}{queued}"
        if self.draft_slots and self.max_num_batched_tokens is not None:
            text += (f"; max_num_batched_tokens {self.max_num_batched_tokens}: {self.scheduled_tokens} for the scheduler "
                     f"after {self.draft_slots} draft slots x {self.max_num_seqs} sequences (a parallel drafter on this "
                     "build)")
        return text


def engine_batch(batch: int | None, *, method: str, k: int, cpu: bool, build: tuple[str, bool],
                 device: Device | None = None, tensor_parallel_size: int = 1,
                 batched_tokens: int | None = None) -> Batch:
    """The engine's batch for a run of `batch` sequences (None: as many as vLLM would pick), drafting with `method` at
    `k` (0: plain decoding) on `build` (version, is the CPU build) and `device` (GPU builds), under a token budget
    `batched_tokens` a caller set (None: vLLM's default for the device)."""
    seqs_default, tokens_default = batch_defaults(cpu, (device or Device()).name, (device or Device()).total_bytes,
                                                  tensor_parallel_size)
    tokens = batched_tokens or tokens_default
    seqs = min(batch or seqs_default, seqs_default, tokens)  # vLLM refuses max_num_seqs > max_num_batched_tokens
    slots = draft_slots(method, k, build) if k else 0
    if not slots:
        return Batch(seqs, batched_tokens, tokens)
    if batched_tokens is None:  # vLLM's budget left to the scheduler, the draft slots on top of it
        return Batch(seqs, tokens + slots * seqs, tokens, slots)
    fit = batched_tokens // (slots + 1 + k)  # sequences whose decode step (1 + k tokens) fits after their slots
    if fit < 1:
        raise SpectoolError(
            f"vLLM {build[0]} takes {slots} draft slots per sequence out of the token budget for {method} at k={k} "
            f"(max_num_batched_tokens {batched_tokens} set for this engine), which leaves no room for one sequence's "
            f"decode step: lower --k (train-rl: speculation.k), or raise max_num_batched_tokens to at least "
            f"{slots + 1 + k}")
    seqs = min(seqs, fit)
    return Batch(seqs, batched_tokens, batched_tokens - slots * seqs, slots)
