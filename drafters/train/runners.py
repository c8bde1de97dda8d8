"""How the ranks step and agree: the optimizer backends and the collectives.

The optimizer backends the training loop steps through, one interface (``module``, ``autocast``,
``backward``, ``step``, ``save_state``, ``load_state``): DeepSpeed ZeRO 0-2, or plain AdamW on one
rank. And DeepSpeed's import and JIT builds set up so that training builds nothing and imports no
autotuner baggage (docs/training.md).

What the training ranks agree on through torch.distributed: one flag (do all ranks go on?), one
object per rank, counts summed over ranks, and the digest by which two ranks' weights are
compared. With one rank, or no process group (a simulated rank in tests), each is the local value."""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from pathlib import Path

import torch

from drafters.train.config import TrainConfig


def make_runner(model, opt, cfg: TrainConfig, world: int):
    """DeepSpeed's engine (``cfg.deepspeed``) or the plain runner, around ``model`` and ``opt``."""
    return _DeepSpeed(model, opt, cfg, world) if cfg.deepspeed else _Plain(model, opt, cfg)


def _deepspeed_config(cfg: TrainConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * world,
        "gradient_clipping": cfg.grad_clip if cfg.grad_clip_mode == "norm" else 0.0,  # value: hooks
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.precision == "bf16"},  # the engine casts the module; fp32 master weights
        "steps_per_print": 10**9,
    }


class _Plain:
    """The non-DeepSpeed path (same interface): AdamW + clipping + grad accumulation, one rank.
    bf16: float32 weights (the master copy) under autocast, so the matmuls run in bf16 as under
    DeepSpeed's bf16 engine, whose module holds bf16 weights beside float32 master ones."""

    def __init__(self, model, opt, cfg):
        self.module = model
        self.opt = opt
        self.cfg = cfg
        self.micro = 0

    def autocast(self):
        device = next(self.module.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def backward(self, loss):
        (loss / self.cfg.grad_accum).backward()

    def step(self):
        self.micro += 1
        if self.micro % self.cfg.grad_accum == 0:
            if self.cfg.grad_clip_mode == "norm":
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def save_state(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)  # a rank > 0 may get here before rank 0 made it
        torch.save(self.opt.state_dict(), d / "optimizer.pt")

    def load_state(self, d: Path):
        self.opt.load_state_dict(torch.load(d / "optimizer.pt"))


def _jit_build_setup() -> None:
    """Build any DeepSpeed JIT op once per Python environment (none is built by training: the CPU
    shm comm op is skipped, import_deepspeed):
    - pip's ninja, next to this Python, first on PATH: a system ninja 1.11 and pip's 1.13 hash
      commands differently, and each rebuilt the other's objects at every switch between a shell's
      PATH and a Ray worker's;
    - one build directory per ``sys.prefix`` as this process sees it (unless TORCH_EXTENSIONS_DIR
      is set): the build commands carry that path, so one venv reached by two paths (a worktree's
      symlink to it) or two venvs would otherwise rebuild each other's objects at every switch."""
    here = Path(sys.executable).parent
    if (here / "ninja").is_file() and os.environ.get("PATH", "").split(os.pathsep)[0] != str(here):
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        os.environ["TORCH_EXTENSIONS_DIR"] = str(jit_build_dir())


def jit_build_dir() -> Path:
    """~/.cache/torch_extensions/<python>-<hash of sys.prefix>: this environment's own build dir."""
    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:10]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_extensions"
    return base / f"py{sys.version_info.major}{sys.version_info.minor}-{tag}"


def import_deepspeed():
    """DeepSpeed without the MLflow import its autotuner attempts (``try: import mlflow``): with
    mlflow installed (the tracking extra) that import is most of `import deepspeed`, in every
    training process, for an autotuner nothing here runs. mlflow imports normally afterwards.

    Nor with the CPU accelerator's shm comm op: DeepSpeed's torch backend JIT-compiles it at
    start-up in every new Python environment (so in every fresh clone's first training), and it
    serves only ``inference_all_reduce`` (tensor-parallel inference kernels); training reduces
    gradients through torch.distributed (gloo on CPU) either way. Marked incompatible,
    ``build_shm_op`` returns None and the backend runs without it. (Other accelerators have no such
    op: nothing is marked there.) The costs these avoid are in docs/training.md."""
    _jit_build_setup()
    skip = "mlflow" not in sys.modules
    if skip:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError while this is set
    try:
        import deepspeed
    finally:
        if skip and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    from deepspeed.accelerator import get_accelerator

    shm = get_accelerator().get_op_builder("ShareMemCommBuilder")  # None but on the CPU accelerator
    if shm is not None:  # (reading the table probes every op, so it is left alone elsewhere)
        deepspeed.ops.__compatible_ops__[shm.NAME] = False
    return deepspeed


class _DeepSpeed:
    """DeepSpeed's engine (ZeRO ``cfg.zero_stage``; bf16: its bf16 module beside float32 master
    weights; norm clipping by the engine, value clipping by the parameter hooks)."""

    def __init__(self, model, opt, cfg, world):
        deepspeed = import_deepspeed()
        self.engine, self.opt, _, _ = deepspeed.initialize(model=model, optimizer=opt,
                                                           config=_deepspeed_config(cfg, world))
        self.module = self.engine.module

    def autocast(self):
        return contextlib.nullcontext()  # the engine's module is in the training precision already

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()

    def save_state(self, d: Path):
        self.engine.save_checkpoint(str(d / "deepspeed"), tag="state")

    def load_state(self, d: Path):
        self.engine.load_checkpoint(str(d / "deepspeed"), tag="state", load_module_strict=True)


def distributed() -> bool:
    """Whether a torch.distributed process group is up."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def all_ranks(go: bool, world: int) -> bool:
    """True iff ``go`` on every rank (one all-reduce of a flag; with one rank, ``go``)."""
    import torch.distributed as dist

    if world == 1 or not distributed():
        return go
    flag = torch.tensor([int(go)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def all_sum(values: list[int], world: int) -> list[int]:
    """``values`` (integer counts) summed element-wise over every rank (one all-reduce; with one
    rank, or no process group, ``values`` itself)."""
    import torch.distributed as dist

    if world == 1 or not distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [int(v) for v in t.tolist()]


def gather(obj, world: int) -> list:
    """``obj`` of every rank, in rank order (a collective when torch.distributed is up)."""
    import torch.distributed as dist

    if world == 1 or not distributed():
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def weights_digest(state: dict) -> str:
    """A short SHA-256 of a state dict's names, dtypes and bytes (what two ranks must agree on)."""
    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k].detach().to("cpu").contiguous()
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
