"""python -m workers train ...: one drafter trained (features extracted first), with Ray Train +
DeepSpeed or in this process (workers/train_cli.py)."""
import sys

from workers.train_cli import main

if __name__ == "__main__":
    sys.exit(main())
