"""One exception type for every user-facing error: the CLI prints its message and exits 2."""


class SpectoolError(Exception):
    """An error the user can fix; the message says what to change."""
