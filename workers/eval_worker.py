"""Evaluation actor: loads the verifier once, keeps recently used drafters (in memory, and their
fetched files on the node's disk, each within a budget), decodes shards of prompts."""
from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from collections.abc import Callable


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

    def __init__(self, verifier: str, dtype: str | None = None, threads: int = 1, drafter_cache_gb: float = 4.0,
                 checkpoint_disk_gb: float = 20.0):
        import torch

        from common.verifiers import eos_token_ids, resolve

        from decoding.verifiers import load_verifier
        from common.fetch_cache import FetchCache

        torch.set_num_threads(max(1, threads))
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, self.tok = load_verifier(verifier, dtype=dtype, device=self.device)
        self.name = resolve(verifier).name
        self.eos = eos_token_ids(self.model, self.tok)
        self._proposers = DrafterCache(drafter_cache_gb * 2**30, _drafter_bytes)
        self._fetched = FetchCache(checkpoint_disk_gb * 2**30)  # shared by the node's actors
        self._auto: dict[tuple, object] = {}  # (checkpoints, strategy, dedup, granularity) -> tree auto choice

    def pid(self) -> int:
        return os.getpid()

    def _proposer(self, path: str, index: int, keep: set):
        from decoding.runner import load_proposers

        def load():  # a URI is copied to this node first; its files may go once it is loaded
            with self._fetched.use(path) as local:
                p = load_proposers(self.model, [str(local)], self.name)[0]
            p.index, p.name = index, path.rstrip("/").split("/")[-2 if path.rstrip("/").endswith("final") else -1]
            return p

        return self._proposers.get(f"{path}#{index}", load, keep)

    def run(self, cell: dict, checkpoint_paths: list[str], prompts: list, decode: dict) -> tuple[list, list]:
        """Decode ``prompts`` for one evaluation cell; returns (prompt rows, step rows)."""
        from decoding.engine import DecodeConfig, SpeculativeDecoder
        from decoding.runner import decode_prompt, generate_baseline, prompt_rows
        from decoding.tree import TreeConfig
        from orchestrator.grid import decode_columns, decode_options

        tree = TreeConfig(decode["top_k"], decode["depth"], cell["total_tokens"] if cell["strategy"] != "autoregressive" else 2)
        # route_score, switch_* and the cell's own decide steps where the cell sets them
        opts = {"routing_decide_steps": decode.get("routing_decide_steps", 1)} | decode_options(cell)
        cfg = DecodeConfig(strategy=cell["strategy"], temperature=cell["temperature"], max_new_tokens=decode["max_new_tokens"],
                           seed=decode["seed"], routing_granularity=cell["routing_granularity"],
                           merge_dedup=cell["merge_dedup"], tree=tree,
                           merge_budget=cell["strategy"] == "merged" and cell["budget_matched"], **opts)
        keep = {f"{p}#{i}" for i, p in enumerate(checkpoint_paths)}  # this cell's drafters stay loaded
        props = [self._proposer(p, i, keep) for i, p in enumerate(checkpoint_paths)]
        if cell.get("tree", "fixed") == "auto":
            from decoding.autotree import auto_tree, calibration_inputs

            key = (tuple(checkpoint_paths), cell["strategy"], cell["merge_dedup"], cell["routing_granularity"],
                   cell["benchmark"])
            if key not in self._auto:  # calibrated once per actor, composition and task, on prompts not evaluated
                cal = calibration_inputs(self.tok, 2, (cell["benchmark"],), exclude={p.id for p in prompts},
                                         system=decode.get("system_prompt"))
                self._auto[key] = auto_tree(self.model, props, cell["strategy"], self.eos, cal, cell["merge_dedup"],
                                            cell["routing_granularity"], max_new_tokens=min(32, cfg.max_new_tokens))
                print(f"[eval] {cell['strategy']} {cell['drafter']} {cell['benchmark']}: {self._auto[key].describe()}",
                      flush=True)
            cfg = dataclasses.replace(cfg, tree=self._auto[key].tree)
        dec = SpeculativeDecoder(self.model, props, cfg, self.eos)
        extra = {k: cell[k] for k in ("drafter", "strategy", "routing_granularity", "merge_dedup", "total_tokens", "budget_matched")}
        extra["tree"] = cell.get("tree", "fixed")
        extra |= decode_columns(cell)
        extra["tree_shape"] = f"{cfg.tree.top_k}/{cfg.tree.depth}/{cfg.tree.total_tokens}"
        extra["cell_key"] = decode["cell_key"]
        # the autoregressive cell also times transformers' generate on the same inputs: the speed baseline;
        # with eval.paired_baseline every cell does, right after decoding each input (decode_prompt)
        base = (generate_baseline(self.model, self.eos, cfg.max_new_tokens, cfg.temperature, cfg.seed)
                if cell["strategy"] == "autoregressive" or decode.get("paired_baseline") else None)
        rows, steps = [], []
        for prompt in prompts:
            r, s = prompt_rows(prompt, decode_prompt(dec, self.tok, prompt, base, decode.get("system_prompt")), extra)
            rows += r
            steps += s
        return rows, steps
