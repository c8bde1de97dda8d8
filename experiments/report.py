"""python experiments/report.py --run DIR: tables, figures and claim checks from DIR/traces."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", required=True, help="a full_grid output directory")
    args = ap.parse_args(argv)
    from orchestrator.report.build import build_report
    from orchestrator.report.duplicates import DuplicateRows

    if not Path(args.run).is_dir():
        print(f"error: run directory {args.run} does not exist", file=sys.stderr)
        return 2
    try:
        print(f"wrote {build_report(args.run)}")
    except DuplicateRows as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
