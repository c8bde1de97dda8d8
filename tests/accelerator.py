"""A CPU stand-in for a CUDA device: host/device mixes fail as on CUDA; syncs and copies are counted.

Inside ``FakeCuda()``, a tensor is "on the accelerator" when it carries a tag; every other tensor is
on the host. Tags come from ``place(module_or_tensor)`` (the verifier's and the drafters' weights),
from ``.to("cuda")`` / ``.cuda()`` / ``device="cuda"`` in any factory, and from any op with a tagged
input. A tagged tensor reports ``device == cuda:0`` and ``is_cuda``, so code that asks a tensor or a
model for its device (``model.device``, ``features.device``) gets the accelerator, as on a GPU. The
data stays in CPU memory, so every result is the real result.

What raises (with CUDA's own wording where it has one):
- an op whose tensor arguments mix host and accelerator, except 0-dim host tensors (CUDA accepts
  those as scalars) and host index tensors into an accelerator tensor (CUDA copies them over);
- indexing a host tensor with accelerator indices; ``.numpy()`` of an accelerator tensor;
- a factory on the accelerator drawing from a host ``torch.Generator``, and any random op on an
  accelerator tensor given one (``multinomial``, ``uniform_``, ...);
- ``index_select``, ``gather``, ``take`` and the scatters with host index tensors (only ``x[idx]``
  copies host indices over);
- stacking or concatenating host and accelerator tensors, 0-dim ones included.

What is counted (``counts``): ``sync`` for every device-to-host read (``.item()``, ``.tolist()``,
``bool()``, ``int()``, ``float()``, ``.cpu()``, ``.to("cpu")``, ``host.copy_(device)``, printing, an
explicit ``torch.cuda.synchronize()``, and the reads CUDA makes in C++: indexing with a 0-dim
accelerator integer tensor or with an accelerator boolean mask, ``nonzero`` and the ops built on it
(``masked_select``, one-argument ``where``, ``unique``, ``repeat_interleave`` without ``output_size``),
one per accelerator tensor in the data of ``torch.tensor([...])``), ``h2d`` for every host-to-device
copy (``.to("cuda")`` of a host tensor, ``torch.tensor(..., device="cuda")``, host indices into an
accelerator tensor, host values written into one), ``d2h_async`` for every ``host.copy_(device,
non_blocking=True)`` (into pinned memory the host goes on; it reads the copy after a
``torch.cuda.Event``'s ``synchronize``, a ``sync``). ``where[kind]`` keeps the caller's file:line of
each event, so a test that fails on a budget names the lines that spent it.
"""
from __future__ import annotations

import collections
import contextlib
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

TAG = "_fake_cuda"
CUDA = torch.device("cuda", 0)
T = torch.Tensor
_GETTERS = {"device": T.device, "is_cuda": T.is_cuda, "is_cpu": T.is_cpu}
_SYNC_METHODS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__repr__", "__format__",
                 "__array__"}
_INDEXING = {"__getitem__", "index_select", "index", "take", "gather", "take_along_dim", "scatter",
             "scatter_",
             "scatter_add", "scatter_add_", "index_add", "index_add_", "index_copy", "index_copy_",
             "index_put",
             "index_put_"}
# x[idx]: CUDA copies
_COPIES_HOST_INDICES = {"__getitem__", "__setitem__", "index", "index_put", "index_put_"}
_DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "nonzero_static"}
_JOINS = {"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"}
_METADATA = {"_has_compatible_shallow_copy_type", "is_floating_point", "is_complex", "dim", "size", "numel",
             "__len__", "data_ptr", "element_size", "stride", "is_contiguous", "requires_grad_", "__hash__",
             "untyped_storage", "storage_offset", "get_device", "__get__", "__set__"}
_FACTORY_COPY = {"tensor", "as_tensor", "asarray", "from_numpy"}


class DeviceMismatch(RuntimeError):
    pass


def on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, TAG, False)


def _tag(x):
    if isinstance(x, torch.Tensor):
        try:
            setattr(x, TAG, True)
        except (AttributeError, RuntimeError):
            pass
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tag(y)
    return x


def _tensors(x, out: list) -> list:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)
    return out


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.Tensor):
        return on_device(device)
    if isinstance(device, int):
        return True  # .to(0): a CUDA ordinal
    return torch.device(device).type == "cuda"


def _to_target(args, kwargs):
    """(names the device?, is it the accelerator?) for Tensor.to's many signatures."""
    if "device" in kwargs:
        return True, _is_cuda(kwargs["device"])
    for a in args[1:]:
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            return True, _is_cuda(a)
        if isinstance(a, torch.Tensor):
            return True, on_device(a)
    return False, False


def _host_args(args, kwargs):
    """Tensor.to's arguments without the device: only the dtype, if one is named (the copy itself
    happens in CPU memory)."""
    dtype = kwargs.get("dtype")
    for a in args[1:]:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.Tensor):
            dtype = a.dtype
    return ([], {"dtype": dtype}) if dtype is not None else ([], {})


class FakeCuda(TorchFunctionMode):
    """``with FakeCuda() as acc:`` (see the module docstring). ``acc.place(model)`` tags weights."""

    def __init__(self, strict_numpy: bool = True, strict: bool = True):
        """``strict=False`` counts each host/device mix (``counts["mix"]``) instead of raising: used
        to measure code that would fail on CUDA (the old decode loop's syncs, for docs/cluster.md)."""
        super().__init__()
        self.strict = strict
        self.counts = collections.Counter()
        self.where: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.strict_numpy = strict_numpy
        self.sync_epoch = 0  # explicit device syncs so far (torch.cuda.synchronize)
        self._patches = contextlib.ExitStack()

    # -- setup ----------------------------------------------------------------------------------
    def place(self, obj):
        """Tag a module's parameters and buffers (or a tensor) as living on the accelerator."""
        if isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                _tag(t)
        else:
            _tag(obj)
        return obj

    def __enter__(self):
        self._patches.__enter__()
        self._patches.enter_context(_patch(torch.cuda, "is_available", lambda: True))
        self._patches.enter_context(_patch(torch.cuda, "synchronize", self._synchronize))
        self._patches.enter_context(_patch(torch.cuda, "current_device", lambda: 0))
        self._patches.enter_context(_patch(torch.cuda, "Event", self._event_class()))
        self._patches.enter_context(_patch(torch, "Generator", _DeviceGenerator))
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._patches.__exit__(*exc)
        return out

    def reset(self) -> None:
        self.counts.clear()
        self.where.clear()

    # -- events ---------------------------------------------------------------------------------
    def _note(self, kind: str) -> None:
        self.counts[kind] += 1
        self.where[kind][caller()] += 1

    def _synchronize(self, device=None) -> None:
        self._note("sync")
        self.sync_epoch += 1

    def _event_class(self):
        """torch.cuda.Event on the stand-in: records the host clock; ``elapsed_time`` raises unless
        a device sync came after both events were recorded (as a real event would not be complete)."""
        acc = self

        class Event:
            def __init__(self, enable_timing: bool = False, **kw):
                self.t, self.epoch = None, None

            def record(self, stream=None):
                self.t, self.epoch = time.perf_counter(), acc.sync_epoch

            def synchronize(self):  # the host waits for the device up to this event
                acc._note("sync")

            def elapsed_time(self, other) -> float:
                if max(self.epoch, other.epoch) >= acc.sync_epoch:
                    raise RuntimeError("timer read before a device sync closed it (CUDA: event not complete)")
                acc.counts["timer"] += 1
                return 1000.0 * (other.t - self.t)

        return Event

    def _mismatch(self, what: str):
        self._fail("Expected all tensors to be on the same device, but found at least two devices, cuda:0 "
                   "and "
                   f"cpu! ({what})")

    def _fail(self, msg: str):
        if self.strict:
            raise DeviceMismatch(msg)
        self._note("mix")

    # -- dispatch -------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        owner = getattr(func, "__self__", None)
        if name == "__get__":
            for attr, desc in _GETTERS.items():
                if owner is desc:
                    dev = on_device(args[0])
                    return {"device": CUDA if dev else torch.device("cpu"), "is_cuda": dev,
                            "is_cpu": not dev}[attr]
            out = func(*args, **kwargs)  # .T, .data, .grad, .shape, ...: a tensor keeps its device
            return _tag(out) if isinstance(out, torch.Tensor) and on_device(args[0]) else out
        if name == "__set__" and owner is T.data:  # param.data = new (Module.to / _apply)
            out = func(*args, **kwargs)
            if on_device(args[1]):
                _tag(args[0])
            return out
        if name == "_parse_to":  # Module.to's argument parser: keep the device it names
            return func(*args, **kwargs)
        if name in _METADATA:
            return func(*args, **kwargs)
        if name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            return self._move(name, func, args, kwargs)
        if name == "numpy" and args and on_device(args[0]) and self.strict_numpy:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                            "tensor to host memory first.")
        if name in _SYNC_METHODS and args and on_device(args[0]):
            self._note("sync")
            return func(*args, **kwargs)
        if name in _FACTORY_COPY and any(on_device(t) for t in _tensors(args[:1], [])):
            for _ in [t for t in _tensors(args[:1], []) if on_device(t)]:
                self._note("sync")  # torch.tensor([dev_a, dev_b]): each element read on the host
            args = (_untag_copy(args[0]),) + tuple(args[1:])
        if "device" in kwargs:  # factories: torch.arange(..., device=dev), new_empty(..., device=dev)
            gen = kwargs.get("generator")
            if gen is not None and _gen_on_device(gen) != _is_cuda(kwargs["device"]):
                where = ("cuda", "cpu") if _is_cuda(kwargs["device"]) else ("cpu", "cuda")
                raise RuntimeError(f"Expected a '{where[0]}' device type for generator "
                                   f"but found '{where[1]}'")
            if _is_cuda(kwargs["device"]):
                kwargs = {**kwargs, "device": "cpu"}
                out = func(*args, **kwargs)
                if name in _FACTORY_COPY and out.numel():  # host data copied over (empty: nothing)
                    self._note("h2d")
                return _tag(out)
            out = func(*args, **kwargs)
            return out
        tensors = _tensors(args, []) + _tensors(kwargs, [])
        dev = [t for t in tensors if on_device(t)]
        if not dev:
            if any(_gen_on_device(g) for g in (*args, *kwargs.values())
                   if isinstance(g, torch._C.Generator)):
                raise RuntimeError(f"{name}: Expected a 'cpu' device type for generator but found 'cuda'")
            out = func(*args, **kwargs)
            if name.startswith("new_") and args and on_device(args[0]):
                _tag(out)
            return out
        host = [t for t in tensors if not on_device(t)]
        self._check_generator(name, args, kwargs)
        if name in _JOINS and host:
            self._mismatch(f"{name}: a host tensor of shape {tuple(host[0].shape)} "
                           "joined to accelerator ones")
        if host:
            self._check_mix(name, args, host, kwargs)
        self._count_hidden_syncs(name, args, kwargs)
        out = func(*args, **kwargs)
        if name == "__setitem__" or name.endswith("_") and not name.startswith("__"):
            return out  # in place: the target keeps its device
        if name.startswith("new_") and args and not on_device(args[0]):
            return out
        return _tag(out)

    def _check_generator(self, name: str, args, kwargs) -> None:
        gens = [g for g in (*args, *kwargs.values()) if isinstance(g, torch._C.Generator)]
        if any(not _gen_on_device(g) for g in gens):
            raise RuntimeError(f"{name}: Expected a 'cuda' device type for generator but found 'cpu'")

    def _count_hidden_syncs(self, name: str, args, kwargs) -> None:
        """Device -> host reads that CUDA makes inside an op (C++), which no Python call shows."""
        if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and len(args) > 1:
            for t in _tensors(args[1], []):
                if on_device(t) and (t.dtype in (torch.bool, torch.uint8) or (t.dim() == 0
                        and not t.is_floating_point())):
                    self._note("sync")  # a mask's nonzero, or a 0-dim index read as a Python int
        elif name in _DATA_DEPENDENT or (name == "where" and len(args) + len(kwargs) == 1):
            self._note("sync")
        elif name == "repeat_interleave" and "output_size" not in kwargs and any(
                on_device(t) and t.dim() > 0 for t in _tensors(args[1:2],
                                                               []) + _tensors(kwargs.get("repeats"), [])):
            self._note("sync")

    def _check_mix(self, name: str, args, host: list, kwargs=None) -> None:
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in _INDEXING or name == "__setitem__":
            if self_t is not None and not on_device(self_t):
                if name == "__setitem__" and not _tensors(args[1], []):  # host[slice] = device: a copy
                    self._note("sync")
                    return
                return self._fail("indices should be either on cpu or on the same device as the indexed "
                                  "tensor (cpu)")
            if name not in _COPIES_HOST_INDICES and [t for t in host if t.dim() > 0]:
                return self._mismatch(f"{name}: host index tensor on an accelerator tensor")
            for t in host:
                if t.dim() > 0:
                    self._note("h2d")  # host indices / values copied to the device
            return
        if name in ("copy_",):
            if not on_device(self_t) and (kwargs or {}).get("non_blocking"):
                self._note("d2h_async")  # into pinned memory the host goes on; a reader waits on an event
                return
            self._note("h2d" if on_device(self_t) else "sync")  # host.copy_(device) waits for the device
            return
        big = [t for t in host if t.dim() > 0]
        if big:
            self._mismatch(f"{name}: host tensor of shape {tuple(big[0].shape)}")

    def _move(self, name, func, args, kwargs):
        t = args[0]
        if name == "cuda":
            target_named, to_dev = True, True
        elif name == "cpu":
            target_named, to_dev = True, False
        else:
            target_named, to_dev = _to_target(args, kwargs)
        if not target_named:  # dtype / copy only
            out = func(*args, **kwargs)
            return _tag(out) if on_device(t) else out
        if to_dev:
            if on_device(t):
                rest, kw = _host_args(args, kwargs)
                return _tag(T.to(t, *rest, **kw)) if (rest or kw) else t
            self._note("h2d")
            rest, kw = _host_args(args, kwargs)
            out = T.to(t, *rest, **kw) if (rest or kw) else t
            if out is t:
                out = t.detach().clone() if not t.requires_grad else t.clone()
            return _tag(out)
        if not on_device(t):
            rest, kw = _host_args(args, kwargs)
            return T.to(t, *rest, **kw) if (rest or kw) else t
        self._note("sync")  # a device-to-host copy waits for the device
        rest, kw = _host_args(args, kwargs)
        out = T.to(t, *rest, **kw) if (rest or kw) else t
        return out.clone() if out is t else out


class _DeviceGenerator(torch._C.Generator):
    """``torch.Generator`` inside the stand-in: ``device="cuda"`` gives a CPU generator that counts
    as the accelerator's (the same stream of numbers a CPU generator with that seed gives)."""

    def __new__(cls, device="cpu"):
        g = super().__new__(cls, "cpu")
        g.on_accelerator = _is_cuda(device)
        return g

    def __init__(self, device="cpu"):
        pass  # (the C type is set up by __new__)

    @property
    def device(self):
        return CUDA if self.on_accelerator else torch.device("cpu")


def _gen_on_device(g) -> bool:
    return bool(getattr(g, "on_accelerator", False))


def _untag_copy(data):
    """``torch.tensor``'s data with accelerator tensors replaced by their values (already counted)."""
    if isinstance(data, torch.Tensor):
        return data.detach().clone() if on_device(data) else data
    if isinstance(data, (list, tuple)):
        return type(data)(_untag_copy(x) for x in data)
    return data


@contextlib.contextmanager
def _patch(obj, attr, value):
    before = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, before)


def caller() -> str:
    """file:line of the nearest frame in this project (outside torch, transformers, the warnings
    machinery, this file and the GPU check that uses it)."""
    for frame in reversed(traceback.extract_stack(sys._getframe(2), limit=40)):
        f = frame.filename
        skip = Path(f).name in ("accelerator.py", "warnings.py", "gpu_check.py")
        if skip or "site-packages" in f or "/torch/" in f:
            continue
        return f"{'/'.join(Path(f).parts[-2:])}:{frame.lineno}"
    return "?"


class SyncCounter(TorchFunctionMode):
    """On a real CUDA device: counts device -> host reads (``sync``) and host -> device copies
    (``h2d``) the way FakeCuda does, without tagging anything (experiments/gpu_check.py)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.where = collections.defaultdict(collections.Counter)  # kind -> Counter of the caller's file:line

    def _note(self, kind: str) -> None:
        self.counts[kind] += 1
        self.where[kind][caller()] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is not None and t.is_cuda and (name in _SYNC_METHODS or name == "cpu"
                                            or (name == "to" and _to_target(args, kwargs) == (True, False))):
            self._note("sync")
        elif t is not None and not t.is_cuda and (name == "cuda" or (name == "to" and _to_target(args,
                kwargs)[1])):
            self._note("h2d")
        elif name in _FACTORY_COPY and _is_cuda(kwargs.get("device")):
            self._note("h2d")
        elif name == "synchronize":
            self._note("sync")
        return func(*args, **kwargs)
