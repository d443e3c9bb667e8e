"""One exception type for every user-facing error: the CLI prints its message and exits 2."""


class SpectoolError(Exception):
    """An error the user can fix; the message says what to change."""


def check(ok: bool, name: str, value: object, rule: str) -> None:
    """The one validation helper: `name` is the flag (--k) or config key (rollout.group_size) to
    change, `rule` what it must be ("must be >= 1"). Message: "--k=0: must be >= 1"."""
    if not ok:
        raise SpectoolError(f"{name}={value!r}: {rule}")
