"""Views of shared memory: NumPy arrays that hold their mapping, over checked layouts.

Two rules make a view of shared memory safe to hand out:

- It holds its mapping. An array made by ``np.frombuffer`` over an ``mmap`` keeps
  a buffer export of it, so the mmap's ``close`` refuses (``BufferError``) while
  the array lives and the mapping goes with its last view; an array made by
  ``np.ndarray(buffer=mmap)`` keeps a reference but no export, and a close
  unmaps under it (its next read is a SIGSEGV). Every view here is made from a
  ``frombuffer`` array, and :func:`unmap` is the close that leaves a held
  mapping to its views.
- Its layout is checked before anything is mapped (:func:`checked_layout`): a
  negative dimension must not become "the rest of the buffer", and an object
  dtype must never read pointers out of shared memory.

:class:`shm.segment.Segment` adds the bounds of its user part and its access.
"""

from __future__ import annotations

import functools
import mmap
import operator
from typing import Any

import numpy as np

from shm.errors import LayoutError


def checked_layout(
    dtype: Any, shape: tuple[int, ...], room: int, where: str
) -> tuple[np.dtype[Any], int]:
    """The NumPy dtype and element count of ``dtype`` x ``shape``, checked to fit
    ``room`` bytes of shared memory (what every view's layout goes through once).

    Args:
        where: the room, for the message (e.g. ``"a slot of /rte.0.x.slab"``).

    Raises:
        LayoutError: ``dtype`` is no dtype, holds Python objects, has no size or a
            sub-shape; ``shape`` is not a tuple of integers each at least 1; or
            its bytes exceed ``room``. Nothing is mapped.
    """
    asked = f"{dtype!r} x {shape!r} for {where}"
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise LayoutError(f"{asked}: {dtype!r} is not a NumPy dtype ({exc})") from None
    if dt.hasobject:
        raise LayoutError(
            f"{asked}: dtype {dt} holds Python objects, which cannot live in shared "
            "memory; use a numeric dtype"
        )
    if dt.itemsize < 1 or dt.subdtype is not None:
        raise LayoutError(
            f"{asked}: dtype {dt} has no fixed size of its own; give a sized dtype "
            "(e.g. 'S16') and put any sub-shape in the shape"
        )
    if type(shape) is not tuple:
        raise LayoutError(f"{asked}: the shape must be a tuple of integers")
    count = 1
    for dim in shape:
        try:
            size = -1 if type(dim) is bool else operator.index(dim)
        except TypeError:
            size = -1
        if size < 1:
            raise LayoutError(
                f"{asked}: dimension {dim!r} is not an integer of at least 1 (a negative "
                "one would reach past the room, an empty one holds nothing)"
            )
        count *= size
    if count * dt.itemsize > room:
        raise LayoutError(
            f"{count * dt.itemsize:,} bytes of {dt} {shape} exceed {where} ({room:,} bytes)"
        )
    return dt, count


def flat(
    mapping: mmap.mmap,
    offset: int,
    dtype: np.dtype[Any],
    count: int,
    shape: tuple[int, ...],
    readonly: bool,
) -> np.ndarray[Any, Any]:
    """``count`` x ``dtype`` at ``offset`` of ``mapping`` as an array of ``shape``
    (bounds checked by the caller), holding the mapping."""
    view = np.frombuffer(mapping, dtype=dtype, count=count, offset=offset)
    try:
        view = view.reshape(shape)
    except (TypeError, ValueError):
        raise LayoutError(f"shape {shape} does not hold {count} x {dtype}") from None
    if readonly:
        view.flags.writeable = False
    return view


def strided(
    mapping: mmap.mmap,
    offset: int,
    count: int,
    stride: int,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    readonly: bool,
) -> np.ndarray[Any, Any]:
    """``count`` rows of ``dtype`` x ``shape``, ``stride`` bytes apart from
    ``offset`` of ``mapping``, as one array (bounds checked by the caller)."""
    # a view of a frombuffer array, whose base holds the mapping's buffer export
    raw = np.frombuffer(mapping, np.uint8, count=count * stride, offset=offset)
    view: np.ndarray[Any, Any] = np.ndarray(
        (count, *shape), dtype, buffer=raw, strides=(stride, *row_strides(dtype.itemsize, shape))
    )
    if readonly:
        view.flags.writeable = False
    return view


def unmap(mapping: mmap.mmap) -> bool:
    """Unmap ``mapping`` unless a view holds it (then it goes with the last one)."""
    try:
        mapping.close()
    except BufferError:
        return False
    return True


def elements(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@functools.cache
def row_strides(itemsize: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The C-order strides of one row of ``shape``."""
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
