"""The data-parallel group a trainer runs in (accelerate launch, torchrun: torch.distributed's default
group), as the online draft sees it. One process without a group is a group of one, and every
function here is then the identity. Collectives go through torch.distributed itself (gloo on the
CPU, NCCL on GPUs); nothing here starts processes or groups: the launcher does. The run folder a launch's ranks
share is claimed here too (claim_folder: harvest's replicas, init-draft's processes), refused when some rank does not
see it (a launch across nodes without a shared filesystem).

Every function is a collective: all ranks call it at the same point, in the same order.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import torch
import torch.distributed as dist

from spectool.errors import SpectoolError

T = TypeVar("T")


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


_EXIT_SETTLE_S = 0.2
_settle_registered = False


def _settle_before_exit() -> None:
    """Give torch.distributed's worker threads the GIL before the interpreter finalizes. A gloo worker drops its
    last reference to a collective's tensor after the caller's wait() has returned, and that drop takes the
    GIL; if the main thread is already finalizing by then, the worker thread exits inside a destructor and
    the process aborts ("terminate called without an active exception", torch #190489), which torchrun
    reports as a failed rank after every rank did its work. A short sleep at exit releases the GIL."""
    time.sleep(_EXIT_SETTLE_S)


def _device() -> torch.device:
    """Where this group's collectives take tensors: this rank's GPU for NCCL (the host otherwise). The launcher's
    LOCAL_RANK names it: a bare torchrun without a per-rank `torch.cuda.set_device` would leave every rank's
    current device at cuda:0 and the collectives on one GPU. accelerate and PartialState set it, the same one.
    Every collective here asks it first, so it also arranges the settle at exit once."""
    global _settle_registered
    if not _settle_registered:
        atexit.register(_settle_before_exit)
        _settle_registered = True
    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    index = int(local) % torch.cuda.device_count() if local is not None else torch.cuda.current_device()
    if torch.cuda.current_device() != index:
        torch.cuda.set_device(index)  # all_gather_object and barrier use the current device
    return torch.device("cuda", index)


def average_grads(params: Iterable[torch.nn.Parameter]) -> None:
    """Every rank's gradients replaced by their mean over the ranks (what DDP does for a module; the
    draft trains through several forwards per step, which DDP's hooks do not follow). One flat
    all-reduce per call; parameters without a gradient are left out on every rank alike."""
    if world() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads]).to(_device())  # [sum of numels]
    dist.all_reduce(flat)  # SUM: gloo has no AVG
    flat /= world()
    i = 0
    for g in grads:
        g.copy_(flat[i : i + g.numel()].view_as(g))
        i += g.numel()


def stats(values: dict[str, float]) -> dict[str, tuple[float, float, float]]:
    """Each value's (mean, min, max) over the ranks; every rank passes the same keys."""
    keys = sorted(values)
    if world() == 1:
        return {k: (values[k],) * 3 for k in keys}
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_device())
    rows = [torch.empty_like(t) for _ in range(world())]
    dist.all_gather(rows, t)
    per_rank = torch.stack(rows).cpu()  # [world, keys]
    return {k: (float(per_rank[:, i].mean()), float(per_rank[:, i].min()), float(per_rank[:, i].max()))
            for i, k in enumerate(keys)}


def total(counts: list[int]) -> list[int]:
    """Element-wise sums of integer counters over the ranks (the same length on every rank)."""
    if world() == 1:
        return list(counts)
    t = torch.tensor(counts, dtype=torch.int64, device=_device())
    dist.all_reduce(t)
    return [int(x) for x in t.cpu()]


def gather(obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, in rank order."""
    if world() == 1:
        return [obj]
    out: list[Any] = [None] * world()
    _device()  # NCCL: this rank's GPU current, where all_gather_object puts the pickles
    dist.all_gather_object(out, obj)
    return out


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """A hash of named tensors' exact values (the same bits give the same digest on every rank)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        if t.numel():
            h.update(t.view(-1).view(torch.uint8).numpy())  # the tensor's own bytes, not a copy
    return h.hexdigest()


def raise_on_any(failure: str | None, error: type[Exception] = SpectoolError) -> None:
    """A collective: every data-parallel rank raises `error` when any rank failed (naming the
    ranks), so no rank waits forever in a later collective for one that stopped."""
    every = gather(failure)
    failed = [(r, f) for r, f in enumerate(every) if f]
    if not failed:
        return
    if len(every) == 1:
        raise error(failed[0][1])
    raise error("; ".join(f"rank {r}: {f}" for r, f in failed))


def together(fn: Callable[[], T], main_only: bool = False) -> T | None:
    """A collective: `fn()` on every rank (`main_only`: on the main process alone; the others get
    None), a SpectoolError it raises raised on every rank (raise_on_any)."""
    failure, result = None, None
    if not main_only or rank() == 0:
        try:
            result = fn()
        except SpectoolError as e:
            failure = str(e)
    raise_on_any(failure)
    return result


def barrier() -> None:
    """Every rank waits here for the others."""
    if world() > 1:
        device = _device()
        dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()


SEE_WAIT_S = 10.0  # how long a rank looks again for the others' marks before the folder is called unshared


def claim_folder(folder: Path, claim: Callable[[], T], flag: str = "--out") -> T | None:
    """A collective: a command's `claim()` of its run folder on the main process (a refusal raised on every
    rank), then every rank shown to see that folder (shared_folder). Returns what `claim()` returned on the
    main process (None on the others)."""
    result = together(claim, main_only=True)
    shared_folder(folder, flag)
    return result


def shared_folder(folder: Path, flag: str = "--out") -> None:
    """A collective: refuse, on every rank alike, a run folder that is not the same folder for every rank. The
    ranks of a launch read and write one run folder (harvest's replicas their shards, init-draft's feature cache
    and checkpoints), so across nodes it must be on a filesystem they share. Each rank writes a mark named by a
    token of this launch into `folder` (which the main process has claimed), and looks for every other rank's:
    a mark of a rank that sees another filesystem (or a copy of the folder) is not there. Without a process
    group (one process) nothing is checked."""
    if world() == 1:
        return
    token = gather(secrets.token_hex(8) if rank() == 0 else None)[0]  # the main process's, on every rank
    marks = [folder / f".spectool-rank-{token}-{r}" for r in range(world())]
    mine = marks[rank()]
    wrote = _mark(mine)
    barrier()
    deadline = time.monotonic() + SEE_WAIT_S
    seen = _seen(marks)
    while len(seen) < world() and time.monotonic() < deadline:  # a network filesystem may show a new file late
        time.sleep(0.25)
        wrote = wrote or _mark(mine)
        seen = _seen(marks)
    node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", "?"))  # torchrun's node rank; srun's
    views = gather((seen, node, socket.gethostname(), str(Path(folder).absolute())))  # every rank's look is done
    if wrote:
        mine.unlink(missing_ok=True)
    blind = [r for r in range(world()) if 0 not in views[r][0] or r not in views[0][0]]
    if blind:
        def who(r: int) -> str:
            return f"rank {r} (node {views[r][1]}, host {views[r][2]}, {flag} {views[r][3]})"

        raise SpectoolError(
            f"{flag} {folder} is not one folder for every process of this launch: "
            f"{', '.join(who(r) for r in blind)} cannot see the files {who(0)} wrote there. A launch across nodes "
            f"needs {flag} on a filesystem every node shares (e.g. NFS or Lustre), at the same path on each: pass "
            f"{flag} as an absolute path on it")


def _mark(path: Path) -> bool:
    """This rank's mark written into its run folder, if this rank sees the folder."""
    try:
        os.listdir(path.parent)  # on NFS opening the folder revalidates what this client cached of it
        path.write_text(socket.gethostname())
        return True
    except OSError:  # the folder is not there for this rank (or not writable): the others do not see its mark
        return False


def _seen(marks: list[Path]) -> set[int]:
    """The ranks whose marks this rank sees."""
    try:
        names = set(os.listdir(marks[0].parent))  # a fresh listing, not a cached lookup
    except OSError:
        return set()
    return {r for r, m in enumerate(marks) if m.name in names}
