"""The report's fixed prose: what each table's columns mean, beside the table (build.py places them)."""
from __future__ import annotations

from orchestrator.report.labels import HEADS_LAST, POSTHOC, ROUTED, SPEED_ROUTED
from orchestrator.report.routers import NOT_DEPLOYABLE

INTRO = (" 95% CIs are percentile bootstraps over prompts (2,000 resamples). Raw per-prompt rows: "
         "`traces/prompts`, per-call rows: `traces/steps`; every table below is also in `tables/` "
         "(CSV and Parquet); the long ones are in `report_appendix.md`.\n")
TAU_NOTE = ("τ (ours, the headline) = tokens committed by tree-verification passes (accepted draft tokens + "
            "the "
            "verifier's bonus token) / number of passes, prefill excluded, a ratio of sums over a cell's "
            "prompts. "
            "`tau_taps` is τ as the study's code computes its tables (TAPS `scripts/compute_tau.py`): the "
            "same "
            "tokens over the sum of each turn's decode-loop index at exit, counted from 0, i.e. passes - 1 "
            "per "
            "turn, so tau_taps = τ · P / (P - T) over a cell's P passes and T turns (slightly above τ: "
            "+0.2 at τ 3 with 16 passes a turn); every comparison with the study's numbers uses it. "
            "`tau_study` is the study's text's wording (accepted draft tokens per pass, bonus excluded, "
            "mean over prompts): about τ - 1, so about one token below the numbers the study's tables print. "
            "The headline table gives τ and, in brackets, tau_taps.")
LAMBDA_NOTE = ("Weight averaging θ = λ·θ_math + (1-λ)·θ_chat (`drafters/merge.py`; λ = 0 is the chat "
               "drafter's weights, λ = 1 the math drafter's, each evaluated as a drafter of its own), one "
               "point per λ of `merge.lambdas`; dashed: both specialists and the mixed drafter. The table "
               "has "
               "every λ (τ [95% CI] per benchmark; `tables/fig6_lambda_*`).\n")
RQ3C_SCALE = ("**RQ3c at scale**: this verdict is this run's (its verifier and data sizes are in "
              "`profile.json`). "
              "At the study's scale (Llama-3-8B with the study's data, the `paper` profile) this project "
              "would "
              "call averaging the weakest if the averaged drafter's τ were below every specialist and the "
              "mixed "
              "drafter on every benchmark, each paired 95% CI excluding 0 (`RQ3c-cells` holding in every "
              "cell), "
              "with no λ of the sweep reaching the better specialist (Figure 6). That test is the "
              "project's: the "
              "study reports no intervals, and its own Table 1 has a cell where averaging is not the worst "
              "(HASS, T=1, SVAMP: 2.69 above MathInstruct's 2.46).\n")
CLAIMS_NOTE = ("`p_value`: two-sided percentile-bootstrap p of a zero difference (min(1, 2 x the smaller "
               "share "
               "of 10,000 resamples on either side of 0), never below 1/(B+1)). `p_holm` / `verdict_holm`: "
               "Holm-Bonferroni step-down within the row's `family`: `study` (the study's claims; its size "
               "is fixed "
               "by the profile's grid, and a hypothesis without data counts as untested, p = 1) or "
               "`exploratory` "
               "(the proposed next experiments and the project's own routers), family-wise 5%; a conclusive "
               "verdict whose p_holm is above 0.05 reads `inconclusive (Holm)`. `study`: the study's own "
               "numbers "
               "for the row's backbone, temperature and benchmark (`orchestrator/report/study_tables.csv`); "
               "`study_consistent`: whether they agree with the claim's wording (false: the study "
               "contradicts its "
               "own claim there; empty: no number for that cell).\n")
SPEED_NOTE = ("`speedup` is tokens/s over transformers' `generate` (greedy at T=0, sampling at T>0) on the "
              "same "
              "inputs in the same actor: timed by the cell itself next to each of its inputs where "
              "`paired_baseline` "
              "(profile key `eval.paired_baseline`), else by the autoregressive cell of its benchmark and "
              "temperature. "
              "`vs_autoregressive` is over the project's own autoregressive loop. `outputs_equal_generate`: "
              "the share "
              "of prompts whose T=0 output equals generate's token for token.\n")
TABLE2_NOTE = ("One row per router, benchmark and drafter chosen: `prompts` routed to it of `of` (a prompt's "
               "choice: its turns' majority, ties to the first drafter; the study's Table 2 counts prompts; "
               "a "
               "per-turn router's `..., last turn)` row takes each prompt's last turn's choice, as the "
               "study's "
               "code records its entropy router's head), "
               "`step_share` the share of verifier calls for routers that choose per call or per turn, "
               "`matched` whether it is the matched specialist, `study_matched_share` the study's Table 2 "
               "share "
               f"(EAGLE-2, T=0) beside its two routers as its code ran them (`{POSTHOC}`, `{HEADS_LAST}`).\n")
# how every average over benchmarks in the report weights them (tables.weights; the claims' too)
AVERAGE_W = ("1 chat : 3 math, as the study's Table 1 average (its plain mean over MT-Bench and three math "
             "benchmarks)")
STUDY_NOTE = ("The study's verifier is Llama-3-8B-Instruct with 70k examples per domain; `our_tau` is this "
              "run's "
              "(for `average`: over the benchmarks present, 1 chat : 3 math). Source: arXiv 2603.27027 and "
              "TAPS's "
              "README, every "
              "cell in `orchestrator/report/study_tables.csv` (where the two disagree, one row per source; "
              "docs/study.md lists them); all of them in `tables/study_vs_ours.csv`. ")
CLAIMS_SUMMARY = ("**Claims of the study** (prompt-level paired bootstrap; one comparison: estimate [95% CI] "
                  "and verdict; several (per benchmark or per drafter pair): verdict counts; every "
                  "comparison "
                  "with its CI in the appendix)\n")


def routing_headline() -> str:
    return (f"**Routing**: the headline routing row (RQ3a, RQ3b, RQ4) is `{ROUTED}`, the router behind the "
            "study's "
            f"Table 1 \"confidence routed\" numbers (its code's post hoc router): {NOT_DEPLOYABLE}. The "
            "speed claim "
            f"times `{SPEED_ROUTED}`, the study's text's deployable router. Every router is in Tables 1 and "
            "2 by "
            "name (the routers section below says what each is).\n")
