"""Turning a completion into a reward: answer extraction and checkers.

Small policies rarely follow an output format, so extraction is forgiving: an explicit
`<answer>...</answer>` tag wins, then the text after the last "Answer:", then the last number.
"""

from __future__ import annotations

import re

_NUM = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def extract_answer(completion: str) -> str | None:
    """The model's final answer in `completion`, or None when it gave none."""
    tag = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.S)
    if tag:
        return tag[-1].strip()
    if "Answer:" in completion:
        tail = completion.rsplit("Answer:", 1)[1].strip()
        line = tail.splitlines()[0].strip() if tail else ""
        return line.rstrip(".") or None
    nums = _NUM.findall(completion)
    return nums[-1].replace(",", "") if nums else None


def math_equal(predicted: str | None, gold: str) -> float:
    """1.0 when `predicted` is mathematically equal to `gold` (math-verify), else 0.0."""
    if predicted is None:
        return 0.0
    from math_verify import parse, verify  # noqa: PLC0415 (heavy, loaded only on this path)

    try:
        gold_p = parse(gold if "$" in gold else f"${gold}$")
        pred_p = parse(predicted if "$" in predicted else f"${predicted}$")
        if gold_p and pred_p and verify(gold_p, pred_p):
            return 1.0
    except Exception:  # noqa: BLE001 - math-verify raises on odd input; that is a wrong answer
        pass
    return float(_norm(predicted) == _norm(gold))


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s).rstrip(".").lower()
