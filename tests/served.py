"""Shared check for the engine tests: a running vLLM drafter proposes what spectool's training
unroll computes for the same tokens."""

from __future__ import annotations

import torch


def assert_addresses_kept(before: dict[str, int], after: dict[str, int]) -> None:
    """Every drafter tensor a CUDA graph may have captured (Engine.draft_addresses) is where it was."""
    moved = sorted(n for n in before if after.get(n) != before[n])
    assert before and not moved and set(after) == set(before), f"moved by the push: {moved}"


def served_vs_trained(engine, policy, draft_dir, tmp_path) -> None:
    """The running drafter's first proposal round (k=2 steps) equals the draft's `unroll`, the
    function drafts are trained through: step 0 at the last prompt position, step 1 on its chain
    (EAGLE-3: two draft forwards) or in the same block (P-EAGLE, DFlash: one forward, 2 rows)."""
    from safetensors.torch import load_file

    from spectool.draft.checkpoint import load_draft
    from spectool.engine.engine import Sampling
    from spectool.hidden import policy_features

    prompt = [1, 7, 42, 99, 100, 5, 17, 300, 12]
    P = len(prompt)
    engine.reset_prefix_cache()
    engine.rpc("spectool_capture_draft_outputs", None)
    outs, _ = engine.generate([prompt], Sampling(n=1, max_tokens=4, temperature=0.0))
    path = tmp_path / "served.safetensors"
    assert engine.rpc("spectool_capture_draft_outputs", str(path))[0] >= 2
    served = load_file(path)  # chain: call j = [1, H], draft step j; parallel: call0 = [k, H], every step
    rows = served["call0"] if served["call0"].shape[0] >= 2 else torch.cat([served["call0"], served["call1"]])
    draft, _ = load_draft(draft_dir, policy)
    with torch.no_grad():
        served0, served1 = draft.lm_head(rows[0]), draft.lm_head(rows[1])  # [Vd] each
        proposal = int(draft.draft_to_target_ids()[served0.argmax()])  # the greedy draft's first token
        ids = torch.tensor([prompt + [outs[0][0].response_ids[0], proposal]])  # [1, P + 2]
        aux, _ = policy_features(policy, ids, draft.config.aux_layer_ids)
        trained = draft.unroll(aux, ids, 2)  # 2 x [1, P + 2, Vd]
        torch.testing.assert_close(trained[0][0, P - 1], served0, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(trained[1][0, P - 1], served1, atol=1e-3, rtol=1e-3)
        assert not torch.allclose(trained[1][0, P - 2], served1, atol=1e-2)  # the comparison has power
