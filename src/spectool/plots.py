"""The one way spectool writes a matplotlib figure (headless)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib  # noqa: PLC0415 (matplotlib only where a plot is drawn)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (matplotlib only where a plot is drawn)

    return plt


def save(fig, path: Path, *legend_axes, legend_size: int = 8) -> None:
    """Legends on `legend_axes`, tight layout, a 120-dpi PNG at `path`, figure closed."""
    for ax in legend_axes:
        ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
