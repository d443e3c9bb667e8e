"""`spectool harvest`: the policy's own rollouts on in-domain prompts, stored as a resumable run
(the workflow is the library's harvesting.harvest, which init-draft also uses)."""

from __future__ import annotations

from spectool.context import describe_finish
from spectool.harvesting import HarvestConfig, HarvestResult, harvest
from spectool.ui import console

__all__ = ["HarvestConfig", "run", "render"]


def run(cfg: HarvestConfig) -> HarvestResult:
    return harvest(cfg)


def render(r: HarvestResult) -> None:
    c = console(soft_wrap=True)
    c.print(f"[bold]harvest[/] {r.out}: {r.n_records} records ({r.n_new} new), mean reward {r.mean_reward:.3f}, "
            f"{r.tokens_per_s:.1f} generated tokens/s")
    if r.finish_reasons:
        c.print(f"completions ended: {describe_finish(r.finish_reasons)}", highlight=False)
    if r.hidden_bytes_per_token:
        c.print(f"hidden states: {r.hidden_bytes_per_token / 1024:.2f} KiB per token (2 bytes a value, 3 aux layers + last)")
