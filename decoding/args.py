"""The decoding flags every decoding command shares (``generate``, ``bench``, experiments/) and the
:class:`DecodeConfig` they build."""
from __future__ import annotations

import argparse

from decoding.config import GRANULARITIES, SCORES, SWITCH_TO, TREE_MODES, DecodeConfig, TreeConfig
from decoding.hedge import FEEDBACKS, LEARNERS, PRIORS, RESETS, TIES
from decoding.strategies import STRATEGIES


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """The flags, each defaulting to its DecodeConfig (or TreeConfig) field's default."""
    D = DecodeConfig  # noqa: N806
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the verifier's (and drafters') dtype; default float32 on CPU, the verifier's own "
                        "on GPU. bfloat16 on a CPU halves the bytes a pass streams")
    p.add_argument("--drafter", action="append", default=[],
                   help="drafter checkpoint dir (repeat for routing/merged)")
    p.add_argument("--strategy", default=D.strategy, help=f"one of {sorted(STRATEGIES)}")
    p.add_argument("--routing-granularity", default=D.routing_granularity,
                   help=f"one of {list(GRANULARITIES)}")
    p.add_argument("--routing-decide-steps", type=int, default=D.routing_decide_steps,
                   help="turn/prompt routing: verifier calls whose mean scores decide the route")
    p.add_argument("--merge-dedup", action="store_true",
                   help="merged trees: verify shared prefixes once (trie)")
    p.add_argument("--merge-budget", action="store_true",
                   help="merged trees: rerank the union to --tree-total-tokens (budget-matched; default: "
                        "concatenation)")
    p.add_argument("--route-score", default=D.route_score,
                   help=f"confidence routing score, one of {list(SCORES)}: mean path confidence or mean node "
                        "confidence (the study's)")
    p.add_argument("--switch-after", type=int, default=D.switch_after,
                   help="switching: consecutive steps with nothing accepted before switching (1..5)")
    p.add_argument("--switch-to", default=D.switch_to, help=f"switching: one of {list(SWITCH_TO)}")
    p.add_argument("--switch-depth", type=int, default=D.switch_depth,
                   help="depth_adaptive: deepest level from the mixed (first) drafter (1..tree depth - 1)")
    p.add_argument("--hedge-eta", type=float, default=D.hedge_eta, help="hedge: learning rate (> 0)")
    p.add_argument("--hedge-prior", default=D.hedge_prior,
                   help=f"hedge: one of {list(PRIORS)} (mixed-first: the first drafter starts ahead)")
    p.add_argument("--hedge-reset", default=D.hedge_reset,
                   help=f"hedge: one of {list(RESETS)} (fresh weights every turn, carried across a "
                        "prompt's turns, or across every prompt of the run)")
    p.add_argument("--hedge-learner", default=D.hedge_learner,
                   help=f"hedge: one of {list(LEARNERS)} (decoding/hedge.py; HedgeSpec runs normalhedge)")
    p.add_argument("--hedge-feedback", default=D.hedge_feedback,
                   help=f"hedge: one of {list(FEEDBACKS)} (depth-1 top-1 agreement, or counterfactual "
                        "acceptance "
                        "of each drafter's own draft on the verified path)")
    p.add_argument("--hedge-ties", default=D.hedge_ties,
                   help=f"hedge: one of {list(TIES)} (ftl/ucb ties to the lower index, or stay with the "
                        "current "
                        "drafter, a seeded draw at the start)")
    p.add_argument("--temperature", type=float, default=D.temperature)
    p.add_argument("--top-p", type=float, default=D.top_p)
    p.add_argument("--top-k-sampling", type=int, default=D.top_k_sampling)
    p.add_argument("--max-new-tokens", type=int, default=D.max_new_tokens)
    p.add_argument("--seed", type=int, default=D.seed)
    p.add_argument("--tree-top-k", type=int, default=TreeConfig.top_k)
    p.add_argument("--tree-depth", type=int, default=TreeConfig.depth)
    p.add_argument("--tree-total-tokens", type=int, default=TreeConfig.total_tokens)
    p.add_argument("--tree", dest="tree_mode", choices=TREE_MODES, default=TREE_MODES[0],
                   help="auto: measure this machine and the drafters, pick top_k/depth/total_tokens "
                        "(decoding/autotree.py)")


def decode_config(args) -> DecodeConfig:
    return DecodeConfig(
        strategy=args.strategy, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        routing_granularity=args.routing_granularity, merge_dedup=args.merge_dedup,
        routing_decide_steps=args.routing_decide_steps, merge_budget=args.merge_budget,
        top_k_sampling=args.top_k_sampling, top_p=args.top_p, route_score=args.route_score,
        switch_after=args.switch_after, switch_to=args.switch_to, switch_depth=args.switch_depth,
        hedge_eta=args.hedge_eta, hedge_prior=args.hedge_prior, hedge_reset=args.hedge_reset,
        hedge_learner=args.hedge_learner, hedge_feedback=args.hedge_feedback, hedge_ties=args.hedge_ties,
        tree=TreeConfig(args.tree_top_k, args.tree_depth, args.tree_total_tokens),
    )
