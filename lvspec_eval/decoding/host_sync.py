"""Counting the host's synchronisations with the device: every read of tensor data by the host and
every tensor made from host data, as the engine's own code makes them.

On a GPU each of these stalls the host until the device has caught up with its queue: `.item()`,
`.tolist()`, `.cpu()`, `.numpy()`, `bool()`, `int()`, `float()` and `operator.index()` of a tensor
(reads), and `torch.tensor(...)` / `torch.as_tensor(...)` of host values (an upload from pageable
memory waits for the stream too). On a CPU the same calls happen, so counting them here tells a GPU
user what a step will cost in round trips. Only calls made from `lvspec_eval`'s own code count:
transformers' internals are not ours to change.

While a `SyncCounter` is entered, those tensor methods and constructors are wrapped (the wrappers
cost a frame look-up per call, and only those calls pay it); on exit the originals are back. The
decoding loop counts every request's steps this way (stats: `host_syncs_per_step`).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Self

import torch

PROJECT = str(Path(__file__).resolve().parents[1])  # .../lvspec_eval
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
UPLOADS = ("tensor", "as_tensor")

_ACTIVE: list[SyncCounter] = []  # entered counters, innermost last (only the innermost counts)
_ORIGINALS: dict[tuple[object, str], object] = {}


class SyncCounter:
    """Counts host synchronisations made from the project's code while entered.

    count: the total so far; where: with `keep_where`, one "name file:line" per call (tests print it)."""

    def __init__(self, keep_where: bool = False):
        self.count, self.keep_where, self.where = 0, keep_where, []
        self.paused = False

    def __enter__(self) -> Self:
        if not _ACTIVE:
            _install()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)
        if not _ACTIVE:
            _uninstall()

    def add(self, name: str, frame) -> None:
        if self.paused:
            return
        self.count += 1
        if self.keep_where:
            self.where.append(f"{name} {Path(frame.f_code.co_filename).name}:{frame.f_lineno}")


def _counting(name: str, original):
    def wrapper(*args, **kwargs):
        if _ACTIVE:
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(PROJECT) and frame.f_code.co_filename != __file__:
                _ACTIVE[-1].add(name, frame)
        return original(*args, **kwargs)
    wrapper.__name__ = getattr(original, "__name__", name)
    return wrapper


def _targets():
    return [(torch.Tensor, name) for name in READS] + [(torch, name) for name in UPLOADS]


def _install() -> None:
    for owner, name in _targets():
        # None: the name is inherited (torch.Tensor's methods come from its C base), so it is deleted again
        _ORIGINALS[(owner, name)] = vars(owner).get(name)
        setattr(owner, name, _counting(name, getattr(owner, name)))


def _uninstall() -> None:
    for (owner, name), original in _ORIGINALS.items():
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _ORIGINALS.clear()
