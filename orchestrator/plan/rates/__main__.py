"""python -m orchestrator.plan.rates RUN_DIR [--out FILE]: a finished run's rates as JSON."""
from __future__ import annotations

from pathlib import Path

from orchestrator.plan.rates.measured import measure


def main(argv=None) -> int:
    """python -m orchestrator.plan.rates RUN_DIR [--out FILE]: a finished run's rates as JSON."""
    import argparse
    import sys

    from common.atomic import write_text_atomic

    ap = argparse.ArgumentParser(prog="python -m orchestrator.plan.rates", description=main.__doc__)
    ap.add_argument("run")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args(argv)
    try:
        r = measure(args.run)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_text_atomic(Path(args.out), r.to_json() + "\n")
    else:
        print(r.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
