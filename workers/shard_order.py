"""The order in which one rank's prefetched shards take room on its node (workers/shard_cache.py)."""
from __future__ import annotations

import threading


class ShardOrder:
    """The order in which one rank's shards take room on the node: the plan's. A prefetch reserves
    room only once every shard before it in the plan has (or is on disk, or was passed), so a later
    shard never takes the room an earlier one needs; one that finds no room ends the round (the
    prefetches waiting behind it give up, to be tried again as the rank moves on)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.round = 0
        self.turn = 0
        self.decided = set()
        self.closed = False

    def _move(self) -> None:
        while self.turn in self.decided:
            self.turn += 1
        self.cond.notify_all()

    def restart(self) -> None:
        """A new plan: indices start again at 0."""
        with self.cond:
            self.round += 1
            self.turn = 0
            self.decided = set()
            self.cond.notify_all()

    def passed(self, index: int) -> None:
        """The rank opens shard ``index``: every shard before it is behind it."""
        with self.cond:
            self.decided.update(range(self.turn, index))
            self._move()

    def decide(self, index: int | None) -> None:
        """Shard ``index`` has its room (or is on disk)."""
        if index is not None:
            with self.cond:
                self.decided.add(index)
                self._move()

    def fail(self, round_: int) -> None:
        with self.cond:
            if round_ == self.round:
                self.round += 1
                self.cond.notify_all()

    def wait(self, index: int, round_: int) -> bool:
        """Block until shard ``index`` may take room; False when its round ended first."""
        with self.cond:
            self.cond.wait_for(lambda: self.turn >= index or self.round != round_ or self.closed)
            return self.round == round_ and not self.closed

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
