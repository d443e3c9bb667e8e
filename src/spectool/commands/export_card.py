"""What makes an export ready to share: its model card (README.md with the hub's metadata front matter: the base
model, the library that serves it, tags), and its upload to the hub (`export --push-to-hub REPO`).

The card states what the export's check measured (mean acceptance length at T=0 and at T=1, with the proposals
rollout uses), the data the draft was trained on (its manifest, and its harvest's settings where the harvest is
still there), the command that made it, and how vLLM serves it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from spectool.config.export import ExportConfig
from spectool.data.sources import MIX_SEPARATOR
from spectool.errors import SpectoolError
from spectool.runs import CONFIG, MANIFEST, read_json

CARD = "README.md"  # the file the hub shows as the repo's model card
TITLES = {"eagle3": "EAGLE-3", "peagle": "P-EAGLE (parallel EAGLE-3)", "dflash": "DFlash"}
FLAGS = {"target": "--for", "min_acceptance_length": "--min-acceptance"}  # cli.CLI["export"]'s renamed flags


@dataclass
class Check:
    """What the export's check measured on the engine: mean acceptance length (1 + accepted / drafts) at T=0 and at
    T=1 on the same engine, prompts and tokens."""

    t0: float
    t1: float
    proposals: str  # greedy | probabilistic (engine/proposals.py, resolved for the installed build)
    proposals_why: str
    served_by: str
    data: str  # the data source its prompts are drawn from (the draft's own, else general chat prompts)
    prompts: int
    tokens: int
    seed: int  # the T=1 pass's sampling seed
    split: str = "eval"  # the prompts' split: held-out ("eval"), or "train" where the data holds no held-out prompt


def command_line(cfg: ExportConfig) -> str:
    """`spectool export ...` with the settings `cfg` holds as the user gave them (flags at their defaults left out)."""
    parts = ["spectool", "export"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name not in ("draft", "out") and value == f.default:
            continue
        flag = FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            parts += [flag, shlex.quote(json.dumps(value) if isinstance(value, dict) else str(value))]
    return " ".join(parts)


def training_data(draft: Path) -> dict:
    """The data a draft folder was trained on, from its manifest (init-draft's) and its harvest's settings when that
    run folder is still there: {data, records, train_records, eval_records, rendering, harvest?: {...}}. An export
    keeps what its draft's said under `training_data`: re-exporting an export reads that (the one reading of a draft
    folder's provenance: export's check prompts, rendering and card)."""
    m = read_json(draft / MANIFEST) if (draft / MANIFEST).exists() else {}
    if m.get("kind") == "export":
        return dict(m.get("training_data") or {})
    out = {k: m.get(k) for k in ("harvest_data", "records", "train_records", "eval_records", "rendering")}
    harvest = Path(m["harvest"]) if m.get("harvest") else None
    if harvest is not None and (harvest / CONFIG).exists():
        h = read_json(harvest / CONFIG)
        s = h.get("sampling") or {}
        out["harvest"] = {"split": h.get("split"), "prompt_col": h.get("prompt_col"), "answer_col": h.get("answer_col"),
                          **{k: s.get(k) for k in ("n_prompts", "samples", "max_tokens", "temperature", "top_p")}}
    return out


def _shared(data: str) -> str:
    """A data source as a card shows it: a local file by its name (this machine's folders are no reader's), each part
    of a mix (a+b@w) alike."""
    def part(p: str) -> str:
        name, at, weight = p.rpartition("@") if "@" in p else (p, "", "")
        return (Path(name).name if name.endswith((".jsonl", ".parquet")) else name) + at + weight

    return MIX_SEPARATOR.join(part(p) for p in data.split(MIX_SEPARATOR))


def model_card(*, base_model: str, library: str, family: str, k: int, fmt: str, check: Check | None, floor: float,
               data: dict, command: str, serve: str, where: str) -> str:
    """README.md of an export: hub metadata front matter, then the family, k, the check's acceptance at T=0 and T=1,
    the training data, the command and the vLLM snippet (`serve`: its speculative_config JSON; `where`: the repo id or
    folder it names)."""
    title = TITLES.get(family, family)
    front = "\n".join(["---", f"base_model: {base_model}", f"library_name: {library}", "tags:", "- speculative-decoding",
                       f"- {family}", "- spectool", "---", ""])
    lines = [f"# {title} draft for {base_model}", "",
             f"A speculative-decoding draft ({title}, {fmt} format) that proposes tokens for `{base_model}` to verify; "
             f"made with spectool, checked on vLLM with k={k}. Speculative sampling is exact: the policy's outputs "
             "do not change, only how many tokens each verify step yields.", "", "## Acceptance", ""]
    if check is None:
        lines += ["Not measured: exported with `--no-verify`.", ""]
    else:
        which = "held-out" if check.split == "eval" else "training (the data holds no held-out prompt)"
        lines += ["Mean acceptance length (1 + accepted / drafts), measured by the export's check with this folder "
                  f"loaded into {check.served_by}, {check.prompts} {which} prompts of `{_shared(check.data)}`, "
                  f"{check.tokens} tokens each, k={k}:", "",
                  "| temperature | mean acceptance length | draft proposals |", "|---|---|---|",
                  f"| 0 (greedy) | {check.t0:.2f} | argmax |",
                  f"| 1 (seed {check.seed}) | {check.t1:.2f} | {check.proposals} ({check.proposals_why}) |", "",
                  f"The export is refused below {floor} at T=0 (`--min-acceptance`); T=1, how RL samples, is "
                  "measured and reported, not held to a floor.", ""]
    lines += ["## Training data", ""]
    if data.get("harvest_data") is None:
        lines.append("Not recorded: the draft folder has no init-draft manifest.")
    else:
        r = data.get("rendering") or {}
        lines += [f"- data: `{_shared(data['harvest_data'])}`",
                  f"- records: {data.get('records')} (train {data.get('train_records')}, held out "
                  f"{data.get('eval_records')}): the policy's own completions to its prompts, harvested with spectool",
                  f"- prompts rendered with the policy's chat template; system prompt: {json.dumps(r.get('system_prompt'))}"
                  f", chat template kwargs: {json.dumps(r.get('chat_template_kwargs'))}"]
        if data.get("harvest"):
            lines.append("- harvest settings: " + ", ".join(f"{k} {v}" for k, v in data["harvest"].items()
                                                          if v is not None))
    lines += ["", "## Serving with vLLM", ""]
    if fmt == "speculators":
        lines += [f"The speculators format names its verifier and k: `vllm serve {where}` serves it with "
                  f"`{base_model}`. Or, explicitly:", ""]
    lines += ["```python", "from vllm import LLM", "",
              f"llm = LLM(model={base_model!r}, speculative_config={json.loads(serve)['speculative_config']!r})",
              "```", "", "```bash", f"vllm serve {base_model} --speculative-config '"
              + json.dumps(json.loads(serve)["speculative_config"]) + "'", "```", "",
              "## How it was made", "", "```bash", command, "```", ""]
    return front + "\n".join(lines)


def push(folder: Path, repo: str, message: str) -> str:
    """Upload `folder` (a verified export, already in place) to the hub model repo `repo`, creating it if missing.
    Returns the repo's URL. A failure keeps the folder and says what to do."""
    from huggingface_hub import HfApi  # noqa: PLC0415 (loaded only on this path)

    api = HfApi()
    try:
        url = api.create_repo(repo, repo_type="model", exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo, repo_type="model", commit_message=message)
    except Exception as e:  # noqa: BLE001 - the hub client raises many types (auth, network, offline mode)
        raise SpectoolError(
            f"--push-to-hub {repo}: the upload failed ({type(e).__name__}: {str(e)[:300]}). The verified export is kept "
            f"at {folder}. Check the token (`hf auth login`, or HF_TOKEN with write access to {repo.split('/')[0]}) "
            f"and the network (HF_HUB_OFFLINE must be unset), then upload it with `hf upload {repo} {folder} .` or "
            "run the export again") from None
    return str(url)
