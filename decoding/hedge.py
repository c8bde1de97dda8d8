"""Online routing over drafters (HedgeSpec, "Not-a-Bandit", arXiv 2510.20064): the learners, as pure
functions over host lists (torch-free; the feedback's tensor functions are in decoding/accept.py).

After every verification each drafter gets a gain g_i in [0, 1] (its loss is 1 - g_i), by one of two
feedbacks (``FEEDBACKS``):

- ``agreement`` (the project's first signal): a_i of the c committed tokens are its teacher-forced
  top-1 prediction (depth 1, the verifier's features before each): g_i = a_i / c.
- ``acceptance`` (HedgeSpec's): the drafter's counterfactual acceptance on the verified path, from its
  own multi-step draft (``drafting.acceptance_together``, ``accept.position_acceptance``): E_i
  expected tokens accepted over the first d = min(c, tree depth) committed positions: g_i = E_i / depth.

The learners (``LEARNERS``), each choosing the drafter that drafts the next step:

- ``ftl``, Follow-the-Leader (the project's first learner): the drafter of the highest log-weight
  prior - eta * cumulative loss. Under a uniform prior that is the least cumulative loss whatever eta;
  under ``mixed-first`` the first drafter starts ``PRIOR_LEAD`` nats ahead (PRIOR_LEAD / eta losses).
- ``hedge``: exponential weights w_i ∝ prior * exp(-eta * cumulative loss); the choice is a seeded
  draw from w (so eta matters: the learning rate, default 0.5 ~ sqrt(8 ln 2 / 20 steps a turn)).
- ``normalhedge`` (Chaudhuri, Freund and Hsu 2009; the learner HedgeSpec runs): no learning rate.
  R_i is drafter i's cumulative regret (the learner's expected loss under its weights minus i's,
  summed over steps); c > 0 solves mean_i exp([R_i]+^2 / (2c)) = e (bisection); the weights are
  w_i ∝ ([R_i]+ / c) exp([R_i]+^2 / (2c)); the choice is a seeded draw from w. No drafter with
  positive regret (the start): the tie rule among all.
- ``ucb``, a bandit (UCB1, as MetaSD): it sees only the chosen drafter's realised acceptance (the
  draft tokens its step accepted / tree depth), mean + sqrt(2 ln t / n_i), untried drafters first.
  It drafts nothing for the others and runs no feedback pass.

Ties of ``ftl`` and ``ucb`` (``TIES``): ``lower`` (the lower index; the first learner's rule, which
gives the default pair's ``math`` every tie) or ``stay`` (stay with the drafter that drafted the last
step; with none, a seeded draw among the tied). Draws come from a generator seeded per turn from the
decode seed and the prompt (engine: ``prompt_seed``), never from the verifier's sampler. Every choice
reads only tokens already verified (and the seeded draw), so each tree is fixed before its
verification: lossless at T=0 and T>0 like any draft-side routing. ``reset``: fresh weights at every
turn (``turn``); carried across a prompt's turns, a new prompt starting afresh (``carry``); or carried
across every prompt one decoder answers (``stream``: a request stream of one task, as a deployment
serving that task sees it; in the grid, the prompts of one eval shard in benchmark order, so a prompt's
choices depend on the prompts before it in its shard, and the shard size is part of the cell).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

PRIORS = ("uniform", "mixed-first")
# turn: fresh weights at every turn; carry: per prompt, carried across its turns; stream: carried across
# every prompt of one decoder (an eval shard)
RESETS = ("turn", "carry", "stream")
FEEDBACKS = ("agreement", "acceptance")
LEARNERS = ("ftl", "hedge", "normalhedge", "ucb")
TIES = ("lower", "stay")
SAMPLED = ("hedge", "normalhedge")  # the choice is a seeded draw from the weights
BANDITS = ("ucb",)  # see only the chosen drafter's acceptance: no feedback pass
PRIOR_LEAD = 1.0  # mixed-first: the first drafter's head start in log-weight (nats)


@dataclass(frozen=True)
class HedgeConfig:
    """``eta`` (> 0) the learning rate (``hedge``; ``ftl``'s prior scale); ``prior`` one of PRIORS
    (mixed-first: ``ftl`` and ``hedge`` only); ``reset`` one of RESETS; ``learner`` one of LEARNERS;
    ``feedback`` one of FEEDBACKS; ``ties`` one of TIES. The defaults are the first online router's
    (ftl on agreement, ties to the lower index), so the grid's keys of earlier runs stay valid."""

    eta: float = 0.5
    prior: str = "uniform"
    reset: str = "turn"
    learner: str = "ftl"
    feedback: str = "agreement"
    ties: str = "lower"

    def __post_init__(self):
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int,
                                                                   float)) or not math.isfinite(self.eta) \
                or self.eta <= 0:
            raise ValueError(f"hedge_eta (the learning rate) must be a finite number > 0, got {self.eta!r}")
        for name, allowed in (("prior", PRIORS), ("reset", RESETS), ("learner", LEARNERS), ("feedback",
                FEEDBACKS),
                              ("ties", TIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"hedge_{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.prior != "uniform" and self.learner not in ("ftl", "hedge"):
            raise ValueError(f"hedge_prior {self.prior!r} weights the start of ftl and hedge; hedge_learner "
                             f"{self.learner!r} has no prior (use uniform)")

    @property
    def label(self) -> str:
        """The options away from the defaults, for names ("" at the defaults: the first router)."""
        if self == HedgeConfig():
            return ""
        parts = [self.learner, self.feedback if self.learner not in BANDITS else "bandit"]
        parts += [f"eta={self.eta:g}"] if self.learner in ("hedge",) or self.prior != "uniform" else []
        parts += [self.prior] if self.prior != "uniform" else []
        parts += [f"ties={self.ties}"] if self.learner in ("ftl", "ucb", "normalhedge") else []
        parts += [self.reset] if self.reset != "turn" else []
        return ", ".join(parts)


@dataclass(frozen=True)
class LearnerState:
    """What a learner knows after some steps (per drafter): ``log_w`` prior - eta * cumulative loss
    (ftl, hedge; normalised), ``regret`` cumulative regret (normalhedge), ``pulls`` and ``gains`` the
    chosen drafter's steps and summed gains (ucb), and ``current`` the drafter that drafted last."""

    log_w: tuple
    regret: tuple
    pulls: tuple
    gains: tuple
    current: int | None = None


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


def acceptance_gains(expected: list[float], depth: int) -> list[float]:
    """(n,) g_i = E_i / depth: counterfactual tokens accepted over the tree's depth, in [0, 1]."""
    if depth < 1:
        raise ValueError(f"a tree depth is >= 1, got {depth}")
    if any(not -1e-6 <= e <= depth + 1e-6 for e in expected):
        raise ValueError(f"expected accepted lengths must lie in [0, {depth}] (the tree depth), got "
                         f"{expected}")
    return [min(1.0, max(0.0, e / depth)) for e in expected]


def hedge_update(log_w: list[float], agreed: list[float], committed: int, eta: float) -> list[float]:
    """One Hedge step on agreement: log w_i - eta * l_i, normalised (the exponential-weights update)."""
    if len(agreed) != len(log_w):
        raise ValueError(f"{len(agreed)} agreements for {len(log_w)} drafters")
    return _normalise([w - eta * loss for w, loss in zip(log_w, step_losses(agreed, committed))])


def hedge_choice(log_w: list[float]) -> int:
    """The drafter of the highest weight; ties go to the lower index."""
    return max(range(len(log_w)), key=lambda i: (log_w[i], -i))


def normalhedge_scale(regret: list[float], tol: float = 1e-12) -> float | None:
    """c > 0 with mean_i exp([R_i]+^2 / (2c)) = e, by bisection (None: no positive regret).

    The left side falls in c; with M = max [R]+ the root lies in [M^2 / (2 ln(n(e - 1) + 1)), M^2 / 2]
    (one drafter at M and the others at 0; every drafter at M), so the exponent never exceeds
    ln(n(e - 1) + 1): no overflow."""
    pos = [max(0.0, r) for r in regret]
    top = max(pos)
    if top <= 0:
        return None
    n = len(pos)

    def excess(c: float) -> float:
        return sum(math.exp(r * r / (2 * c)) for r in pos) / n - math.e

    lo, hi = top * top / (2 * math.log(n * (math.e - 1) + 1)), top * top / 2
    for _ in range(200):
        mid = math.sqrt(lo * hi)  # bisection on log c: the bracket spans a fixed ratio
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= tol * hi:
            break
    return math.sqrt(lo * hi)


def normalhedge_weights(regret: list[float]) -> list[float] | None:
    """w_i ∝ ([R_i]+ / c) exp([R_i]+^2 / (2c)), summing to 1 (None: no positive regret)."""
    c = normalhedge_scale(regret)
    if c is None:
        return None
    raw = [(max(0.0, r) / c) * math.exp(max(0.0, r) ** 2 / (2 * c)) for r in regret]
    total = sum(raw)
    return [x / total for x in raw]


def ucb_scores(pulls: list[int], gains: list[float]) -> list[float]:
    """UCB1: mean gain + sqrt(2 ln t / n_i), t the steps so far; +inf for a drafter never chosen."""
    t = sum(pulls)
    return [math.inf if n == 0 else g / n + math.sqrt(2 * math.log(max(t, 1)) / n) for n, g in zip(pulls,
            gains)]


def start_state(n: int, cfg: HedgeConfig) -> LearnerState:
    """A learner that has seen nothing, over ``n`` drafters."""
    return LearnerState(tuple(prior_log_weights(n, cfg.prior)), (0.0,) * n, (0,) * n, (0.0,) * n)


def weights(state: LearnerState, cfg: HedgeConfig) -> list[float] | None:
    """The distribution a sampled learner draws from (None: ``normalhedge`` without positive regret)."""
    if cfg.learner == "normalhedge":
        return normalhedge_weights(list(state.regret))
    w = [math.exp(x) for x in state.log_w]
    return [x / sum(w) for x in w]


def learn(state: LearnerState, cfg: HedgeConfig, gains: list[float]) -> LearnerState:
    """A full-information step: every drafter's gain g_i in [0, 1] (loss 1 - g_i)."""
    if len(gains) != len(state.log_w):
        raise ValueError(f"{len(gains)} gains for {len(state.log_w)} drafters")
    if any(not 0 <= g <= 1 for g in gains):
        raise ValueError(f"gains must lie in [0, 1], got {gains}")
    losses = [1.0 - g for g in gains]
    if cfg.learner == "normalhedge":
        # no positive regret: uniform (the paper's)
        w = weights(state, cfg) or [1.0 / len(gains)] * len(gains)
        mine = sum(p * loss for p, loss in zip(w, losses))  # the learner's expected loss this step
        return replace(state, regret=tuple(r + mine - loss for r, loss in zip(state.regret, losses)))
    log_w = _normalise([w - cfg.eta * loss for w, loss in zip(state.log_w, losses)])
    return replace(state, log_w=tuple(log_w))


def learn_chosen(state: LearnerState, chosen: int, gain: float) -> LearnerState:
    """A bandit step: only the chosen drafter's gain (its realised acceptance over the tree depth)."""
    pulls, gains = list(state.pulls), list(state.gains)
    pulls[chosen] += 1
    gains[chosen] += min(1.0, max(0.0, gain))
    return replace(state, pulls=tuple(pulls), gains=tuple(gains))


def _tie(best: list[int], state: LearnerState, cfg: HedgeConfig, draw: float) -> int:
    """One of the tied drafters ``best`` (ascending): the lower index, or the current one, else a draw."""
    if cfg.ties == "lower":
        return best[0]
    if state.current in best:
        return state.current
    return best[min(int(draw * len(best)), len(best) - 1)]


def _argmax(scores: list[float], state: LearnerState, cfg: HedgeConfig, draw: float) -> int:
    top = max(scores)
    return _tie([i for i, s in enumerate(scores) if s == top], state, cfg, draw)


def choose(state: LearnerState, cfg: HedgeConfig, draw: float) -> int:
    """The drafter that drafts the next step. ``draw``: a uniform number in [0, 1) from the seeded
    generator (the sampled learners' draw; a tie's draw under ``stay``)."""
    if not 0 <= draw < 1:
        raise ValueError(f"draw must lie in [0, 1), got {draw}")
    if cfg.learner == "ftl":
        return _argmax(list(state.log_w), state, cfg, draw)
    if cfg.learner == "ucb":
        return _argmax(ucb_scores(list(state.pulls), list(state.gains)), state, cfg, draw)
    w = weights(state, cfg)
    if w is None:  # normalhedge, no positive regret yet: every drafter tied
        return _tie(list(range(len(state.log_w))), state, cfg, draw)
    acc = 0.0
    for i, p in enumerate(w):  # inverse CDF
        acc += p
        if draw < acc:
            return i
    return max(i for i, p in enumerate(w) if p > 0)
