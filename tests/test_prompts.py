"""Prompts as the RL run renders them (prompts.py): every turn of a conversation, a system prompt put first, the chat
template's keyword arguments; the ids are the tokenizer's own apply_chat_template's, and they are what reaches the
engine and the records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spectool.data import load_source
from spectool.errors import SpectoolError
from spectool.harvesting import HarvestConfig
from spectool.prompts import encode_prompt, encode_tasks

from clirun import spectool
from conftest import make_tokenizer

# Modelled on Qwen3's chat template: with enable_thinking false the generation prompt is followed by an empty
# <think></think> block (the model then answers without reasoning)
QWEN3_STYLE = (
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
SYSTEM = "You are a careful mathematician."
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    t = make_tokenizer(tmp_path_factory.mktemp("qwen3_style"))
    t.chat_template = QWEN3_STYLE
    return t


def _reference(tok, messages, **kwargs) -> list[int]:
    """The tokenizer's own rendering, as TRL's GRPOTrainer calls it."""
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_ids_are_apply_chat_templates_with_the_same_kwargs_and_the_system_turn(tok, kwargs):
    ids = encode_prompt(tok, CHAT, None, kwargs)
    assert ids == _reference(tok, CHAT, **kwargs)
    assert tok.decode(ids).startswith(f"<|system|>\n{SYSTEM}<|end|>\n<|user|>")  # the system turn is kept
    # JSON text (the flag's form) renders the same as the mapping
    assert encode_prompt(tok, CHAT, None, json.dumps(kwargs)) == ids


def test_enable_thinking_false_appends_the_empty_think_block(tok):
    off, on = encode_prompt(tok, CHAT, None, {"enable_thinking": False}), encode_prompt(tok, CHAT, None, {})
    assert off != on and off[: len(on)] == on
    assert tok.decode(off[len(on):]) == "<think>\n\n</think>\n\n"


def test_the_system_prompt_reaches_the_ids_and_is_refused_over_the_datas_own(tok):
    user = "What is 2 + 3?"
    cfg = HarvestConfig(out="x", system_prompt=SYSTEM, chat_template_kwargs={"enable_thinking": False})
    cfg.validate()
    task = SimpleNamespace(messages=[{"role": "user", "content": user}])
    assert encode_tasks(tok, [task], cfg) == [_reference(tok, CHAT, enable_thinking=False)]
    assert encode_tasks(tok, [task]) == [_reference(tok, CHAT[1:])]  # no settings: the user turn alone
    with pytest.raises(SpectoolError, match="--system-prompt is refused: the data's prompts have a system turn"):
        encode_prompt(tok, CHAT, "Another system prompt.")


def test_a_plain_text_prompt_renders_as_before(tok):
    """A text is one user turn (the ids of every earlier harvest stay what they were)."""
    assert encode_prompt(tok, "What is 2 + 3?") == _reference(tok, CHAT[1:])


def test_a_tokenizer_without_a_chat_template_takes_text_only(tok, tmp_path):
    plain = make_tokenizer(tmp_path)
    plain.chat_template = None
    assert encode_prompt(plain, "What is 2 + 3?") == plain("What is 2 + 3?")["input_ids"]
    with pytest.raises(SpectoolError, match="no chat template"):
        encode_prompt(plain, CHAT)
    with pytest.raises(SpectoolError, match="--chat-template-kwargs"):
        encode_prompt(plain, "What is 2 + 3?", None, {"enable_thinking": False})


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        chat = [{"role": "system", "content": f"System {i % 3}."}, {"role": "user", "content": f"What is {i} + 1?"}]
        if i % 4 == 1:  # a multi-turn conversation
            chat += [{"role": "assistant", "content": "Which base?"}, {"role": "user", "content": "Base 10."}]
        rows.append({"prompt": chat, "answer": str(i + 1)})
    return rows


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_conversational_file_keeps_every_turn(tmp_path, fmt):
    """TRL's conversational format (a `prompt` column of messages), read from a local file: every turn is kept,
    system turns included; a conversation's split and id hash its canonical JSON."""
    import datasets

    from spectool.data.sources import in_eval_split

    rows = _rows(40)
    path = tmp_path / f"chat.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    train, ev = load_source(str(path)).tasks("train", 40), load_source(str(path)).tasks("eval", 40)
    assert len(train) + len(ev) == 40 and not {t.id for t in train} & {t.id for t in ev}
    by_user = {t.messages[1]["content"]: t for t in train + ev}
    for r in rows:
        t = by_user[r["prompt"][1]["content"]]
        assert t.messages == r["prompt"]  # every turn, in order, the system turn first
        assert json.loads(t.prompt) == r["prompt"]  # the records' prompt column: the conversation as JSON
        assert in_eval_split(t.prompt) == (t in ev)
    assert {len(t.messages) for t in train + ev} == {2, 4}


def test_a_one_user_turn_conversation_is_its_text(tmp_path):
    """A conversation of one user turn is the same task as its text: the ids of plain-text prompts (and of the chat
    cells earlier versions reduced to that turn) do not change."""
    path = tmp_path / "c.jsonl"
    qs = [f"What is {i} + 2?" for i in range(30)]
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in qs))
    chat = load_source(str(path)).tasks("train", 30)
    path.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in qs))
    text = load_source(str(path)).tasks("train", 30)
    assert [(t.id, t.prompt, t.conversation) for t in chat] == [(t.id, t.prompt, None) for t in text]
    assert chat[0].messages == [{"role": "user", "content": chat[0].prompt}]


def test_a_bad_prompt_cell_names_the_column_flag(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"prompt": [{"role": "user"}]}) + "\n")
    with pytest.raises(SpectoolError, match=r"row 1, column 'prompt' \(--prompt-col, or prompt_col in rl.yaml\)"):
        load_source(str(p)).tasks("train", 1) or load_source(str(p)).tasks("eval", 1)


def test_bad_chat_template_kwargs_are_refused_naming_the_flag(tmp_path):
    r = spectool("harvest", "--out", str(tmp_path / "h"), "--chat-template-kwargs", "[1]", check=False)
    assert r.returncode == 2 and "--chat-template-kwargs" in r.stderr and "JSON object" in r.stderr
    assert not (tmp_path / "h").exists()
    for bad, why in (('{"enable_thinking": false', "not valid JSON"), ('{"tokenize": true}', "apply_chat_template's own")):
        from spectool.prompts import template_kwargs

        with pytest.raises(SpectoolError, match=f"--chat-template-kwargs.*{why}"):
            HarvestConfig(out="x", chat_template_kwargs=template_kwargs(bad) if "tokenize" in bad else bad).validate()
    from spectool.rl.config import load_config

    with pytest.raises(SpectoolError, match="rollout.chat_template_kwargs"):
        load_config(None, ["speculation.enabled=false", "rollout.chat_template_kwargs=[1]"])
    assert load_config(None, ["speculation.enabled=false", "rollout.chat_template_kwargs={enable_thinking: false}"]) \
        .rollout.chat_template_kwargs \
        == {"enable_thinking": False}


def test_the_engine_gets_the_rendered_ids_and_the_records_keep_them(tok, tmp_path):
    """generation.rollout_tasks (harvest's and rollout's path to the engine): the ids the engine is given are the
    rendered ones, with the system prompt and the kwargs, and each record holds them."""
    from spectool.engine.engine import Completion
    from spectool.generation import rollout_tasks
    from spectool.stats import AcceptanceStats

    class Engine:
        def generate(self, prompts, sampling, **_):
            self.prompts = prompts
            return [[Completion(list(p), [5], [0.0], "stop", "5")] for p in prompts], AcceptanceStats()

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 3?", "answer": str(i + 3)}) + "\n" for i in range(9)))
    source = load_source(str(data))
    tasks = source.tasks("train", 3)
    cfg = HarvestConfig(out="x", system_prompt=SYSTEM, chat_template_kwargs={"enable_thinking": False})
    engine = Engine()
    rows, *_ = rollout_tasks(engine, tok, source, tasks, cfg.sampling, cfg)
    want = [_reference(tok, [CHAT[0], {"role": "user", "content": t.prompt}], enable_thinking=False) for t in tasks]
    assert engine.prompts == want and [r["prompt_ids"] for r in rows] == want


def test_train_rls_prompts_are_rendered_with_rl_yamls_settings(tok, tmp_path):
    from spectool.rl.config import load_config
    from spectool.rl.tasks import StepPrompts

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 3?", "answer": str(i + 3)}) + "\n" for i in range(9)))
    cfg = load_config(None, ["speculation.enabled=false", f"rollout.system_prompt={SYSTEM}", "policy.steps=1",
                             "rollout.prompts_per_step=4", "rollout.chat_template_kwargs={enable_thinking: false}"])
    steps = StepPrompts(load_source(str(data)), tok, cfg)
    assert steps.ids == [_reference(tok, [CHAT[0], *t.messages], enable_thinking=False) for t in steps.tasks]


def test_a_tokenizer_that_adds_bos_gets_one_bos_as_apply_chat_template_gives(bos_tokenizer):
    """A Llama-style tokenizer (its encoding adds BOS, its template writes one): the rendered text is tokenized without
    special tokens, as apply_chat_template(tokenize=True) does, so the ids start with one BOS, not two."""
    bos = bos_tokenizer.bos_token_id
    assert bos_tokenizer("What is 2 + 3?")["input_ids"][0] == bos  # the fixture does add one
    for messages in (CHAT, CHAT[1:]):
        ids = encode_prompt(bos_tokenizer, messages)
        assert ids == _reference(bos_tokenizer, messages)
        assert ids[0] == bos and ids.count(bos) == 1
        assert bos_tokenizer.decode(ids).startswith("<s><|")
    assert encode_prompt(bos_tokenizer, "What is 2 + 3?") == _reference(bos_tokenizer, CHAT[1:])  # a text: one user turn
