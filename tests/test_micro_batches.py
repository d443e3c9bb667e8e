"""A training step's micro-batches (draft/ttt.py packed_batches, micro_batches: init-draft's --max-batch-tokens and
the online refresh's draft_refresh.max_batch_tokens): records packed up to the token budget and never past it (a
longer record alone), a budget filled exactly is one forward, and each micro-batch weighted by its share of the
step's response tokens, the tokens the loss averages over. (That the weighted split trains as the whole batch:
tests/test_refresh.py.)"""

from __future__ import annotations

import pytest

from spectool.draft.ttt import micro_batches, packed_batches


def test_records_are_packed_up_to_the_budget_and_never_past_it():
    assert packed_batches([5, 5, 10], 10) == [[0, 1], [2]]  # two records that fill the budget exactly: one forward
    lengths = [700, 300, 120, 880, 1000, 2500]
    batches = packed_batches(lengths, 1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # every record once
    assert all(sum(lengths[i] for i in b) <= 1000 for b in batches if len(b) > 1)
    assert [5] in batches and [4] in batches  # 2,500 tokens alone; 1,000 fills it alone
    assert len(batches) == 5  # 120 + 300 share one; nothing else fits beside another


def test_a_step_within_the_budget_is_one_forward_and_a_larger_one_is_split_by_response_share():
    assert micro_batches([400, 600], [100, 500], 1000) == [([0, 1], 1.0)]  # exactly the budget: whole
    split = micro_batches([400, 600], [100, 500], 900)  # 1,000 tokens: each record alone
    # response tokens 300 and 100: the loss's mean over the step's 400 is 3/4 of the first's mean + 1/4 of the other's
    assert split == [([0], pytest.approx(0.75)), ([1], pytest.approx(0.25))]
    assert micro_batches([600, 600], [100, 100], 1000) == [([0], 0.5), ([1], 0.5)]  # each fits, both do not
