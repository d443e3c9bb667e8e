"""Fixtures: tiny Llama policies with a locally trained tokenizer; the hub is off for the session."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # an accidental download fails loudly
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("SPECTOOL_ENFORCE_EAGER", "1")  # tests: 7 s engine start, no torch.compile
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

pytest_plugins = ["costs", "pytester"]  # tiers, cost markers and the budget (tests/costs.py); runs inside a run


_COLLECTION: dict = {}


def pytest_collectstart(collector):
    """The environment as collection begins (the first collector), for `pytest_collection_modifyitems` below."""
    _COLLECTION.setdefault("environment", dict(os.environ))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Importing the test modules leaves the environment as it found it. `pytest.importorskip("trl")` at a module's
    top imports TRL, which sets VLLM_LOGGING_LEVEL=ERROR (and more) process-wide: every CLI run and the CLI zygote
    (started in the warm-up, after this) then inherited it, and their engine logs lost vLLM's warnings (CI failed
    test_harvest_parallel's and test_pipeline_e2e's log checks on the whole tier only, 2026-11-28)."""
    before = _COLLECTION.get("environment")
    if before is not None:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture(autouse=True)
def _one_torch_thread_for_unit_tests(request):
    """A unit test computes on one torch thread: tiny tensors on this 2-core machine, beside other jobs, spend more
    in threads' spin-waits than in the work (tests/test_lossless.py: killed at 500 s with torch's default threads
    under load, 41 s on one). Tests marked engine, e2e or multiproc keep the default (their engines' own)."""
    if any(request.node.get_closest_marker(m) for m in ("engine", "e2e", "multiproc")):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# the architectures of the tests' policies and configs: vLLM's answer for each is kept per build (engine/serves.py)
WARM_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM",
                      "MiMoForCausalLM")
WARM_IMPORTS = ("torch", "safetensors.torch", "transformers", "transformers.models.auto.modeling_auto",
                "transformers.models.llama.modeling_llama", "datasets", "reasoning_gym", "speculators", "spectool.cli",
                "spectool.commands.export", "spectool.commands.rollout", "spectool.commands.init_draft",
                "spectool.commands.sweep_k", "spectool.commands.verify", "spectool.commands.train_rl")


def _uses_the_cli(items) -> bool:
    """Whether any of these tests runs the CLI (its file uses tests/clirun.py, or it asks for a CLI-built fixture)."""
    cli_fixtures = {"harvest_hs", "eagle3_export"}
    texts: dict = {}
    for item in items:
        if cli_fixtures & set(getattr(item, "fixturenames", ())):
            return True
        if item.path not in texts:
            texts[item.path] = "clirun" in item.path.read_text()
        if texts[item.path]:
            return True
    return False


def pytest_costs_warm_up(config, items, whole_run):
    """What only a first run pays, paid before any test is timed (tests/costs.py): a fresh clone's first run failed
    two unit tests at 6.6 and 7.0 s that its second run passed (issue 69), each the first to ask vLLM about its
    policy's architecture (a child importing vLLM, then kept in spectool's cache). So: spectool's modules compiled
    (a CLI child never compiles them), the heavy imports of pytest's own process (torch, transformers' model classes,
    the data libraries, spectool's commands; not vLLM, which loads only with an engine, after its environment is
    set), the embedded policy converted from its GGUF, vLLM's answer for each architecture the tests use, asked in
    one child, and the CLI zygote's imports (tests/clirun.py: started first, waited for last; only where a test runs
    the CLI, so a run of unit tests does not wait 10 s for vLLM). Each part a few seconds once, well under a second
    after, but the zygote's; one that fails (a module mid-edit) is left to the tests that need it to say so."""
    import compileall
    import importlib
    import subprocess
    import sys
    import warnings

    import spectool

    from clirun import forking, start_zygote, zygote_ready

    zygote = forking() and (whole_run or _uses_the_cli(items))
    if zygote:
        start_zygote()  # its imports (vLLM's too) overlap the ones below
    compileall.compile_dir(Path(spectool.__file__).parent, quiet=1)
    with warnings.catch_warnings():  # their deprecation notes (torch.jit in speculators) are no test's
        warnings.simplefilter("ignore")
        for module in WARM_IMPORTS:
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 (the tests that import it fail with the reason)
                continue
    try:
        from spectool.models import resolve_model

        resolve_model("smollm2-135m")
    except Exception:  # noqa: BLE001 (its own tests say why)
        pass
    code = ("import sys\nfrom spectool import subproc\nfrom spectool.engine import serves\n"
            "subproc.call = lambda module, name, kwargs, **_: getattr(serves, name)(**kwargs)  # vLLM imported once\n"
            "for a in sys.argv[1:]:\n    serves.registry_answer(a)\n")
    subprocess.run([sys.executable, "-c", code, *WARM_ARCHITECTURES], capture_output=True, timeout=900,
                   env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    if zygote:
        try:
            zygote_ready()
        except AssertionError:  # the first CLI run says so
            pass


@pytest.fixture(scope="module")
def environment_restored():
    """The process's environment as it was before the module, restored after it: `import trl` (and TRL's colocated
    engine) set process-wide variables (VLLM_LOGGING_LEVEL, ...) that later tests must not inherit."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(folder: Path, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from spectool.data.chat_prompts import chat_prompts

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = chat_prompts() + [f"What is {a} + {b}? The answer is {a + b}." for a in range(10) for b in range(10)]
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


# Llama-style: the template writes the BOS token itself, and the tokenizer's encoding adds one too
BOS_CHAT_TEMPLATE = "{{ bos_token }}" + CHAT_TEMPLATE


@pytest.fixture(scope="session")
def bos_tokenizer(tmp_path_factory):
    """The test tokenizer made Llama-style: encoding a text adds BOS (<s>) in front, as Llama's and Mistral's
    tokenizers do, and its chat template writes BOS itself, so a rendered prompt tokenized with special tokens would
    start with two (the tokenizer the others are does not add any)."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("bos_tokenizer")
    tok = make_tokenizer(folder)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.bos_token_id)])
    tok.chat_template = BOS_CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)  # as saved: what a run loads


def transformers_logprobs(policy, prompt: list[int], resp: list[int]):
    """The policy's logprob of each response token after its prompt (a float32 transformers forward)."""
    import torch

    ids = torch.tensor([prompt + resp])
    with torch.no_grad():
        lp = torch.log_softmax(policy(ids).logits[0].float(), -1)
    return lp[len(prompt) - 1 : -1].gather(-1, ids[0, len(prompt):, None])[:, 0]  # [len(resp)]


def make_policy(folder: Path, layers: int = 4, hidden: int = 128, seed: int = 0, tie: bool = False,
                max_positions: int = 1024) -> Path:
    """A random tiny Llama (4 layers, hidden 128, head_dim 32: a size vLLM's CPU attention takes; a context of
    `max_positions` tokens)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=tie, rope_theta=10000.0,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # a sharper next-token distribution than init gives (less uniform samples)
        model.lm_head.weight.mul_(2.0 if tie else 8.0)  # tied: this scales the embedding too
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    return make_policy(tmp_path_factory.mktemp("tiny_policy"))


@pytest.fixture(scope="session")
def long_context_policy(tiny_policy, tmp_path_factory):
    """The tiny policy claiming an 8192-token context, as SmolLM2 does: longer than TRL's fixed 4096-token step
    budget, which the CPU build (prompts never chunked) refuses unless spectool raises the budget to the context."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("long") / "policy"
    shutil.copytree(tiny_policy, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 8192}))
    return folder


def sums_with_answer(folder: Path, answer: str = "8") -> Path:
    """100 "What is a + b?" prompts whose (fake) answer is always `answer`: a random tiny policy
    ends on it in some samples, so GRPO groups get mixed rewards."""
    import json

    p = folder / f"sums_{answer}.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": answer}) + "\n"
                         for a in range(10) for b in range(10)))
    return p


@pytest.fixture(scope="session")
def gym_jsonl(tmp_path_factory) -> Path:
    import json

    p = tmp_path_factory.mktemp("data") / "sums.jsonl"
    with open(p, "w") as f:
        for a in range(10):
            for b in range(10):
                f.write(json.dumps({"question": f"What is {a} + {b}?", "solution": str(a + b)}) + "\n")
    return p


def make_random_draft(policy_folder: Path, out: Path) -> Path:
    """An untrained EAGLE-3 draft for the policy in `policy_folder`, over its whole vocabulary."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    policy = AutoModelForCausalLM.from_pretrained(policy_folder)
    torch.manual_seed(0)
    d = new_draft(policy, torch.arange(policy.config.vocab_size), default_aux_layer_ids(policy.config.num_hidden_layers))
    save_draft(d, out, extra=draft_metadata(resolve_model(str(policy_folder)), 3))
    return out


@pytest.fixture(scope="session")
def random_draft(tiny_policy, tmp_path_factory):
    """An untrained EAGLE-3 draft: acceptance is low, so most tokens go through rejection."""
    return make_random_draft(tiny_policy, tmp_path_factory.mktemp("random_draft"))


def make_moe_policy(folder: Path, family: str = "qwen3_moe", layers: int = 4, hidden: int = 128, seed: int = 0) -> Path:
    """A random tiny mixture-of-experts policy (4 experts, 2 active per token), which transformers 5
    holds with its experts fused (mlp.experts.gate_up_proj) and saves per expert, as vLLM loads it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = make_tokenizer(folder)
    torch.manual_seed(seed)
    moe = {"qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
                             mlp_only_layers=[], norm_topk_prob=True),
           "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
           "olmoe": dict(num_experts=4, num_experts_per_tok=2),
           "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                             decoder_sparse_step=1, mlp_only_layers=[])}[family]
    cfg = AutoConfig.for_model(
        family, vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False, rope_theta=10000.0, **moe)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    with torch.no_grad():  # a sharper next-token distribution than init gives (less uniform samples)
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(folder)
    return folder


def write_fake_harvest(policy_folder: Path, run: Path, n: int = 24, max_new_tokens: int = 12,
                       prompt_pad: int = 0) -> Path:
    """A harvest run dir with `n` records sampled from the policy by transformers (each prompt 4 tokens plus
    `i % 3 * prompt_pad` more: lengths that differ)."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.models import resolve_model
    from spectool.records import write_shard
    from spectool.runs import MANIFEST, atomic_write_json, make_manifest

    policy = AutoModelForCausalLM.from_pretrained(policy_folder, dtype=torch.float32)
    torch.manual_seed(0)
    rows = []
    for i in range(n):
        prompt = [1, 3 + i % 7, 40 + i % 200, *([5] * (i % 3 * prompt_pad)), 4]
        out = policy.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=True, pad_token_id=2)
        resp = out[0, len(prompt):].tolist()
        rows.append(dict(prompt_id=f"{i:016x}", sample_idx=0, prompt="p", answer="", prompt_ids=prompt,
                         response_ids=resp, logprobs=[0.0] * len(resp), reward=0.0, finish_reason="length",
                         response=""))
    write_shard(run, 0, rows)
    m = resolve_model(str(policy_folder))
    atomic_write_json(run / MANIFEST, make_manifest("harvest", model=m.name, model_identity=m.identity, data="x"))
    return run


@pytest.fixture(scope="session")
def fake_harvest_once(tiny_policy, tmp_path_factory) -> Path:
    return write_fake_harvest(tiny_policy, tmp_path_factory.mktemp("fake_harvest") / "harvest")


@pytest.fixture
def fake_harvest(fake_harvest_once, tmp_path):
    """A harvest run dir with 24 records sampled from the tiny policy (init-draft's tests): sampled once a
    test run, a copy per test (init-draft may write beside the records)."""
    import shutil

    return Path(shutil.copytree(fake_harvest_once, tmp_path / "harvest"))


GYM_SUMS = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"  # the CLI tests' offline math


@pytest.fixture(scope="session")
def harvest_hs(tiny_policy, tmp_path_factory) -> Path:
    """`spectool harvest --hidden-states` on the tiny policy (20 prompts x 2 samples, 24 tokens), run once
    a test run: the pipeline's stage tests and the parallel drafters' lifecycles train on it. Read-only:
    a test that resumes or refuses on it works on a copy."""
    from clirun import spectool

    run = tmp_path_factory.mktemp("harvest_hs") / "h"
    spectool("harvest", "--out", str(run), *harvest_hs_args(tiny_policy))
    return run


def harvest_hs_args(tiny_policy: Path) -> list[str]:  # the fixture's settings, for its resume test
    return ["--model", str(tiny_policy), "--data", GYM_SUMS, "--max-tokens", "24", "--samples", "2",
            "--hidden-states", "--n-prompts", "20"]


@pytest.fixture(scope="session")
def eagle3_export(tiny_policy, harvest_hs, tmp_path_factory) -> tuple[Path, Path]:
    """init-draft (EAGLE-3, 256-token vocabulary, 3 unroll steps, 2 epochs) on `harvest_hs`, then
    `export --k 2 --min-acceptance 1.0` (verified on vLLM): built once a test run. (draft, export)."""
    from clirun import spectool

    root = tmp_path_factory.mktemp("eagle3_export")
    draft, out = root / "draft", root / "export"
    spectool("init-draft", "--model", str(tiny_policy), "--data", str(harvest_hs), "--out", str(draft),
             "--draft-vocab-size", "256", "--ttt-steps", "3", "--epochs", "2", "--batch-size", "8")
    r = spectool("export", "--draft", str(draft), "--out", str(out), "--k", "2", "--min-acceptance", "1.0")
    assert "verified on vLLM" in r.stdout
    return draft, out

