"""Claims held to a test each (issue 68, item 7; audit 2026-11d defects 4-10): the engine's context refusal, export's
--max-model-len, --system-prompt and --chat-template-kwargs reaching sweep-k's, verify's and export's prompts (export
inheriting its draft's), train-rl's stop counts, and the draft attention's memory staying linear in the sequence.
No engine starts here: each command is driven in process up to the step that hands its prompts on."""

from __future__ import annotations

import json
import shutil
import sys
import types

import pytest

from spectool.errors import SpectoolError

from conftest import make_random_draft

# a template whose generation prompt shows --chat-template-kwargs (Qwen3's enable_thinking), as in test_prompts.py
THINKING = (
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think></think>' }}{%- endif %}"
    "{%- endif %}"
)
SYSTEM = "You are a careful mathematician."
NO_THINKING = {"enable_thinking": False}


class Stop(Exception):
    """Raised by a stand-in where a command hands its prompts on: the test has what it came for."""


# --- Engine.generate's context refusal (engine/engine.py) -----------------------------------------------------------


def _engine(max_model_len: int):
    """An Engine as `generate` reads it, without vLLM: its settings, its drafter's range (none) and its context."""
    from spectool.engine.engine import Engine, EngineConfig

    e = Engine.__new__(Engine)
    e.cfg, e.draft_positions, e.max_model_len = EngineConfig(model_path="policy"), None, max_model_len
    return e


def test_a_generation_longer_than_the_engines_context_is_refused(monkeypatch):
    from spectool.engine.engine import Sampling

    e = _engine(100)
    with pytest.raises(SpectoolError, match="needs a 101-token context .* the engine was started with 100: raise "
                                            "--max-model-len"):
        e.generate([[1] * 10, [1] * 41], Sampling(max_tokens=60))  # the longest prompt + max tokens: 101
    with pytest.raises(SpectoolError, match="needs a 105-token context"):  # per-prompt max tokens count per prompt
        e.generate([[1] * 50, [1] * 5], Sampling(max_tokens=1, max_tokens_each=[40, 100]))
    # exactly the context passes the refusal and goes on to vLLM (a stand-in here; the engine is not started, so the
    # next thing it reads is the engine itself)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=object, TokensPrompt=dict))
    with pytest.raises(SpectoolError, match="this engine was closed"):
        e.generate([[1] * 40], Sampling(max_tokens=60))


# --- prompts as sweep-k, verify and export render them ---------------------------------------------------------------


@pytest.fixture(scope="module")
def thinking_policy(tiny_policy, tmp_path_factory):
    """The tiny policy with a chat template that renders --chat-template-kwargs, and an EAGLE-3 draft for it."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("thinking")
    policy = root / "policy"
    shutil.copytree(tiny_policy, policy)
    tok = AutoTokenizer.from_pretrained(policy)
    tok.chat_template = THINKING
    tok.save_pretrained(policy)
    return policy, make_random_draft(policy, root / "draft"), AutoTokenizer.from_pretrained(policy)


def _rendered(tok, prompts: list[list[int]]) -> list[str]:
    texts = [tok.decode(p) for p in prompts]
    assert texts and all(t.startswith("<|") for t in texts)
    return texts


def _assert_system_and_kwargs(texts: list[str]) -> None:
    """Every prompt opens with the system turn and ends with the kwargs' empty think block."""
    assert all(t.startswith(f"<|system|>{SYSTEM}<|end|><|user|>") for t in texts), texts[0]
    assert all(t.endswith("<|assistant|><think></think>") for t in texts), texts[0]


def _assert_plain(texts: list[str]) -> None:
    assert all(t.startswith("<|user|>") and t.endswith("<|assistant|>") for t in texts), texts[0]


def test_sweep_ks_prompts_carry_the_system_prompt_and_the_template_kwargs(thinking_policy, gym_jsonl, tmp_path,
                                                                           monkeypatch):
    """The prompts sweep-k measures on (the ones its engines' context is derived from) are rendered with its flags."""
    from spectool.commands import sweep_k
    from spectool.config.sweep_k import SweepConfig

    policy, _, tok = thinking_policy
    seen = []

    def context(cfg, model_path, drafts, prompts, lengths):
        seen.append(prompts)
        raise Stop

    monkeypatch.setattr(sweep_k, "_context", context)
    common = dict(model=str(policy), data=str(gym_jsonl), prompt_col="question", answer_col="solution", methods=["ngram"])
    for settings in ({"system_prompt": SYSTEM, "chat_template_kwargs": NO_THINKING}, {}):
        with pytest.raises(Stop):
            sweep_k.run(SweepConfig(out=str(tmp_path / "s"), **common, **settings))
    _assert_system_and_kwargs(_rendered(tok, seen[0]))
    _assert_plain(_rendered(tok, seen[1]))


def test_verifys_prompts_carry_the_system_prompt_and_the_template_kwargs(thinking_policy, gym_jsonl, monkeypatch):
    """The prompts verify samples its arms on are rendered with its flags."""
    from spectool.commands import verify
    from spectool.config.verify import VerifyConfig

    policy, _, tok = thinking_policy
    seen = []

    def arm(**kw):
        seen.append(kw["prompts"])
        raise Stop

    monkeypatch.setattr(verify, "sample_arm", arm)
    common = dict(model=str(policy), data=str(gym_jsonl), prompt_col="question", answer_col="solution",
                  draft_model="policy", n_prompts=2)
    for settings in ({"system_prompt": SYSTEM, "chat_template_kwargs": NO_THINKING}, {}):
        with pytest.raises(Stop):
            verify.run(VerifyConfig(**common, **settings), progress=lambda _: None)
    _assert_system_and_kwargs(_rendered(tok, seen[0]))
    _assert_plain(_rendered(tok, seen[1]))


class RecordingEngine:
    """Stands in for engine.Engine in export's check: keeps its settings and the prompts it is given."""

    started: list = []

    def __init__(self, cfg):
        self.cfg, self.served_by, self.prompts = cfg, "a stand-in engine", []
        RecordingEngine.started.append(self)

    def generate(self, prompts, sampling):
        from spectool.stats import AcceptanceStats

        self.prompts.append(prompts)
        return [], AcceptanceStats(10, 20, 10)


@pytest.fixture
def export_engine(monkeypatch):
    import spectool.commands.export as export

    monkeypatch.setattr(export, "Engine", RecordingEngine)
    monkeypatch.setattr(RecordingEngine, "started", [])
    return RecordingEngine


def _draft_with_rendering(draft, folder, rendering: dict | None):
    """A copy of `draft` whose manifest records its harvest's rendering (init-draft writes it from the harvest's)."""
    shutil.copytree(draft, folder)
    if rendering is not None:
        (folder / "manifest.json").write_text(json.dumps({"kind": "draft", "rendering": rendering}))
    return folder


def test_exports_check_renders_with_its_flags_and_else_the_drafts_own(thinking_policy, tmp_path, export_engine):
    """export's check prompts: --system-prompt and --chat-template-kwargs when given, else the draft's harvest's
    (its manifest's `rendering`), else none."""
    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    policy, draft, tok = thinking_policy
    own = _draft_with_rendering(draft, tmp_path / "own", {"system_prompt": SYSTEM, "chat_template_kwargs": NO_THINKING})
    bare = _draft_with_rendering(draft, tmp_path / "bare", None)

    def exported(src, **settings) -> list[str]:
        run(ExportConfig(draft=str(src), out=str(tmp_path / "out"), model=str(policy), k=2, min_acceptance_length=1.0,
                         **settings))
        prompts = export_engine.started[-1].prompts
        assert len(prompts) == 2 and prompts[0] == prompts[1]  # T=0 and T=1 on the same prompts
        return _rendered(tok, prompts[0])

    _assert_system_and_kwargs(exported(own))  # inherited from the draft
    _assert_system_and_kwargs(exported(bare, system_prompt=SYSTEM, chat_template_kwargs=NO_THINKING))  # the flags
    _assert_plain(exported(bare))
    # a flag given wins over the draft's own
    other = exported(own, system_prompt="Be brief.", chat_template_kwargs={"enable_thinking": True})
    assert all(t.startswith("<|system|>Be brief.<|end|>") and t.endswith("<|assistant|>") for t in other)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["rendering"] == \
        {"system_prompt": "Be brief.", "chat_template_kwargs": {"enable_thinking": True}}


def test_exports_max_model_len_is_the_checks_context_or_refused_before_any_engine(thinking_policy, tmp_path,
                                                                                   export_engine):
    """--max-model-len on export: the check's engine runs at it; one shorter than the check needs is refused before
    any engine starts, and nothing is written."""
    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    policy, draft, _ = thinking_policy
    common = dict(draft=str(draft), model=str(policy), k=2, min_acceptance_length=1.0)
    run(ExportConfig(out=str(tmp_path / "long"), max_model_len=700, **common))
    assert export_engine.started[-1].cfg.max_model_len == 700
    run(ExportConfig(out=str(tmp_path / "derived"), **common))
    derived = export_engine.started[-1].cfg.max_model_len
    assert derived < 700  # unset: the check's need (its longest prompt + 32 tokens + k), not the model's 1024
    with pytest.raises(SpectoolError, match=r"--max-model-len=8 is shorter than this run needs"):
        run(ExportConfig(out=str(tmp_path / "short"), max_model_len=8, **common))
    assert len(export_engine.started) == 2 and not (tmp_path / "short").exists()


# --- train-rl's stop counts (commands/train_rl.py, rl/report.py) ----------------------------------------------------


def test_train_rls_stop_counts_come_from_its_rollouts_and_reach_the_summary(capsys):
    """A step's `finish_length`/`finish_stop` count its completions' finish reasons; the run's summary adds them up
    over the steps, and the printed summary says how the rollouts ended."""
    from spectool.commands.train_rl import RLResult, batch_metrics, generate_step, run_summary
    from spectool.engine.engine import Completion
    from spectool.rl.config import load_config
    from spectool.rl.report import render_summary
    from spectool.stats import AcceptanceStats

    reasons = {0: [["stop", "length"], ["length", "length"]], 1: [["stop", "stop"], ["stop", "abort"]]}

    class Engine:
        def generate(self, prompts, sampling):
            return [[Completion(p, [7, 8], [-1.0, -1.0], why, "8") for why in reasons[self.step][i]]
                    for i, p in enumerate(prompts)], AcceptanceStats()

    tasks = types.SimpleNamespace(for_step=lambda step: [0, 1], ids=[[1, 2], [1, 3]], tasks=["a", "b"])
    source = types.SimpleNamespace(score=lambda task, text: 1.0 if task == "a" else 0.0)
    cfg = load_config(None, ["speculation.enabled=false", "rollout.group_size=2", "rollout.prompts_per_step=2"])
    engine, history = Engine(), []
    for step in (0, 1):
        engine.step = step
        m = batch_metrics(generate_step(engine, source, tasks, step, cfg))
        history.append({**m, "step_s": 1.0, "gen_share": 0.5})
    assert [(h["finish_length"], h["finish_stop"]) for h in history] == [(3, 1), (0, 3)]
    s = run_summary(history)
    assert (s["finish_length"], s["finish_stop"]) == (3, 4)
    render_summary(RLResult("runs/rl", 2, 0, 3.0, history))
    row = next(line for line in capsys.readouterr().out.splitlines() if "rollouts ended" in line)
    assert "4 at EOS, 3 at the length cap (43%)" in row


# --- the draft attention's memory (draft/model.py prefix_attention) -------------------------------------------------


def _largest_tensor_bytes(fn) -> int:
    """The largest storage (bytes) any torch op creates while `fn` runs, its backward included: a tensor of the
    attention's scores or mask shows up here, a kernel's own blockwise scratch does not."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    largest = [0]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    largest[0] = max(largest[0], t.untyped_storage().nbytes())
            return out

    with Largest():
        fn()
    return largest[0]


@pytest.mark.parametrize("case", ["every row", "anchors and extra keys", "packed records"])
def test_the_draft_attention_never_builds_a_tensor_quadratic_in_the_sequence(case):
    """prefix_attention's claim (linear memory, no T x T mask or scores): the largest tensor it creates, forward and
    backward, grows 4x when T does (a materialised [T, T] mask or [n, T] scores: 16x), and stays far below one
    T x T float32 matrix."""
    import torch

    from spectool.draft.model import prefix_attention

    def attend(T: int) -> int:
        torch.manual_seed(0)
        B, hq, hk, hd = 1, 4, 2, 16
        k, v = torch.randn(B, hk, T, hd), torch.randn(B, hk, T, hd)
        rows, extra, segments = slice(None), None, None
        if case == "anchors and extra keys":
            rows = torch.arange(0, T, 2)
            extra = torch.randn(B, hq, len(rows), 3)
        if case == "packed records":
            segments = [0, T // 4, T // 2, T]
        n = T if isinstance(rows, slice) else len(rows)
        q = torch.randn(B, hq, n, hd, requires_grad=True)

        def step():
            o, w = prefix_attention(q, k, v, rows, extra, segments)
            (o.sum() + (0 if w is None else w.sum())).backward()

        return _largest_tensor_bytes(step)

    small, large = attend(256), attend(1024)
    assert large <= 4.5 * small, (small, large)  # linear: 4x; a T x T tensor: 16x
    assert large < 1024 * 1024 * 4 / 4, large  # a quarter of one [T, T] float32 matrix
