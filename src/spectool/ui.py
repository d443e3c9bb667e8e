"""The one console every command prints through: a terminal's own width, and when the output is a
file or a pipe (CI logs, `| tee`), a width that fits spectool's widest table instead of rich's 80
columns, which cut cells ("rewa…", "+0.1…")."""

from __future__ import annotations

import sys

FILE_WIDTH = 160  # the widest table (train-rl's per-step table) is ~150 columns


def console(stderr: bool = False, soft_wrap: bool = False):
    from rich.console import Console  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, soft_wrap=soft_wrap, width=None if stream.isatty() else FILE_WIDTH)
