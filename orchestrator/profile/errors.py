"""A refused profile: one line, and the dotted key at fault."""
from __future__ import annotations


class ProfileError(ValueError):
    """A refused profile; ``key`` is the dotted profile key at fault (None: the file as a whole)."""

    def __init__(self, msg: str, key: str | None = None):
        super().__init__(msg)
        self.key = key


def need(cond: bool, msg: str, key: str | None = None) -> None:
    if not cond:
        raise ProfileError(msg, key)
