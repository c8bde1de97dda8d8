"""The features mode chosen by what it costs, per backbone. Pure Python; the dry run's assumptions
(costs.ASSUMPTIONS: FLOPs per token at the assumed MFU) and the node's I/O (resources.node).

Options for a backbone's trials (its variants x epochs, each trial on resources.train.num_workers GPUs),
each costed as GPU-hours of the trials' compute and waits for shards (the start-up, loads, uploads and
held-out passes every option shares are left out) and as hours (its longest trial):

- online: the verifier's forward inside every epoch of every trial; nothing stored or read;
- cached: extraction once per corpus (shared by every backbone that reads the cache, so counted once in
  the totals), then each epoch reads the trial's share of it: the first from the object store, later ones
  from node disk where the share fits, else from the store again (orchestrator/plan/io_cost.py: read-ahead,
  time = max(compute, bytes / bandwidth), plus the first shard's fetch). EAGLE-2 and HASS read no aux
  layers (costs.read_bytes_per_token);
- hybrid (not built): the first epoch online, its features kept on node disk; later epochs read them
  there; no extraction and no object-store reads. Where the share does not fit the disk it is online;
- one forward for all (not built): one verifier forward per epoch of a data variant feeds every backbone
  training that variant at once. Costed as a lower bound: its trials must run together, paced by the
  slowest.

The driver runs one mode for the whole run (data.feature_mode cached or online): ``auto`` takes the
cheaper of the two in GPU-hours over every backbone (cached only within data.feature_storage_gib),
and the dry run says when an option that is not built would cost less.
"""
from __future__ import annotations

from dataclasses import dataclass

from drafters.corpora import CORPUS_OF
from orchestrator.grid import corpora, train_cells
from orchestrator.plan.costs import ASSUMPTIONS, EAGLE3_AUX_LAYERS, VERIFIERS, train_flops_per_token
from orchestrator.plan.io_cost import share, trial_io
from orchestrator.profile.schema import Profile

RUNNABLE = ("cached", "online")  # the modes the driver runs


@dataclass(frozen=True)
class Option:
    gpu_h: float
    hours: float  # the backbone's longest trial
    note: str = ""


def _eff() -> float:
    return ASSUMPTIONS["gpu_peak_flops"] * ASSUMPTIONS["mfu"]


def _tpe(p: Profile) -> dict:
    return {c: min(t, p.data.max_length) for c, t in ASSUMPTIONS["tokens_per_example"].items()}


def trial_tokens(p: Profile, variant: str) -> float:
    """Tokens one epoch of a drafter variant reads (mixed_half: n/2 examples of each corpus), as
    orchestrator.plan.rates.trial_tokens counts them (that package imports the profile's, so not here)."""
    per = p.data.n // 2 if variant == "mixed_half" else p.data.n
    return sum(per * _tpe(p)[c] for c in CORPUS_OF[variant])


def _trials(p: Profile, backbone: str) -> list[tuple[str, float, int]]:
    """(variant, tokens an epoch, epochs) of each trial of ``backbone``."""
    t = p.train.for_backbone(backbone)
    return [(c.variant, trial_tokens(p, c.variant), t.epochs)
            for c in train_cells(p) if c.backbone == backbone]


def extraction(p: Profile) -> Option:
    """Extracting every corpus once (the verifier's forward over n + heldout examples)."""
    v = VERIFIERS[p.verifier]
    tokens = sum((p.data.n + p.data.heldout) * _tpe(p)[c] for c in corpora(p))
    return Option(tokens * 2 * v["params"] / _eff() / 3600, 0.0, "once per corpus, for every cached backbone")


def options(p: Profile, backbone: str) -> dict[str, Option]:
    """{online, cached, hybrid}: the backbone's trials under each (cached without the extraction)."""
    v = VERIFIERS[p.verifier]
    gpus = p.resources.train.num_workers
    node = p.resources.node
    train = train_flops_per_token(v, backbone, p.train.for_backbone(backbone).hass_steps)
    rate = {"cached": _eff() * gpus / train, "online": _eff() * gpus / (train + 2 * v["params"])}
    n_aux = EAGLE3_AUX_LAYERS if "eagle3" in p.train.backbones else 0
    out: dict[str, list] = {"online": [], "cached": [], "hybrid": []}
    ios = []
    for _, tokens, epochs in _trials(p, backbone):
        on, off = tokens / rate["online"], tokens / rate["cached"]
        io = trial_io(off, epochs, tokens, gpus, node, v["hidden"], n_aux, backbone == "eagle3")
        out["online"].append(on * epochs)
        out["cached"].append(off * epochs + io.stall_s)
        disk = max(0.0, io.share_bytes / (node.disk_gb_s * 1e9 * share(gpus)) - off)  # later epochs from disk
        out["hybrid"].append(on + (epochs - 1) * (off + disk) if io.fits else on * epochs)
        ios.append(io)
    worst = max(ios, key=lambda x: x.need_bytes_per_s)
    big = max(ios, key=lambda x: x.share_bytes)
    cached_note = (f"reads up to {worst.need_bytes_per_s / 1e9:.2f} GB/s of "
                   f"{worst.store_bytes_per_s / 1e9:.2f} "
                   f"GB/s from the store; largest share {big.share_bytes / 1e12:.2f} TB "
                   + ("fits" if big.fits
                      else "does not fit") + f" {node.disk_gb * share(gpus):,.0f} GB of disk")
    hybrid_note = "not built" + ("" if all(x.fits for x in ios)
                                 else "; a share does not fit node disk: online there")
    return {"online": _opt(out["online"], gpus), "cached": _opt(out["cached"], gpus, cached_note),
            "hybrid": _opt(out["hybrid"], gpus, hybrid_note)}


def _opt(seconds: list[float], gpus: int, note: str = "") -> Option:
    return Option(sum(seconds) * gpus / 3600, max(seconds, default=0.0) / 3600, note)


def one_forward_for_all(p: Profile) -> Option:
    """One verifier forward per epoch of each data variant feeding every backbone that trains it (not
    built): each variant's forward for its longest-training backbone's epochs, plus every backbone's
    cached-rate compute. A lower bound (the trials would run together, paced by the slowest)."""
    v, gpus = VERIFIERS[p.verifier], p.resources.train.num_workers
    forward, hours = 0.0, 0.0
    variants: dict[str, int] = {}
    for c in train_cells(p):
        variants[c.variant] = max(variants.get(c.variant, 0), p.train.for_backbone(c.backbone).epochs)
    for variant, epochs in variants.items():
        forward += trial_tokens(p, variant) * epochs * 2 * v["params"] / _eff() / 3600
    train = 0.0
    for b in p.train.backbones:
        flops = train_flops_per_token(v, b, p.train.for_backbone(b).hass_steps)
        for _, tokens, epochs in _trials(p, b):
            train += tokens * epochs * flops / _eff() / 3600
            hours = max(hours, tokens * epochs * (flops + 2 * v["params"]) / _eff() / gpus / 3600)
    return Option(forward + train, hours, "not built; a lower bound: the trials of a variant run together")


def totals(p: Profile) -> dict[str, float]:
    """GPU-hours of the whole grid in each runnable mode (cached with its extraction once)."""
    per = {b: options(p, b) for b in p.train.backbones}
    return {"cached": extraction(p).gpu_h + sum(o["cached"].gpu_h for o in per.values()),
            "online": sum(o["online"].gpu_h for o in per.values())}


def choose(p: Profile) -> str:
    """The cheaper runnable mode in GPU-hours (cached on a tie)."""
    t = totals(p)
    return "cached" if t["cached"] <= t["online"] else "online"


def lines(p: Profile) -> list[str]:
    """The dry run's features-mode section: each option per backbone, the totals and the choice."""
    ext = extraction(p)
    out = [f"  extraction: {ext.gpu_h:.1f} GPU-h ({ext.note})"]
    best_mix, picks = 0.0, set()
    for b in p.train.backbones:
        o = options(p, b)
        best = min(o, key=lambda k: o[k].gpu_h)
        best_mix, picks = best_mix + o[best].gpu_h, picks | {best}
        out.append(f"  {b:<7}: " + "; ".join(
            f"{k} {x.gpu_h:,.1f} GPU-h, {x.hours:.1f} h" + (f" ({x.note})" if x.note else "") for k,
            x in o.items())
            + f" -> cheapest {best}")
    one = one_forward_for_all(p)
    out.append(f"  one verifier forward per variant for every backbone: {one.gpu_h:,.1f} GPU-h, "
               f"{one.hours:.1f} h "
               f"({one.note})")
    best_mix += ext.gpu_h if "cached" in picks else 0.0
    t, pick = totals(p), choose(p)
    other = "online" if pick == "cached" else "cached"
    out.append(f"  run: cached {t['cached']:,.1f} GPU-h (extraction included) against online "
               f"{t['online']:,.1f}: "
               f"{pick} costs {t[other] - t[pick]:,.1f} GPU-h less (data.feature_mode auto picks it within "
               "data.feature_storage_gib)")
    if best_mix < t[pick] - 0.05:
        out.append(f"  each backbone's cheapest option together: {best_mix:,.1f} GPU-h, "
                   f"{t[pick] - best_mix:,.1f} "
                   "less, but the driver runs one mode for the run and no hybrid")
    return out
