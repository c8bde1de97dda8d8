"""python experiments/verdicts.py --run DIR [--out FILE]: the verdict table of a run's report (one row
per checked comparison of the study's claims and the project's own, with its 95% interval and its raw
and Holm verdicts; then the claims the run could not check), as Markdown. Reads
DIR/report/tables/claims.csv, which `experiments/report.py --run DIR` writes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", required=True, help="a full_grid output directory with its report")
    ap.add_argument("--out", help="write the table here (default: stdout)")
    args = ap.parse_args(argv)
    import polars as pl

    from common.atomic import write_text_atomic
    from orchestrator.report.verdicts import headline, verdict_table

    path = Path(args.run) / "report/tables/claims.csv"
    if not path.is_file():
        print(f"error: {path} does not exist (build the report first: python experiments/report.py --run "
              f"{args.run})", file=sys.stderr)
        return 2
    claims = pl.read_csv(path, infer_schema_length=None)
    try:
        text = f"{headline(claims)}\n\n{verdict_table(claims)}"
    except ValueError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_text_atomic(Path(args.out), text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
