"""An engine's context (vLLM's `max_model_len`): one setting for every command that starts an engine, derived from
what the run needs and checked before any engine starts.

The default is what the run needs: the longest rendered prompt + the max new tokens, + one spare position (a logprob
check feeds a completion cut at the cap back, and vLLM refuses a prompt of exactly the context), or a drafter's k
positions past the last token where they still fit. It is refused, naming the numbers and the settings to change, when
it passes the model's own limit (what vLLM 0.32 derives from config.json: `model_limit`) or, with a draft, the draft's
position range (positions.py). A context the user gives is refused when it is shorter than the run needs, the
spare position included: vLLM 0.32 would end every longer completion at the context (finish_reason "length" before
max_tokens, v1/core/sched/utils.py check_stop) without a word, and the records would hold cut completions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.positions import check_run_length


@dataclass(frozen=True)
class LengthSettings:
    """What a command calls its two length settings (each refusal names them)."""

    context: str = "--max-model-len"
    max_tokens: str = "--max-tokens"


CLI = LengthSettings()
RL_YAML = LengthSettings("engine.max_model_len", "rollout.max_tokens")

# vLLM 0.32's keys for a model's length (transformers_utils/model_arch_config_convertor.py,
# derive_max_model_len_and_key): the smallest one present, model_max_length where set
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# rope types whose max_position_embeddings is already the scaled length (vLLM 0.32 config/model.py
# _get_and_verify_max_len); the others' `factor` multiplies it
_PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
VLLM_UNKNOWN_LENGTH = 2048  # what vLLM assumes when config.json names no length
SPARE = 1  # positions the context keeps past the longest sequence (resolve_max_model_len)


def model_limit(config: dict) -> tuple[int, str]:
    """(the longest context vLLM serves for this config.json, where that number comes from)."""
    text = config.get("text_config") or config
    found = {k: text[k] for k in LENGTH_KEYS if isinstance(text.get(k), (int, float))}
    if text.get("model_max_length"):
        key = "model_max_length"
    elif found:
        key = min(found, key=found.get)
    else:
        return VLLM_UNKNOWN_LENGTH, "vLLM's default (config.json names no length)"
    limit = float(found[key])
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type")
    if kind and kind not in _PRESCALED_ROPE and kind != "default" and rope.get("factor") \
            and "gemma3" not in str(text.get("model_type", "")):
        limit *= float(rope["factor"])
        key += f" x rope factor {rope['factor']}"
    return int(limit), key


def read_config(model_path: str) -> dict:
    """A model folder's config.json (a hub id: transformers' own reading of it)."""
    path = Path(model_path) / "config.json"
    if path.exists():
        return json.loads(path.read_text())
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    return AutoConfig.from_pretrained(model_path).to_dict()


def resolve_max_model_len(model_path: str, longest_prompt: int, max_tokens: int, *, extra: int = 0,
                          user: int | None = None, names: LengthSettings = CLI, draft_path: str | None = None,
                          method: str = "") -> int:
    """The engine's max_model_len for a run whose longest rendered prompt has `longest_prompt` tokens and which
    generates up to `max_tokens` (`extra`: positions a drafter proposes past the last token, added where they fit;
    `user`: the context given, None or 0 to derive it; `draft_path`/`method`: the drafter whose position range the
    run must fit, positions.py). Refuses, naming the numbers and `names`' settings, a run past the model's limit
    or the draft's range, and a given context shorter than the run needs or longer than the model serves."""
    need = longest_prompt + max_tokens
    # the context holds one position past the run's longest sequence (SPARE): a logprob check (train-rl's
    # rl/policy.py, TRL's integrations/trl/attach.py) feeds prompt + a completion cut at the cap back with
    # max_tokens=1, and vLLM 0.32 refuses a prompt of exactly the context (v1/engine/input_processor.py), mid-run
    least = need + SPARE
    what = (f"the longest prompt, {longest_prompt} tokens, + {names.max_tokens} {max_tokens}" if longest_prompt
            else f"{names.max_tokens} {max_tokens}, the prompt's tokens not counted")
    spare = ("and one position past it (a logprob check reads a completion cut at the cap back, and vLLM refuses a "
             "prompt of exactly the context)")
    limit, source = model_limit(read_config(model_path))
    if least > limit:
        raise SpectoolError(
            f"this run needs a {need}-token context ({what}) {spare}, and {model_path} serves at most {limit} "
            f"({source} in its config.json): lower {names.max_tokens} to at most "
            f"{max(limit - SPARE - longest_prompt, 0)} or use shorter prompts")
    if user:
        if user < least:
            raise SpectoolError(
                f"{names.context}={user} is shorter than this run needs: {need} tokens ({what}) {spare}; vLLM would "
                f"end every longer completion at {user} tokens without a word, or refuse its logprob check mid-run. "
                f"Raise {names.context} to at least {least} (or leave it unset: the run's need), or lower "
                f"{names.max_tokens}")
        if user > limit:
            raise SpectoolError(f"{names.context}={user} is past what {model_path} serves: {limit} tokens ({source} in "
                                f"its config.json); use at most {limit} (or leave it unset: the run's need, {least})")
    if draft_path or method == "mtp":
        check_run_length(draft_path, model_path, method, need, names.max_tokens)
    return user or min(need + max(extra, SPARE), limit)


# --- how completions ended ---------------------------------------------------------------------------------------

# harvest warns when this share of its completions ended at the length cap: the draft would learn truncated tails
CUT_SHARE_WARNING = 0.25


def finish_counts(reasons) -> dict[str, int]:
    """{"length": completions that ended at the length cap, "stop": at EOS or a stop token} of vLLM finish reasons
    (another reason, e.g. "abort", under its own name)."""
    counts = {"length": 0, "stop": 0}
    for r in reasons:
        counts[str(r)] = counts.get(str(r), 0) + 1
    return counts


def describe_finish(counts: dict[str, int]) -> str:
    """'12 at EOS, 4 at the length cap (25%)': one line for a run's summary."""
    total = sum(counts.values())
    cut = counts.get("length", 0)
    other = ", ".join(f"{n} {k}" for k, n in counts.items() if k not in ("length", "stop") and n)
    return (f"{counts.get('stop', 0)} at EOS, {cut} at the length cap ({cut / max(total, 1):.0%})"
            + (f", {other}" if other else ""))


def cut_warning(counts: dict[str, int], max_tokens: int, flag: str = "--max-tokens") -> str | None:
    """A warning when at least CUT_SHARE_WARNING of the completions ended at the length cap, else None."""
    total, cut = sum(counts.values()), counts.get("length", 0)
    if not total or cut / total < CUT_SHARE_WARNING:
        return None
    return (f"{cut} of {total} completions ({cut / total:.0%}) ended at the length cap ({flag} {max_tokens}), not at "
            f"EOS: a draft trained on them learns cut-off tails that the RL run's longer completions continue. Raise "
            f"{flag} to the RL run's completion length (reasoning policies: 4096-16384); the context follows it "
            "(--max-model-len, default: the longest prompt + --max-tokens)")
