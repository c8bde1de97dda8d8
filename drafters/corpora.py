"""Which training corpora each data variant reads: the one home of that mapping (no heavy imports,
so the dry run's planner can use it without torch)."""
from __future__ import annotations

VARIANTS = ("math", "chat", "mixed_half", "mixed_full")
CORPORA = ("mathinstruct", "sharegpt")  # math, chat
CORPUS_OF = {"math": ("mathinstruct",), "chat": ("sharegpt",), "mixed_half": CORPORA, "mixed_full": CORPORA}


def variant_corpora(variant: str) -> tuple[str, ...]:
    if variant not in CORPUS_OF:
        raise ValueError(f"unknown data variant {variant!r}; choose one of {list(VARIANTS)}")
    return CORPUS_OF[variant]
