"""levels.csv's cells: a row's values written as text, and read back typed.

The writer (results/parts.py) puts each value through csv_cell; the reader turns a record back
into a row dict by each column's field definition (results/levels.py FIELDS): its kind says
whether a cell is text, a flag, an integer or a float. as_bool is the one reading of a flag, for
typed values and for text alike (a pandas column of 'true'/'false', a row dict from JSON).

Standard library only: shipped to targets with the load generator.
"""
from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    KIND_BOOL, KIND_INT, KIND_STR, LevelField, field_of, server_field,
)

_TRUE = frozenset(("true", "1", "yes", "y", "t"))


def as_bool(value) -> bool:
    """A flag from a typed value or from text ('true', 'false', '1', ...); None is false."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return bool(value)


def csv_cell(value) -> object:
    """A value as levels.csv writes it: None blank, flags true/false, the rest as is."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _read_cell(f: LevelField, text: str):
    text = text.strip()
    if text == "" or text.lower() == "nan":
        # A blank text field that cannot be None was written from "" (e.g. stop_reason).
        return "" if f.kind == KIND_STR and not f.optional else None
    if f.kind == KIND_STR:
        return text
    if f.kind == KIND_BOOL:
        return text.lower() in _TRUE
    try:
        number = float(text)
    except ValueError:
        return None   # not a number where one belongs: shown as not measured
    if f.kind == KIND_INT and number.is_integer():
        return int(number)
    return number


def row_from_csv(record: Mapping[str, Optional[str]]) -> dict:
    """One levels.csv record (text cells, as csv.DictReader gives them) as a typed row dict.

    Only the columns present are set: an older or hand-written file keeps its gaps (and readers
    their defaults). server_* cells go back into `server_metrics`; columns the field table does
    not know (e.g. an optional `status`) are kept as text, blank as None."""
    row: dict = {}
    server: Dict[str, float] = {}
    for name, text in record.items():
        if name is None:            # cells beyond the header: nothing to name them by
            continue
        text = "" if text is None else str(text)
        f = field_of(name)
        if f is not None and not f.server:
            row[name] = _read_cell(f, text)
        elif f is not None or name.startswith("server_"):
            value = _read_cell(f or server_field(name, "", name, "", ""), text)
            if value is not None:
                server[name] = value
        else:
            row[name] = text.strip() or None
    if server or any(n.startswith("server_") for n in record if n):
        row["server_metrics"] = server
    return row
