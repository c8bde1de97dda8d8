"""The study's whole grid on Ray: python experiments/full_grid.py --profile demo

Also runs under `ray job submit -- python experiments/full_grid.py ...` (RAY_ADDRESS is set then).
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout (ray job working_dir)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="demo", help="smoke | demo | paper | path/to/profile.yaml")
    ap.add_argument("--output-dir", default=None, help="default: runs/<profile>")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a profile value")
    ap.add_argument("--force", default=None,
                    help="redo one stage and what depends on it: features|train|merge|eval|report")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; load no model")
    ap.add_argument("--rates", default=None, metavar="RUN_DIR|FILE",
                    help="with --dry-run: time the plan with the stage rates measured on a finished run "
                         "(its directory) or saved from one (python -m orchestrator.plan.rates RUN_DIR), or "
                         "the GPU "
                         "check's packing file (or a directory holding it as gpu_rates.json)")
    ap.add_argument("--cluster", action="append", default=[], metavar="NODESxGPUS[xCPUS]",
                    help="with --dry-run: the makespan, billed and used GPU-hours on this cluster (e.g. 4x8; "
                         "repeatable), at the concurrency the driver would derive there")
    ap.add_argument("--take-over", action="store_true",
                    help="take the output over from a driver that holds its lease (one that is gone)")
    ap.add_argument("--tracking", choices=["none", "mlflow", "wandb"], default=None,
                    help="experiment tracking (profile key tracking.backend): MLflow file store under the "
                         "output dir, "
                         "or W&B offline")
    ap.add_argument("--verbose", action="store_true",
                    help="model-loading bars, library logs and Tune's status table")
    return ap


def _dry_run(profile, out: str, args) -> int:
    """Print the plan; load no model."""
    from orchestrator.plan.dryrun import print_plan

    try:
        print_plan(profile, out, args.rates, args.cluster)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _run(profile, out: str, uri: bool, args) -> int:
    """The grid under the driver, to the end or to a clean stop that releases the lease."""
    from orchestrator.plan.preflight import PreflightError
    from orchestrator.run.driver import Driver

    # `ray job stop` and a pod's deletion send SIGTERM: exit through the same path as Ctrl-C, so the
    # lease is released (Driver and Lease release it on every exception, KeyboardInterrupt included)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            driver = Driver(profile, out, force=args.force, take_over=args.take_over)
        except (PermissionError, ValueError) as e:  # the lease held elsewhere, an unwritable output...
            print(f"error: {e}", file=sys.stderr)
            return 2
        driver.run()
    except PreflightError as e:  # nothing has started: one line per missing data set / verifier
        print("\n".join(f"error: preflight: {line}" for line in e.problems), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the lease is released; rerun the same command to resume", file=sys.stderr)
        return 130
    where = out if uri else str(Path(out).resolve())
    print(f"done: results in {where} (report: {where}/report/report.md)")
    return 0


def main(argv=None) -> int:
    from orchestrator.plan.sizing import load_profile
    from orchestrator.profile import ProfileError

    args = _parser().parse_args(argv)
    if args.verbose:
        import os

        os.environ["TASKSPEC_VERBOSE"] = "1"
    if args.tracking:
        args.set.append(f"tracking.backend={args.tracking}")
    try:
        profile = load_profile(args.profile, args.set)
    except ProfileError as e:
        print(f"error: invalid profile: {e}", file=sys.stderr)
        return 2
    out = args.output_dir or f"runs/{profile.name}"
    from common.storage import is_uri
    from orchestrator.manifest import STAGES

    try:  # bad input is refused here, before the plan, the lease or any work
        if args.force is not None and args.force not in STAGES:
            raise ValueError(f"--force must be one of {list(STAGES)}, got {args.force!r}")
        uri = is_uri(out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(profile, out, args)
    return _run(profile, out, uri, args)


if __name__ == "__main__":
    sys.exit(main())
