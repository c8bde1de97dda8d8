"""Makes the packages named in $TASKSPEC_BLOCK_IMPORTS (comma-separated top-level names) look not
installed, in every process that has this folder on PYTHONPATH (Python imports ``sitecustomize`` at
start-up): ``import ray`` raises ModuleNotFoundError and ``importlib.util.find_spec("ray")`` returns
None, as on a machine without them. The tests use it to run a machine that has torch and
transformers but not Ray, DeepSpeed, polars or datasets (tests/test_gpu_check.py)."""
import os
import sys

for _name in os.environ.get("TASKSPEC_BLOCK_IMPORTS", "").split(","):
    if _name.strip():
        sys.modules[_name.strip()] = None  # the import system's own marker for "not importable"
