"""The peer benchmark's data (benchmarks/peer_speculators.py): a spectool harvest as speculators 0.9's
offline dataset, read back by speculators' own ArrowDataset, in the layer convention its trainer and
vLLM's speculators loader assume; and speculators' trainer running on this CPU through
benchmarks/speculators_cpu.py, its checkpoint a folder spectool serves as that family."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_policy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("speculators", reason="scripts/setup.sh installs speculators 0.9.0")


@pytest.fixture(scope="module")
def policy8(tmp_path_factory) -> Path:
    """8 layers: spectool's and speculators' default aux layers agree ([2, 4, 5]), as on SmolLM2."""
    return make_policy(tmp_path_factory.mktemp("policy8"), layers=8)


@pytest.fixture(scope="module")
def peer_data(policy8, tmp_path_factory) -> tuple[Path, dict]:
    from peer_speculators import speculators_data
    from spectool.records import write_shard

    torch.manual_seed(0)
    rows = []
    for i in range(6):
        prompt, resp = torch.randint(5, 500, (4 + i,)).tolist(), torch.randint(5, 500, (10 + i,)).tolist()
        rows.append(dict(prompt_id=f"{i:016x}", sample_idx=0, prompt="p", answer="", prompt_ids=prompt,
                         response_ids=resp, logprobs=[0.0] * len(resp), reward=0.0, finish_reason="length",
                         response=""))
    root = tmp_path_factory.mktemp("peer")
    write_shard(root / "harvest", 0, rows)
    info = speculators_data(root / "harvest", root / "spec", str(policy8))
    return root / "spec" / "data", info


def test_speculators_reads_every_row_in_the_layer_convention_it_trains_on(policy8, peer_data):
    from speculators.train.data import ArrowDataset
    from transformers import AutoModelForCausalLM

    data, info = peer_data
    assert info["rows"] == 6 and info["layers"] == [2, 4, 5, 8]
    ds = ArrowDataset(max_len=512, datapath=data, on_missing="raise", hidden_states_dtype=torch.float32)
    policy = AutoModelForCausalLM.from_pretrained(policy8, dtype=torch.float32).eval()
    H = policy.config.hidden_size
    for i in range(len(ds)):
        item = ds[i]
        ids = item["input_ids"]
        assert item["hidden_states"].shape == (len(ids), 3 * H)  # [seq, 3 * H]: the aux layers
        i = (len(ids) - 14) // 2  # row i: a prompt of 4 + i tokens, a response of 10 + i
        assert item["loss_mask"].tolist() == [0] * (4 + i) + [1] * (10 + i)  # the response only
        with torch.no_grad():
            out = policy(ids[None], output_hidden_states=True)
        # aux id i is the input of decoder layer i (vLLM's convention, what speculators' ids mean in vLLM)
        want = torch.cat([out.hidden_states[j][0] for j in (2, 4, 5)], dim=-1)
        aux, last = item["hidden_states"].float(), item["verifier_last_hidden_states"].float()  # stored float16
        torch.testing.assert_close(aux, want, atol=2e-2, rtol=2e-2)
        # the last is the residual before the final norm: speculators' verifier_norm + head give the logits
        logits = policy.lm_head(policy.model.norm(last))
        torch.testing.assert_close(logits, out.logits[0], atol=5e-2, rtol=5e-2)
        # a shifted layer must not pass: the check can fail
        assert not torch.allclose(aux[:, :H], out.hidden_states[3][0], atol=2e-2)


@pytest.mark.e2e  # the speculators trainer in its own process
def test_speculators_trainer_runs_on_a_cpu_and_spectool_serves_its_family(policy8, peer_data, tmp_path):
    from spectool.families import folder_family

    data, _ = peer_data
    save = tmp_path / "eagle3"
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speculators_cpu.py"), "--verifier-name-or-path", str(policy8),
         "--data-path", str(data), "--speculator-type", "eagle3", "--save-path", str(save), "--log-dir",
         str(tmp_path / "logs"), "--epochs", "1", "--max-steps", "2", "--num-layers", "1", "--draft-attn-impl", "sdpa",
         "--loss-implementation", "eager", "--hidden-states-dtype", "float32", "--total-seq-len", "64",
         "--num-workers", "0", "--train-data-ratio", "0.8", "--seed", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert folder_family(save / "0") == "eagle3"
