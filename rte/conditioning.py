"""Equality of conditioning values, for deciding whether a heavy key changed.

Conditioning is nested Python values and NumPy arrays. ``==`` is not enough: an
array compares elementwise and its truth value is an error. Two values are
equal here when they have the same structure, the same types of container, and
equal leaves; arrays must match in shape, dtype and contents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def conditioning_equal(a: Any, b: Any) -> bool:
    """Structural equality over dicts, lists, tuples, sets, scalars and NumPy arrays."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))  # same NaNs: no change
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or a.keys() != b.keys():
            return False
        return all(conditioning_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return all(conditioning_equal(x, y) for x, y in zip(a, b, strict=True))
    result = a == b
    return bool(result) if isinstance(result, bool | np.bool_) else False
