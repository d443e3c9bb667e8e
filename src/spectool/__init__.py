"""spectool: the life of a speculative-decoding draft model for RL post-training.

Public library names: `spectool.DraftRefresher` (online draft training inside any RL trainer,
pushed into a running vLLM engine and checked there) and `spectool.RefreshSettings`.
"""

from spectool.version import __version__ as __version__  # the ground floor's (runs.py records it)

__all__ = ["DraftRefresher", "RefreshSettings", "DraftNotLive", "WORKER_EXTENSION"]


def __getattr__(name: str):  # lazy: `import spectool` stays light (no torch until a name is used)
    if name in ("DraftRefresher", "RefreshSettings", "DraftNotLive"):
        from spectool.draft import refresh  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        return getattr(refresh, name)
    if name == "WORKER_EXTENSION":
        from spectool.engine.colocated import WORKER_EXTENSION  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        return WORKER_EXTENSION
    raise AttributeError(f"module 'spectool' has no attribute {name!r}")
