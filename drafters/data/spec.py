"""Which examples a run trains and is judged on: ``DataSpec``, the data settings every features, train and
vocabulary unit reads, declared and checked once (torch-free; the profile's ``data`` section inherits it and
adds where the features live). It crosses Ray as itself."""
from __future__ import annotations

from dataclasses import dataclass

from common.rules import check, integer, one_of, optional, subset
from drafters.corpora import CORPORA

DISTILL_MODES = ("greedy", "sample")  # self-distilled answers: the verifier's greedy or sampled ones


@dataclass(frozen=True)
class DataSpec:
    n: int = 64  # examples per domain (the study: 70,000)
    heldout: int = 16  # held-out examples per domain (drafters/train/backbones.py judges on them)
    max_length: int = 256  # tokens per example, at most
    seed: int = 42  # the one permutation per corpus that picks train and held-out examples
    # null | greedy | sample: train on the verifier's own answers (held-out stays original; distill.py)
    self_distill: str | None = None
    # the corpora self_distill regenerates (null: every corpus); the others keep their original answers
    self_distill_corpora: list | None = None

    RULES = {"n": integer(2), "heldout": integer(1), "max_length": integer(16), "seed": integer(0),
             "self_distill": one_of(None, *DISTILL_MODES), "self_distill_corpora": optional(subset(CORPORA))}
    PREFIX = ""  # before a field's name in a refusal (the profile's section: "data.")

    def __post_init__(self):
        check(self, self.PREFIX)
        if self.self_distill_corpora is not None and not self.self_distill:
            raise ValueError(f"{self.PREFIX}self_distill_corpora names the corpora self_distill regenerates, "
                             f"but {self.PREFIX}self_distill is null (set greedy or sample)")

    def distills(self, corpus: str) -> str | None:
        """The self-distillation mode of ``corpus``'s training answers (None: its original answers)."""
        if self.self_distill_corpora is not None and corpus not in self.self_distill_corpora:
            return None
        return self.self_distill
