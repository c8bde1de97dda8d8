"""Subcommands for training and merging (filled in by the training work)."""
from __future__ import annotations


def add_subcommands(sub) -> None:
    return None
