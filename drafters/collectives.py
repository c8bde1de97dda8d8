"""What the training ranks agree on through torch.distributed: one flag (do all ranks go on?), one
object per rank, counts summed over ranks, and the digest by which two ranks' weights are
compared. With one rank, or no process group (a simulated rank in tests), each is the local value."""
from __future__ import annotations

import hashlib

import torch


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
