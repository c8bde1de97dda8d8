"""Which examples a run trains and is judged on: ``DataSpec``, the data settings every features, train and
vocabulary unit reads, declared and checked once (torch-free; the profile's ``data`` section inherits it and
adds where the features live). It crosses Ray as itself."""
from __future__ import annotations

from dataclasses import dataclass

from common.rules import check, integer, one_of

DISTILL_MODES = ("greedy", "sample")  # self-distilled answers: the verifier's greedy or sampled ones


@dataclass(frozen=True)
class DataSpec:
    n: int = 64  # examples per domain (the study: 70,000)
    heldout: int = 16  # held-out examples per domain (drafters/train/backbones.py judges on them)
    max_length: int = 256  # tokens per example, at most
    seed: int = 42  # the one permutation per corpus that picks train and held-out examples
    # null | greedy | sample: train on the verifier's own answers (held-out stays original; distill.py)
    self_distill: str | None = None

    RULES = {"n": integer(2), "heldout": integer(1), "max_length": integer(16), "seed": integer(0),
             "self_distill": one_of(None, *DISTILL_MODES)}
    PREFIX = ""  # before a field's name in a refusal (the profile's section: "data.")

    def __post_init__(self):
        check(self, self.PREFIX)
