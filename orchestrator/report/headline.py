"""The report's first lines: what a first run shows, in three sentences. The speedup over
transformers' ``generate`` at T=0 of the deployable strategy the profile named before the run
(``report.headline_strategy``, read with its ``report.headline_tree``), with a prompt-level
bootstrap interval; the home specialists' τ (math on the math benchmarks, chat on MT-Bench, the
profile's fixed tree); and the claims that concluded under Holm. Inconclusive claims are left to
the tables below."""
from __future__ import annotations

import numpy as np
import polars as pl

from orchestrator.report.stats import B, canonical, data_rng
from orchestrator.report.tables import MATH_BENCH, STUDY_W, weights
from orchestrator.report.verdicts import estimate_text, verdict_word

CONCLUSIVE = ("holds", "does not hold")
AUTO = " [tree auto]"  # tables.method_expr's mark of a tree-auto cell


def home(bench: str) -> str:
    """The specialist trained for a benchmark's domain."""
    return "math" if bench in MATH_BENCH else "chat"


def _generate_rows(pp: pl.DataFrame) -> pl.DataFrame:
    """Per (benchmark, prompt) at T=0: generate's tokens and seconds as the autoregressive cell timed them."""
    return (pp.filter((pl.col("method") == "autoregressive") & (pl.col("temperature") == 0)
                      & (pl.col("generate_wall_time_s").fill_null(0) > 0))
            .select("benchmark", "prompt_id", pl.col("generate_tokens").alias("g_tok"),
                    pl.col("generate_wall_time_s").alias("g_s")))


def headline_rows(pp: pl.DataFrame, backbone: str, strategy: str, tree: str) -> pl.DataFrame:
    """The named strategy's T=0 rows of ``backbone`` (single: each benchmark's home specialist), each with
    the generate timing it is divided by: its own where the cell timed generate (eval.paired_baseline),
    else the autoregressive cell's on the same prompt."""
    auto = pl.col("method").str.ends_with(AUTO)
    own = pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == 0)
                    & (pl.col("strategy") == strategy) & (auto if tree == "auto" else ~auto))
    if strategy == "single":
        own = own.filter(pl.col("drafter") == pl.col("benchmark").map_elements(home, return_dtype=pl.String))
    if own.is_empty():
        return own
    gen = _generate_rows(pp)
    rows = own.join(gen, on=["benchmark", "prompt_id"], how="left")
    paired = pl.col("generate_wall_time_s").fill_null(0) > 0
    own_or = lambda mine, theirs: pl.when(paired).then(pl.col(mine)).otherwise(pl.col(theirs))  # noqa: E731
    return rows.with_columns(own_or("generate_tokens", "g_tok").alias("g_tok"),
                             own_or("generate_wall_time_s", "g_s").alias("g_s"))


def speedup_ci(rows: pl.DataFrame, b: int = B) -> dict:
    """(tokens/s of the strategy) / (tokens/s of generate), ratios of sums over each benchmark's prompts,
    per benchmark and as their mean weighted as the τ averages (``tables.weights``: 1 chat : 3 math where
    both kinds are present), each with a 95% percentile bootstrap over prompts (paired: a prompt brings
    its strategy run and its generate run together; benchmarks resampled independently)."""
    rows = rows.filter(pl.col("g_s").fill_null(0) > 0)
    per, draws = {}, []
    for (bench,), g in sorted(rows.group_by("benchmark"), key=lambda kv: kv[0]):
        a = canonical(g["out_tokens"], g["wall_time_s"], g["g_tok"], g["g_s"])  # (4, n)
        n = a.shape[1]
        point = (a[0].sum() / a[1].sum()) / (a[2].sum() / a[3].sum())
        idx = data_rng(0, a).integers(0, n, size=(b, n))  # (b, n)
        s = a[:, idx].sum(2)  # (4, b)
        d = (s[0] / s[1]) / (s[2] / s[3])  # (b,)
        lo, hi = np.percentile(d, [2.5, 97.5]) if n > 1 else (float("nan"),) * 2
        per[bench] = {"speedup": float(point), "lo": float(lo), "hi": float(hi), "prompts": n}
        draws.append(d)
    if not per:
        return {}
    w = np.array(weights(list(per), STUDY_W))  # per's benchmarks, sorted
    mean = w @ np.stack(draws)  # (b,)
    point = float(w @ np.array([v["speedup"] for v in per.values()]))
    spread = min(v["prompts"] for v in per.values()) > 1
    lo, hi = np.percentile(mean, [2.5, 97.5]) if spread else (float("nan"),) * 2
    return {"speedup": point, "lo": float(lo), "hi": float(hi), "per_benchmark": per}


def _ci(v: dict) -> str:
    return f"{v['speedup']:.2f}x" + ("" if v["lo"] != v["lo"] else f" [{v['lo']:.2f}, {v['hi']:.2f}]")


def speed_line(pp: pl.DataFrame, backbone: str, strategy: str, tree: str) -> str:
    """One sentence: the named strategy's speedup over generate, mean and per benchmark (or why none)."""
    label = f"`{strategy}`" + (" (each benchmark's home specialist)" if strategy == "single" else "") + \
        f", tree {tree}"
    rows = headline_rows(pp, backbone, strategy, tree) if "strategy" in pp.columns else pp.head(0)
    s = speedup_ci(rows) if not rows.is_empty() else {}
    if not s:
        return (f"- **Speed** ({backbone}, T=0): the profile's named strategy {label} has no cells timed "
                "against `generate` in this run.\n")
    each = ", ".join(f"{bn} {_ci(v)} ({v['prompts']} prompts)" for bn, v in s["per_benchmark"].items())
    return (f"- **Speed** ({backbone}, T=0, lossless): {label}, named in the profile before the run, decodes "
            f"**{_ci(s)}** as fast as `generate` on the same machine and prompts (mean over benchmarks, "
            f"{STUDY_W} as the τ averages; "
            f"{each}; 95% prompt-bootstrap intervals).\n")


def tau_line(t1: pl.DataFrame, backbone: str) -> str:
    """The home specialists' τ at T=0 on each benchmark, with their intervals (the profile's fixed tree)."""
    if not {"benchmark", "tau_lo", "prompts"} <= set(t1.columns):
        return ""
    rows = t1.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == 0))
    parts = []
    for r in rows.sort("benchmark").iter_rows(named=True):
        if r["method"] == home(r["benchmark"]):
            ci = "" if r["tau_lo"] != r["tau_lo"] else f" [{r['tau_lo']:.2f}, {r['tau_hi']:.2f}]"
            parts.append(f"{r['method']} on {r['benchmark']} {r['tau']:.2f}{ci} ({r['prompts']} prompts)")
    if not parts:
        return ""
    return f"- **Home specialists' τ** ({backbone}, T=0, fixed tree): " + "; ".join(parts) + ".\n"


def _claim_line(g: pl.DataFrame, of: int) -> str:
    """One claim's conclusive comparisons at one backbone and temperature (``of`` run there): the
    comparison itself where there is one, else how many hold (or do not) and their estimates' range."""
    r = g.row(0, named=True)
    head = f"  - {r['claim']} ({r['backbone']}, T={r['temperature']:g}): "
    if g.height == 1 and of == 1:
        return head + (f"{r['comparison']}: {estimate_text(r['estimate'], r['ci_lo'], r['ci_hi'])}, "
                       f"**{verdict_word(r['verdict_holm'])}**\n")
    words = [verdict_word(v) for v in g["verdict_holm"]]
    counts = ", ".join(f"**{w}** in {words.count(w)}" for w in CONCLUSIVE if w in words)
    lo, hi = f"{g['estimate'].min():+.2f}", f"{g['estimate'].max():+.2f}"
    est = f"estimate {lo}" if lo == hi else f"estimates {lo} to {hi}"
    return head + f"{counts} of {of} comparisons ({est}; each in the claims section)\n"


def concluded_lines(cl: pl.DataFrame) -> list[str]:
    """The claims whose Holm-adjusted verdict is conclusive, one line per claim, backbone and temperature."""
    if cl.is_empty() or "verdict_holm" not in cl.columns:
        return []
    ran = cl.filter(~pl.col("verdict").str.contains("not in this run", literal=True))
    word = pl.col("verdict_holm").map_elements(verdict_word, return_dtype=pl.String)
    done = ran.filter(word.is_in(CONCLUSIVE))
    out = [f"- **Claims that concluded under Holm**: {done.height} of the {ran.height} comparisons run"
           + (":" if done.height else " (every verdict is in the claims section below).") + "\n"]
    keys = ("claim", "backbone", "temperature")
    runs = {k: g.height for k, g in ran.group_by(*keys)}
    for k, g in done.group_by(*keys, maintain_order=True):
        out.append(_claim_line(g, runs[k]))
    return out


def headline_section(pp: pl.DataFrame, t1: pl.DataFrame, cl: pl.DataFrame, report_cfg: dict,
                     backbones: list[str]) -> list[str]:
    """The first lines of the summary: the named strategy's speed, the home specialists' τ, the claims
    that concluded. ``report_cfg``: the profile's ``report`` section as profile.json holds it."""
    md = ["**What this run shows**\n"]
    strategy, tree = report_cfg.get("headline_strategy"), report_cfg.get("headline_tree", "auto")
    for bb in backbones:
        if strategy:
            md.append(speed_line(pp, bb, strategy, tree))
        md.append(tau_line(t1, bb))
    md += concluded_lines(cl)
    return ["".join(m for m in md if m)]  # one block: a tight list, no blank line between its items
