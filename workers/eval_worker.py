"""Evaluation actor: loads the verifier once, keeps recently used drafters (in memory, and their
fetched files on the node's disk, each within a budget), decodes shards of prompts."""
from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from decoding.config import TREE_MODES, DecodeConfig, TreeConfig


@dataclass(frozen=True)
class EvalJob:
    """One evaluation cell as its actor runs it, sent through Ray as it is (orchestrator/grid.py's
    ``eval_job`` builds it): the DecodeConfig the decode loop reads, and what the traces carry beside it."""

    decode: DecodeConfig
    cell_key: str
    drafter: str  # the cell's display name (a trace column)
    benchmark: str  # tree auto calibrates on this benchmark's prompts that are not evaluated
    budget_matched: bool = False
    tree_mode: str = TREE_MODES[0]  # fixed: decode.tree; auto: fitted on the actor (decoding/autotree.py)
    paired_baseline: bool = False  # time transformers' generate after every input, not only autoregressive's
    system_prompt: str | None = None

    def columns(self, tree: TreeConfig) -> dict:
        """The cell's columns on every trace row (``tree``: the tree decoded, auto or fixed). The
        tree mode's column keeps its first name, ``tree``."""
        d = self.decode
        return {"drafter": self.drafter, "strategy": d.strategy, "routing_granularity": d.routing_granularity,
                "merge_dedup": d.merge_dedup, "total_tokens": d.budget, "budget_matched": self.budget_matched,
                "tree": self.tree_mode, **d.columns(), "tree_shape": tree.shape, "cell_key": self.cell_key}


class DrafterCache:
    """Loaded drafters by key within a byte budget: past it, the least recently used go first
    (never those of the cell at hand, which may exceed the budget alone)."""

    def __init__(self, budget_bytes: float, size: Callable[[object], int]):
        self.budget, self.size = budget_bytes, size
        self.items: OrderedDict = OrderedDict()  # key -> (drafter, bytes), least recently used first
        self.evicted = 0

    def get(self, key: str, load: Callable[[], object], keep: set = frozenset()):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key][0]
        value = load()
        self.items[key] = (value, self.size(value))
        for k in [k for k in self.items if k not in keep | {key}]:
            if self.nbytes() <= self.budget:
                break
            del self.items[k]
            self.evicted += 1
        return value

    def nbytes(self) -> int:
        return sum(n for _, n in self.items.values())


def _drafter_bytes(proposer) -> int:
    return sum(t.numel() * t.element_size() for t in proposer.drafter.state_dict().values())


class EvalWorker:
    """Wrapped with ray.remote by the driver (resources come from the profile)."""

    def __init__(self, verifier: str, dtype: str | None = None, threads: int = 1,
                 drafter_cache_gb: float = 4.0,
                 checkpoint_disk_gb: float = 20.0, verify_batch: int = 1):
        import torch

        from common.fetch_cache import FetchCache
        from common.verifiers import eos_token_ids, resolve
        from decoding.verifiers import load_verifier

        torch.set_num_threads(max(1, threads))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, self.tok = load_verifier(verifier, dtype=dtype, device=self.device)
        self.name = resolve(verifier).name
        self.eos = eos_token_ids(self.model, self.tok)
        self._proposers = DrafterCache(drafter_cache_gb * 2**30, _drafter_bytes)
        self._fetched = FetchCache(checkpoint_disk_gb * 2**30)  # shared by the node's actors
        # (checkpoints, strategy, dedup, granularity) -> tree auto choice
        self._auto: dict[tuple, object] = {}
        self.verify_batch = verify_batch  # prompts decoded at once (resources.eval.verify_batch)

    def pid(self) -> int:
        return os.getpid()

    def _proposer(self, path: str, index: int, keep: set):
        from decoding.runner import load_proposers

        def load():  # a URI is copied to this node first; its files may go once it is loaded
            with self._fetched.use(path) as local:
                p = load_proposers(self.model, [str(local)], self.name)[0]
            p.index, p.name = index, path.rstrip("/").split("/")[-2 if path.rstrip("/").endswith("final")
                                                                 else -1]
            return p

        return self._proposers.get(f"{path}#{index}", load, keep)

    def _auto_tree(self, job: EvalJob, checkpoint_paths: list[str], props: list, prompts: list) -> TreeConfig:
        """The tree fitted to this machine and drafters, calibrated once per actor, composition and
        task, on prompts not evaluated."""
        from decoding.autotree import auto_tree, calibration_inputs

        d = job.decode
        key = (tuple(checkpoint_paths), d.strategy, d.merge_dedup, d.routing_granularity, job.benchmark)
        if key not in self._auto:
            cal = calibration_inputs(self.tok, 2, (job.benchmark,), exclude={p.id for p in prompts},
                                     system=job.system_prompt)
            self._auto[key] = auto_tree(self.model, props, d.strategy, self.eos, cal, d.merge_dedup,
                                        d.routing_granularity, max_new_tokens=min(32, d.max_new_tokens))
            print(f"[eval] {d.strategy} {job.drafter} {job.benchmark}: {self._auto[key].describe()}",
                  flush=True)
        return self._auto[key].tree

    def run(self, job: EvalJob, checkpoint_paths: list[str], prompts: list) -> tuple[list, list]:
        """Decode ``prompts`` for one evaluation cell; returns (prompt rows, step rows)."""
        from decoding.engine import SpeculativeDecoder
        from decoding.runner import generate_baseline, prompt_rows

        cfg = job.decode
        keep = {f"{p}#{i}" for i, p in enumerate(checkpoint_paths)}  # this cell's drafters stay loaded
        props = [self._proposer(p, i, keep) for i, p in enumerate(checkpoint_paths)]
        if job.tree_mode == "auto":
            cfg = dataclasses.replace(cfg, tree=self._auto_tree(job, checkpoint_paths, props, prompts))
        dec = SpeculativeDecoder(self.model, props, cfg, self.eos)
        extra = job.columns(cfg.tree)
        # the autoregressive cell also times transformers' generate on the same inputs: the speed baseline;
        # with eval.paired_baseline every cell does, right after decoding each input (decode_prompt)
        base = (generate_baseline(self.model, self.eos, cfg.max_new_tokens, cfg.temperature, cfg.seed)
                if cfg.strategy == "autoregressive" or job.paired_baseline else None)
        rows, steps = [], []
        for prompt, results in zip(prompts, self._decode(dec, prompts, base, job.system_prompt)):
            r, s = prompt_rows(prompt, results, extra)
            rows += r
            steps += s
        return rows, steps

    def _decode(self, dec, prompts: list, base, system: str | None) -> list:
        """Every prompt's turns: one at a time, or ``verify_batch`` at once with one verifier pass a step
        (the speed baseline then runs after the batch, on the same inputs)."""
        from decoding.batch import add_baselines, decode_prompts, row_decoders
        from decoding.runner import decode_prompt

        rows = min(self.verify_batch, len(prompts))
        if rows <= 1:
            return [decode_prompt(dec, self.tok, prompt, base, system) for prompt in prompts]
        results = decode_prompts(row_decoders(dec, rows), self.tok, prompts, system)
        if base is not None:
            for prompt, res in zip(prompts, results):
                add_baselines(res, self.tok, prompt, base, system)
        return results
