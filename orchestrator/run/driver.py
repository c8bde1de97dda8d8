"""The Ray driver: features -> training (Tune + Train) -> merges -> evaluation -> report, stage after
stage or, with ``cluster.schedule`` graph, merges and evaluation beside training (orchestrator/run/graph.py).

Every unit has a content key from the configuration that produced it; the manifest records each
unit once its files are complete, so rerunning the same command skips finished work.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from pathlib import Path

import ray

from common import storage
from common.verifiers import resolve
from decoding.runner import write_parquet_atomic
from drafters.checkpoint import initial_of, save_any
from drafters.data.sources import load_benchmark, subsample
from drafters.merge import merge_checkpoints
from drafters.train.config import TrainConfig
from drafters.variants import DataSpec, heldout_data, variant_data
from orchestrator import keys as unit_keys
from orchestrator.grid import EvalCell, cell_prompts, eval_cells, merge_cells, pool_sizes, train_cells
from orchestrator.grid import corpora as grid_corpora
from orchestrator.manifest import STAGES, Lease, Manifest
from orchestrator.plan.concurrency import Plan, derive
from orchestrator.plan.preflight import check_cluster, check_train_resources, preflight
from orchestrator.plan.rates import trial_order
from orchestrator.plan.rates.taskgraph import feature_parts
from orchestrator.profile import Profile, batch_plan, profile_dict
from orchestrator.report.build import build_report
from orchestrator.run.cluster import cluster_nodes, machine, ray_init
from orchestrator.run.eval_run import EvalRun
from orchestrator.run.graph import GraphRun
from orchestrator.run.progress import Progress, wait_relaying
from orchestrator.run.summary import print_summary, track_summary
from orchestrator.run.tracking import Tracker
from workers import tasks
from workers.relay import Relay
from workers.tune_sweep import run_sweep

PARTITIONS = ("backbone", "benchmark", "temperature")
# with a URI output the manifest is published after each stage and, during evaluation, when a unit finishes
# and the last publication is older than this: a killed driver loses the records since (their units redone)
MANIFEST_SYNC_S = 10


def check_output_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"output directory {out} is not writable: {e}") from e


class Driver:
    def __init__(self, profile: Profile, output_dir: str, force: str | None = None, take_over: bool = False):
        if force is not None and force not in STAGES:  # bad input: refused before the lease is taken
            raise ValueError(f"--force must be one of {list(STAGES)}, got {force!r}")
        self.p = profile
        self.uri = output_dir if storage.is_uri(output_dir) else None
        if self.uri:  # the driver's own files live in a staging dir; every artifact moves through the URI
            storage.check_writable_uri(self.uri)
            self.out = storage.staging_dir(self.uri)
        else:
            self.out = Path(output_dir).resolve()
        self.root = self.uri or str(self.out)  # where artifacts live (workers read and write there)
        check_output_dir(self.out)
        # one driver per output (LeaseHeld, one line, otherwise), taken before the manifest is read
        self.lease = Lease(storage.join(self.root, "lease.json"), ttl=profile.cluster.lease_s)
        note = self.lease.acquire(take_over)
        try:  # from here every way out of __init__ but success releases the lease (run() does after)
            self._open(note, force)
        except BaseException:
            self.lease.release()
            raise

    def _open(self, note: str | None, force: str | None) -> None:
        """What __init__ does once the lease is held: the manifest, --force, the tracker."""
        self.force = force
        if note:
            print(f"lease: {note}", flush=True)
        if self.uri:
            Manifest.remove(self.out / "manifest.json")  # the remote manifest is the truth (journal too)
            if storage.exists(storage.join(self.uri, "manifest.json")):
                storage.sync(storage.join(self.uri, "manifest.json"), str(self.out / "manifest.json"),
                             force=True)
        # with a URI, "done" means its files are at the URI (one listing now, not a request per unit)
        self.manifest = Manifest(self.out / "manifest.json", present=storage.list_files(self.uri)
                                 if self.uri else None)
        if force:
            n = self.manifest.forget_from(force)
            print(f"--force {force}: {n} recorded unit(s) of {force} and later stages will be redone")
        self.stage_seconds: dict[str, float] = {}
        # tags every trace row: the report tells ratios timed in one invocation from a resumed run's mix
        self.invocation = f"{time.strftime('%Y-%m-%dT%H:%M:%S')}-{os.getpid()}"
        t = self.p.tracking  # a missing tracker package is an error now, before any work
        self.tracker = Tracker(t.backend, self.out, self.p.name, t.uri, t.experiment, remote=self.uri)
        self._last_sync = time.time()
        self.ckpt_keys: dict[str, str] = {}  # checkpoint name -> manifest key of the unit that made it

    # ------------------------------------------------------------------ helpers
    def ref(self, rel: str) -> str:
        """The shared location of an artifact (a path under the output dir, or a URI)."""
        return storage.join(self.root, rel)

    def checkpoint_refs(self) -> dict[str, str]:
        """Where the stages put every drafter of the grid: a trial's ``final/``, a merge's own dir."""
        refs = {c.name: self.ref(f"checkpoints/{c.name}/final") for c in train_cells(self.p)}
        return refs | {m.name: self.ref(f"checkpoints/{m.name}") for m in merge_cells(self.p)}

    def _publish(self, rel: str) -> None:
        """Copy a file the driver wrote (under its staging dir) to the URI."""
        if self.uri:
            storage.publish(self.out / rel, self.ref(rel))

    def _data_spec(self) -> DataSpec:
        """The data settings workers read, built from the very dict the unit keys hash."""
        return DataSpec(**unit_keys.data_spec(self.p))

    def _sync(self) -> None:
        """Publish the manifest (after the files it records, which are published as they finish):
        its journal folded into manifest.json first (orchestrator/manifest.py), which is uploaded."""
        self.lease.check()  # taken over by another driver: stop before writing over its manifest
        self.manifest.compact()
        if self.uri:
            storage.sync(str(self.out / "profile.json"), self.ref("profile.json"), force=True)
            if (self.out / "manifest.json").is_file():
                storage.sync(str(self.out / "manifest.json"), self.ref("manifest.json"), force=True)
            self._last_sync = time.time()

    def _timed(self, stage: str, fn, *args):
        """Run one stage, record its wall time, then copy the output to a URI if there is one."""
        t, before = time.time(), self.manifest.recorded.get(stage, 0)
        out = fn(*args)
        self.stage_seconds[stage] = time.time() - t
        ran = self.manifest.recorded.get(stage, 0) - before + (stage == "report")
        self.manifest.record_stage(stage, self.stage_seconds[stage], ran, self.machine)
        self._sync()
        return out

    def run(self) -> dict:
        try:
            return self._run()
        finally:
            self.lease.release()

    def _run(self) -> dict:
        preflight(self.p)  # every data set and the verifier's config, before any work (PreflightError)
        self.verifier_name = resolve(self.p.verifier).name
        (self.out / "profile.json").write_text(json.dumps(profile_dict(self.p), indent=1, default=str))
        if self.force:  # the forgotten units are forgotten at the URI too (a crash from here redoes them)
            self._sync()
        ray_init(self.p)
        check_cluster(self.p, local_output=self.uri is None)  # (PreflightError)
        self.machine = machine()
        self.plan = self._plan(len(train_cells(self.p)), None, quiet=False)
        caches = self._timed("features", self.stage_features)
        if self.p.cluster.graph(self.p.resources.train.use_gpu):  # merges and evaluation beside training
            summary = GraphRun(self, caches).go()
        else:
            ckpts = self._timed("train", self.stage_train, caches)
            ckpts.update(self._timed("merge", self.stage_merge, ckpts))
            summary = self._timed("eval", self.stage_eval, ckpts)
        self._timed("report", self.stage_report)
        track_summary(self.tracker, self.p, self.out, self.stage_seconds)
        print("stage wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in self.stage_seconds.items()))
        print_summary(self.manifest, self.out)
        if not os.environ.get("RAY_ADDRESS"):
            ray.shutdown()
        return summary

    def _plan(self, trials: int | None, eval_units: int | None, quiet: bool = True) -> Plan:
        """Trial concurrency and eval actors for the cluster as it is now (or at the autoscaler's
        maximum), the profile's numbers as caps (orchestrator/plan/concurrency.py); printed at the start, and
        again at a stage whose numbers differ from the start's."""
        nodes, source = cluster_nodes()
        plan = derive(self.p, nodes, trials, eval_units)
        start = getattr(self, "plan", None)
        changed = start and (plan.train.units, plan.eval.units) != (start.train.units, start.eval.units)
        if not quiet or changed:
            print(f"{plan.line()}; from {source}", flush=True)
        return plan

    # ------------------------------------------------------------------ 1. features
    def stage_features(self) -> dict:
        corpora = grid_corpora(self.p)
        root = self.ref("features")
        prog = Progress("features", len(corpora))
        caches = {}
        pending = {}
        relay = None
        aux = "eagle3" in self.p.train.backbones  # one cache per corpus serves every backbone
        parts = feature_parts(self.p, self.plan.gpus)  # on a GPU cluster: a task per GPU
        for c in corpora:
            key = unit_keys.features_key(self.p, self.verifier_name, c, aux)
            rec = self.manifest.get(key)
            if rec and self.manifest.done(key):
                caches[c] = rec["caches"]
                prog.step(f"{c} (cached)", skipped=True)
                continue
            if self.force == "features":
                for sub in storage.listdir(root):
                    if sub.startswith(f"{c}-"):
                        storage.remove(storage.join(root, sub))
            r = self.p.resources.features
            task = ray.remote(num_cpus=r.num_cpus, num_gpus=r.num_gpus,
                              max_retries=self.p.retries)(tasks.features_task)
            relay = relay or Relay.options(name=f"progress-relay:{os.getpid()}").remote()
            args = (self.p.verifier, self.p.verifier_dtype, c, self._data_spec(), root,
                    self.p.data.feature_mode == "online", relay, aux)
            n = parts[c]  # data-parallel: part i of n of the shards on each of n devices
            pending[c] = (key, [task.options(name=f"features:{c}" + (f":{i}" if n > 1 else "")).remote(
                *args, (i, n) if n > 1 else None) for i in range(n)])
        for c, (key, refs) in pending.items():
            caches[c] = [wait_relaying(ref, relay, prog) for ref in refs][0]
            if len(refs) > 1:  # the caches' indexes, once every part has recorded its shards
                finish = ray.remote(num_cpus=1, max_retries=self.p.retries)(tasks.features_finish_task)
                caches[c] = ray.get(finish.options(name=f"features:{c}:index").remote(root, caches[c],
                                                                                      len(refs)))
            files = [] if caches[c].get("online") else [
                f"features/{caches[c][p]}/manifest.json" for p in ("train", "heldout")]
            self.manifest.record(key, "features", c, "done", files=files, caches=caches[c])
            prog.step(c)
        if relay is not None:
            ray.kill(relay)
        self.vocab = self._draft_vocab(corpora)
        return caches

    def _draft_vocab(self, corpora: list[str]) -> str | None:
        """One reduced draft vocabulary for every drafter of the run (so merges and merged trees
        share it, like the initialisation), from the training data of all trained corpora."""
        size = self.p.train.draft_vocab
        if size is None:
            return None
        key = unit_keys.vocab_key(self.p, self.verifier_name, corpora)
        rel = f"features/vocab-{key[6:]}.safetensors"
        if self.manifest.done(key):
            return self.ref(rel)
        r = self.p.resources.features
        task = ray.remote(num_cpus=r.num_cpus, num_gpus=r.num_gpus,
                          max_retries=self.p.retries)(tasks.vocab_task)
        stats = ray.get(task.options(name="features:draft-vocab").remote(
            self.p.verifier, self.p.verifier_dtype, corpora, self._data_spec(), size, self.ref(rel)))
        self.manifest.record(key, "features", "draft-vocab", "done", files=[rel], vocab=stats)
        Progress("features", 1, quiet=True).log(
            f"draft vocabulary: {size} of {stats['distinct_targets']} distinct target tokens, "
            f"covering {100 * stats['coverage']:.1f}% of {stats['target_tokens']} assistant tokens")
        return self.ref(rel)

    # ------------------------------------------------------------------ 2. training
    def _train_config(self, cell, caches):
        root = self.ref("features")
        t = self.p.train.for_backbone(cell.backbone)  # with its train.per_backbone values
        bp = batch_plan(self.p, t)  # train.global_batch -> per-worker batch and accumulation
        settings = dataclasses.replace(t.settings, batch_size=bp.per_worker, grad_accum=bp.grad_accum)
        out = self.ref(f"checkpoints/{cell.name}")
        return TrainConfig(
            **dataclasses.asdict(settings), verifier=self.verifier_name, verifier_dtype=self.p.verifier_dtype,
            backbone=cell.backbone, variant=cell.variant, out_dir=str(storage.node_cache(out)),
            out_uri=out if self.uri else None, draft_vocab=self.vocab,
            train_data=variant_data(cell.variant, root, caches, self.p.data.n),
            heldout_data=heldout_data(root, caches),
            online_spec=self._data_spec() if self.p.data.feature_mode == "online" else None,
        )

    def stage_train(self, caches) -> dict:
        ckpts, todo, prog = self.train_todo(caches)
        if todo:
            grid = self.start_sweep(todo, prog)
            errors = {res.config["cell"]: res.error for res in grid if res.error}
            for name in todo:
                self.train_finished(name, errors.get(name), ckpts, prog)
            self.tracker.publish()  # the sweep's tracker records, to the output URI
        return ckpts

    def train_todo(self, caches) -> tuple[dict, dict, Progress]:
        """The trained checkpoints recorded done ({cell name: ref}) and the TrainConfigs of the cells
        still to train, longest first (as the dry run plans); every cell's key in ckpt_keys."""
        cells = train_cells(self.p)
        prog = Progress("train", len(cells))
        ckpts, todo = {}, {}
        for b in self.p.train.backbones:
            print(("" if not self.p.train.per_backbone else f"[{b}] ")
                  + batch_plan(self.p, self.p.train.for_backbone(b)).describe(), flush=True)
        for cell in cells:
            key = unit_keys.train_key(self.p, self.verifier_name, cell.backbone, cell.variant)
            self.ckpt_keys[cell.name] = key
            if self.manifest.done(key):
                ckpts[cell.name] = self.ref(f"checkpoints/{cell.name}/final")
                prog.step(f"{cell.name} (done earlier)", skipped=True)
                continue
            if self.force in ("features", "train"):
                storage.remove(self.ref(f"checkpoints/{cell.name}"))
                # Ray Train's run snapshot
                storage.remove(self.ref(f"checkpoints/_ray_train/train-{cell.name}"))
            todo[cell.name] = self._train_config(cell, caches)
        return ckpts, {n: todo[n] for n in trial_order(self.p, list(todo))}, prog

    def start_sweep(self, todo: dict, prog: Progress, callbacks=()):
        """The Tune sweep over ``todo``'s cells, as many trials at once as the cluster holds (up to
        the profile's cap); Tune's ResultGrid when every trial has ended."""
        r = self.p.resources.train
        check_train_resources(self.p)  # the autoscaler's maximum, or the cluster as it is now
        if self.force in ("features", "train"):  # else Tune would restore the finished sweep
            storage.remove(self.ref("ray_results"))
        prog.log(f"Tune sweep over {sorted(todo)}")
        per_trial = {"num_workers": r.num_workers, "cpus_per_worker": r.cpus_per_worker, "use_gpu": r.use_gpu,
                     "max_failures": self.p.retries}
        trials = self._plan(len(todo), None).train.units  # as many as the cluster holds, up to the cap
        return run_sweep(todo, self.ref("ray_results"), per_trial, max_concurrent=trials,
                         callbacks=[*self.tracker.tune_callbacks(), *callbacks])

    def train_finished(self, name: str, error, ckpts: dict, prog: Progress) -> bool:
        """A trial that ended: recorded done (its final checkpoint is there) or failed. True if done."""
        key, final = self.ckpt_keys[name], self.ref(f"checkpoints/{name}/final")
        if error is not None or not storage.exists(storage.join(final, "model.safetensors")):
            err = str(error if error is not None else "no final checkpoint")[:2000]
            self.manifest.record(key, "train", name, "failed", error=err)
            prog.step(f"{name} FAILED: {err[:200]}")
            return False
        self.manifest.record(key, "train", name, "done",
                             files=[f"checkpoints/{name}/final/model.safetensors"])
        ckpts[name] = final
        prog.step(name)
        return True

    # ------------------------------------------------------------------ 3. merges
    def stage_merge(self, ckpts: dict) -> dict:
        cells = merge_cells(self.p)
        prog = Progress("merge", len(cells))
        out, inits = {}, {}
        for m in cells:
            self._merge_one(m, ckpts, inits, out, prog)
        return out

    def merge_key(self, m) -> str:
        """A merge's unit key, from its sources' training keys (also kept in ckpt_keys)."""
        src = [self.ckpt_keys.get(f"{m.backbone}-{v}") for v in ("math", "chat")]
        self.ckpt_keys[m.name] = key = unit_keys.merge_key(self.p, m.kind, m.lam, src)
        return key

    def _merge_one(self, m, ckpts: dict, inits: dict, out: dict, prog: Progress) -> None:
        """One merge cell: done earlier, failed for a missing source, or merged now (into ``out``)."""
        src = [ckpts.get(f"{m.backbone}-math"), ckpts.get(f"{m.backbone}-chat")]
        key = self.merge_key(m)
        dest = self.out / "checkpoints" / m.name
        if self.manifest.done(key):
            out[m.name] = self.ref(f"checkpoints/{m.name}")
            prog.step(f"{m.name} (done earlier)", skipped=True)
            return
        if None in src:
            self.manifest.record(key, "merge", m.name, "failed", error="a source drafter failed to train")
            prog.step(f"{m.name} skipped: missing source", skipped=True)
            return
        try:
            base = None if m.kind == "linear" else self._initial(m.backbone, src[0], inits)
            src = [str(storage.fetch(s)) for s in src]
            merge_checkpoints(m.kind, src, str(dest), lam=m.lam, base=base, density=self.p.merge.ties_density)
            self._publish(f"checkpoints/{m.name}")
            self.manifest.record(key, "merge", m.name, "done",
                                 files=[f"checkpoints/{m.name}/model.safetensors"])
            out[m.name] = self.ref(f"checkpoints/{m.name}")
            prog.step(m.name)
        except Exception as e:  # noqa: BLE001 - recorded, the grid goes on
            self.manifest.record(key, "merge", m.name, "failed", error=f"{type(e).__name__}: {e}")
            prog.step(f"{m.name} FAILED: {e}")

    def _initial(self, backbone: str, src: str, inits: dict) -> str:
        """The shared initial drafter of a backbone (every variant starts from it: the base of task
        arithmetic and TIES), from its trained checkpoint ``src`` (a path or URI), written once per
        run under checkpoints/<backbone>-init."""
        if backbone not in inits:
            # its init holds the verifier's head rows: built where the verifier loads
            if backbone == "eagle3":
                r = self.p.resources.features
                task = ray.remote(num_cpus=r.num_cpus, num_gpus=r.num_gpus, max_retries=self.p.retries)
                model, cfg = ray.get(task(tasks.initial_task).options(name=f"merge:{backbone}-init").remote(
                    self.p.verifier, self.p.verifier_dtype, src))
            else:
                model, cfg = initial_of(storage.fetch(src))
            inits[backbone] = str(save_any(model, self.out / "checkpoints" / f"{backbone}-init", cfg))
        return inits[backbone]

    # ------------------------------------------------------------------ 4. evaluation
    def _prompts(self):
        out = {}
        pool = pool_sizes(self.p)  # per benchmark, the most prompts any cell reads
        for b in self.p.eval.benchmarks:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prompts, _ = load_benchmark(b)
            out[b] = subsample(prompts, pool[b], self.p.eval.seed)
        return out

    def _eval_units(self, ckpts):
        prompts = self._prompts()
        e = self.p.eval
        units = []
        for cell in eval_cells(self.p):
            if any(d not in ckpts for d in cell.drafters):
                units.append((cell, None, None, "missing drafter: " + ", ".join(d for d in cell.drafters
                        if d not in ckpts)))
                continue
            # a subset of the pool
            ps = subsample(prompts[cell.benchmark], cell_prompts(self.p, cell), e.seed)
            ck_keys = [self.ckpt_keys.get(d) for d in cell.drafters]  # retrained drafters -> new eval keys
            for s in range(0, len(ps), e.shard_size):
                shard = ps[s : s + e.shard_size]
                keys = [self._eval_key(cell, shard, [where(ckpts[d]) for d in cell.drafters], ck_keys)
                        for where in (self._rel, str)]
                units.append((cell, shard, keys, None))
        return units

    def _rel(self, ref: str) -> str:
        """An artifact's place relative to the run: eval keys survive a moved or copied run."""
        return ref[len(self.root):].lstrip("/") if ref.startswith(self.root) else ref

    def _eval_key(self, cell: EvalCell, shard, ckpt_refs: list[str], ck_keys: list) -> str:
        return unit_keys.eval_key(self.p, cell, self.verifier_name, [p.id for p in shard], ckpt_refs, ck_keys)

    def _paths(self, cell: EvalCell, key: str) -> tuple[str, str]:
        part = f"backbone={cell.backbone}/benchmark={cell.benchmark}/temperature={cell.temperature:g}"
        return f"traces/prompts/{part}/{key}.parquet", f"traces/steps/{part}/{key}.parquet"

    def stage_eval(self, ckpts) -> dict:
        units = self._eval_units(ckpts)
        self.manifest.set_plan("eval", [k for cell, _, keys, missing in units
                                        for k in (["eval-missing-" + cell.key] if missing else keys)])
        prog = Progress("eval", len(units))
        todo, earlier = self._eval_todo(units, prog)
        if not todo:
            return {"eval_units": len(units)}
        ev = self._plan(None, len(todo)).eval  # as many as the cluster holds, up to the cap
        run = EvalRun(self, prog, earlier)
        run.add(todo, ckpts)
        run.open(ev.units, ev.gpus)  # its share of a GPU
        run.drain()  # a failed actor's slot is probed in the background (EvalPool)
        run.close()
        return {"eval_units": len(units)}

    def _eval_todo(self, units, prog: Progress) -> tuple[list, dict]:
        """The units still to evaluate, and per unit the attempts earlier drivers made; the units
        with a missing drafter are recorded failed, the finished ones skipped."""
        todo, earlier = [], {}
        for cell, shard, keys, missing in units:
            if missing:
                self.manifest.record("eval-missing-" + cell.key, "eval", cell.label, "failed", error=missing)
                prog.step(f"{cell.label} skipped: {missing}", skipped=True)
            elif any(self.manifest.done(k) for k in keys):  # (keys[1]: runs before keys were relative)
                prog.step(f"{cell.label} (done earlier)", skipped=True)
            else:
                todo.append((cell, shard, keys[0]))
                prev = self.manifest.get(keys[0])  # unfinished attempts: failures, or a killed driver's
                earlier[keys[0]] = prev.get("attempts", 1) if prev and prev["status"] != "done" else 0
        return todo, earlier

    def _record_eval(self, cell: EvalCell, shard, key: str, attempts: int, result, prog: Progress) -> None:
        """A finished unit's traces written (then published), then recorded done in the manifest."""
        rows, steps = result
        self.lease.check()
        pfile, sfile = self._paths(cell, key)
        tags = {"unit_key": key, "invocation": self.invocation}
        cols = {"backbone": cell.backbone, "benchmark": cell.benchmark, "temperature": cell.temperature}
        rows = [{**x, **cols} for x in rows]

        def strip(records: list) -> list:  # the partition columns live in the path
            return [{k: v for k, v in x.items() if k not in PARTITIONS} | tags for x in records]

        write_parquet_atomic(strip(rows), self.out / pfile)
        write_parquet_atomic(strip([{**x, **cols} for x in steps]), self.out / sfile)
        self._publish(pfile)
        self._publish(sfile)
        calls = sum(x["verifier_calls"] for x in rows)
        tau = sum(x["new_tokens"] for x in rows) / calls if calls else float("nan")
        self.manifest.record(key, "eval", cell.label, "done", attempts=attempts, files=[pfile, sfile],
                             cell=cell.record, prompts=len(shard), rows=len(rows),
                             file_rows={pfile: len(rows), sfile: len(steps)})  # read back by done()
        if self.uri and time.time() - self._last_sync > MANIFEST_SYNC_S:  # what a crash can lose
            self._sync()
        prog.step(f"{cell.label} tau={tau:.2f}", acceptance=tau, cell=cell.label)

    # ------------------------------------------------------------------ 5. report
    def stage_report(self) -> None:
        if self.uri:  # traces of earlier runs, from other machines (one listing; none yet is fine)
            try:
                storage.sync(self.ref("traces"), str(self.out / "traces"), prune=True)
            except FileNotFoundError:
                pass
        build_report(self.out)
        self._publish("report")
