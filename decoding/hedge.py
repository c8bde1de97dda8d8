"""Hedge over drafters, with full information (HedgeSpec, "Not-a-Bandit", arXiv 2510.20064): pure functions.

After every verification each drafter i is scored against the tokens the step committed: a_i of
the c committed tokens are its teacher-forced top-1 prediction (``drafting.agreement_together``).
Its loss is l_i = 1 - a_i / c, in [0, 1], and the weights follow the exponential-weights update

    w_i <- w_i * exp(-eta * l_i),   normalised to sum 1        (Hedge, as HedgeSpec runs it)

kept as log-weights. The next step drafts from ``hedge_choice``: the drafter of the highest weight,
ties to the lower index (deterministic, so T=0 runs reproduce). Under a uniform prior that is the
drafter with the least cumulative loss whatever eta (argmax of exp(-eta L_i) = argmin L_i); eta sets
how much evidence overturns a non-uniform prior: under ``mixed-first`` the first drafter (the
mixed/averaged one, where a composition puts it first) starts ``PRIOR_LEAD`` nats ahead, so it keeps
drafting until another has lost PRIOR_LEAD / eta fewer step-losses than it.

The choice reads only tokens already verified, so a hedge step's tree is fixed before its
verification: lossless at T=0 and T>0 like any draft-side routing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

PRIORS = ("uniform", "mixed-first")
RESETS = ("turn", "carry")  # turn: fresh weights at every turn; carry: per prompt, carried across its turns
PRIOR_LEAD = 1.0  # mixed-first: the first drafter's head start in log-weight (nats)


@dataclass(frozen=True)
class HedgeConfig:
    """``eta`` (> 0) the learning rate; ``prior`` one of PRIORS; ``reset`` one of RESETS."""

    eta: float = 0.5
    prior: str = "uniform"
    reset: str = "turn"

    def __post_init__(self):
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int, float)) or not math.isfinite(self.eta) \
                or self.eta <= 0:
            raise ValueError(f"hedge_eta (the learning rate) must be a finite number > 0, got {self.eta!r}")
        if self.prior not in PRIORS:
            raise ValueError(f"hedge_prior must be one of {list(PRIORS)}, got {self.prior!r}")
        if self.reset not in RESETS:
            raise ValueError(f"hedge_reset must be one of {list(RESETS)}, got {self.reset!r}")


def _normalise(log_w: list[float]) -> list[float]:
    """log-weights shifted so the weights sum to 1 (log-sum-exp)."""
    top = max(log_w)
    lse = top + math.log(sum(math.exp(x - top) for x in log_w))
    return [x - lse for x in log_w]


def prior_log_weights(n: int, prior: str) -> list[float]:
    """(n,) normalised log-weights before any evidence: uniform, or the first drafter PRIOR_LEAD ahead."""
    if n < 1:
        raise ValueError(f"hedge needs at least one drafter, got {n}")
    if prior not in PRIORS:
        raise ValueError(f"hedge_prior must be one of {list(PRIORS)}, got {prior!r}")
    lead = PRIOR_LEAD if prior == "mixed-first" else 0.0
    return _normalise([lead] + [0.0] * (n - 1))


def step_losses(agreed: list[float], committed: int) -> list[float]:
    """(n,) l_i = 1 - a_i / c: the share of the c committed tokens drafter i would not have proposed."""
    if committed < 1:
        raise ValueError(f"a hedge step scores at least one committed token, got {committed}")
    if any(not 0 <= a <= committed for a in agreed):
        raise ValueError(f"agreements must lie in [0, {committed}] (the committed tokens), got {agreed}")
    return [1.0 - a / committed for a in agreed]


def hedge_update(log_w: list[float], agreed: list[float], committed: int, eta: float) -> list[float]:
    """One Hedge step: log w_i - eta * l_i, normalised (the exponential-weights update above)."""
    if len(agreed) != len(log_w):
        raise ValueError(f"{len(agreed)} agreements for {len(log_w)} drafters")
    return _normalise([w - eta * loss for w, loss in zip(log_w, step_losses(agreed, committed))])


def hedge_choice(log_w: list[float]) -> int:
    """The drafter of the highest weight; ties go to the lower index."""
    return max(range(len(log_w)), key=lambda i: (log_w[i], -i))
