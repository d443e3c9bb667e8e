"""train-rl's config: the template loads, overrides apply, bad keys and values are named."""

from pathlib import Path

import pytest

from spectool.errors import SpectoolError
from spectool.rl.config import load_config

TEMPLATE = str(Path(__file__).resolve().parents[1] / "templates" / "rl.yaml")


def test_template_loads_and_overrides_apply():
    cfg = load_config(TEMPLATE, ["speculation.draft=runs/d", "rollout.group_size=4", "policy.lr=2e-6"])
    assert cfg.rollout.group_size == 4 and cfg.policy.lr == 2e-6 and cfg.speculation.draft == "runs/d"


@pytest.mark.parametrize(
    "override,needle",
    [("rollout.group_sise=4", "unknown config key rollout.group_sise"),
     ("rollout.group_size=1", "rollout.group_size"),
     ("rollout.mode=eventually", "rollout.mode"),
     ("policy.lr=fast", "policy.lr"),
     ("speculation.k=0", "speculation.k"),
     ("speculation.draft_sampling=sampled", "speculation.draft_sampling"),
     ("draft_refresh.ttt_steps=2", "draft_refresh.ttt_steps"),
     ("rollout=3", "must be a section"),
     ("prompt_col=", "prompt_col=None: must be a column name"),
     ('answer_col=" "', "answer_col=' ': must be a column name")],
)
def test_bad_keys_and_values_are_named(override, needle):
    with pytest.raises(SpectoolError, match=needle.replace(".", r"\.")):
        load_config(TEMPLATE, ["speculation.draft=runs/d", override])


def test_speculation_needs_a_draft_unless_it_is_switched_off():
    with pytest.raises(SpectoolError, match="speculation.draft"):
        load_config(TEMPLATE)
    assert not load_config(TEMPLATE, ["speculation.enabled=false"]).speculation.enabled
    with pytest.raises(SpectoolError, match="speculation is switched off by speculation.enabled: false"):
        load_config(TEMPLATE, ["speculation.draft=runs/d", "draft_refresh.mode=off"])


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(SpectoolError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(SpectoolError, match="not valid YAML"):
        load_config(str(bad))


def test_the_template_documents_every_key_with_the_dataclass_defaults():
    """templates/rl.yaml is the documentation of train-rl's settings: every key of RLConfig, each
    with a comment, each at its default."""
    import yaml

    from spectool.rl.config import RLConfig
    from spectool.runs import flatten_keys

    text = open(TEMPLATE).read()
    tree = yaml.safe_load(text)
    defaults = flatten_keys(RLConfig().as_dict())
    assert flatten_keys(tree) == defaults
    section = ""
    commented = set()
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key = line.split(":")[0].strip()
        if not line.startswith(" "):
            section = key + "." if line.rstrip().endswith(":") else ""
        if "#" in line:
            commented.add(key if not line.startswith(" ") else section + key)
    missing = sorted(k for k in defaults if k not in commented)
    assert not missing, f"keys without a comment in {TEMPLATE}: {missing}"
