"""How an entry point spells a settings field in its errors: a flag on the command line, a key in rl.yaml, a keyword
of a Python call. A group's `validate(spell)` names the field through `spell`, so one rule has one wording
("--dtype='float64': must be one of ...", "engine.dtype='float64': must be one of ...", "dtype='float64': ...")."""

from __future__ import annotations

from typing import Callable

Spell = Callable[[str], str]  # a field's name -> what the user wrote
TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a text"}  # "must be ..." of a type


def flag(field: str) -> str:
    """The command line's spelling: max_model_len -> --max-model-len."""
    return "--" + field.replace("_", "-")


def key(section: str) -> Spell:
    """rl.yaml's spelling inside `section`: key("engine.")("dtype") -> engine.dtype."""
    return lambda field: section + field


def keyword(field: str) -> str:
    """A Python call's spelling (SpectoolSpeculation's keyword arguments): the field's own name."""
    return field
