"""Nested mappings: one merge rule for profiles (target side) and the manifest (controller)."""
from __future__ import annotations

import copy
from typing import Mapping


def deep_merge(base: Mapping, update: Mapping) -> dict:
    """Return a new dict: `update` merged into `base`.

    Dicts merge key by key, recursively; anything else (lists included) in `update` replaces the
    value in `base`. Lists are replaced rather than concatenated so that re-running a task gives
    the same manifest (idempotence), not a list that grows.
    """
    merged = {k: copy.deepcopy(v) for k, v in base.items()}
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
