"""Level rows as people read them: values, table cells and the live line, all from FIELDS.

Every figure is formatted by its field's format spec and titled by its field's header and unit
(levels.py); a view is a layout of cells (levels.LAYOUTS). So the live line, the callback's line
and the report's tables show a level's figures with the same digits under the same names.
Rows may be typed dicts or frame rows (NaN for a missing figure); anything missing shows as "-".
Standard library only.
"""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_flags, level_verdict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import row_repeat
from ansible_collections.servelab.serving.plugins.module_utils.results.level_csv import as_bool
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    COUNT, KIND_BOOL, KIND_INT, KIND_STR, LAYOUTS, LOAD_MODE_RATE, QUANTILES, SPREAD,
    VIEW_LINE, Cell, field_of,
)

MISSING = "-"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _field(name: str):
    """The field of a column: the table's, or a chosen percentile's (levels.field_of)."""
    f = field_of(name)
    if f is None:
        raise KeyError(name)
    return f


def format_value(name: str, value) -> str:
    """One field's value as every view shows it: its format spec, "-" when not measured."""
    if _missing(value):
        return MISSING
    f = field_of(name)
    if f is None or f.kind == KIND_STR:
        return str(value)
    if f.kind == KIND_BOOL:
        return "yes" if as_bool(value) else "no"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return MISSING
    if math.isnan(number):
        return MISSING
    if f.kind == KIND_INT and number.is_integer():
        return format(int(number), f.fmt or "d")
    return format(number, f.fmt)


def _common_lead(headers: List[str]) -> List[str]:
    """The words every header starts with: ['TTFT'] for 'TTFT p50' and 'TTFT p99'."""
    split = [h.split() for h in headers]
    lead = []
    for words in zip(*split):
        if len(set(words)) != 1:
            break
        lead.append(words[0])
    return lead


def _unit(cell: Cell) -> str:
    unit = _field(cell.fields[0]).unit
    return " " + unit if unit else ""


def _quantile_label(cell: Cell) -> str:
    """'TTFT p50 / p99' for the cell of TTFT p50 and TTFT p99."""
    headers = [_field(n).header for n in cell.fields]
    lead = _common_lead(headers)
    rest = [" ".join(h.split()[len(lead):]) for h in headers]
    return " ".join(lead + [" / ".join(rest)])


def cell_header(cell: Cell) -> str:
    """A cell's column title, from its fields' headers and unit."""
    first = _field(cell.fields[0])
    if cell.shape == SPREAD:
        return "%s ± %s" % (first.title, _field(cell.fields[1]).header)
    if cell.shape == QUANTILES:
        return _quantile_label(cell) + _unit(cell)
    if cell.shape == COUNT:
        return "/".join(_field(n).header for n in cell.fields)
    return first.title


def cell_text(cell: Cell, row: Mapping) -> str:
    """A cell's value: '90.0 ± 2.2', '25.0 / 60.0', '3/40', '10.0'."""
    values = [format_value(n, row.get(n)) for n in cell.fields]
    if cell.shape == SPREAD:
        # No half-width (too few batches) or no value: the value alone, never "- ± 2.2".
        value, half = values
        return value if MISSING in (value, half) else "%s ± %s" % (value, half)
    if cell.shape == QUANTILES:
        return " / ".join(values)
    if cell.shape == COUNT:
        return MISSING if values[1] == MISSING else "%s/%s" % tuple(values)
    return values[0]


def cell_phrase(cell: Cell, row: Mapping) -> str:
    """A cell in running text: 'output 90.0 ± 2.2 tok/s', 'TTFT p50 25.0 ms', 'errors 0/40'."""
    text = cell_text(cell, row)
    if cell.shape == QUANTILES:
        return "%s %s%s" % (_quantile_label(cell).replace(" / ", "/"), text, _unit(cell))
    if cell.shape == COUNT:
        return "%s %s" % (_field(cell.fields[0]).header, text)
    return "%s %s%s" % (_field(cell.fields[0]).header, text, _unit(cell))


def view_headers(view: str) -> List[str]:
    return [cell_header(cell) for cell in LAYOUTS[view]]


def table_cells(row: Mapping, view: str) -> Dict[str, str]:
    """{column title: cell text} of one row in a table view, in the view's order."""
    return {cell_header(cell): cell_text(cell, row) for cell in LAYOUTS[view]}


def level_label(row: Mapping) -> str:
    """Which level a row is: 'C=8', or 'rate=2.50/s' for an open-loop level."""
    if row.get("load_mode") == LOAD_MODE_RATE:
        return "rate=%s/s" % format_value("request_rate", row.get("request_rate"))
    return "%s=%s" % (_field("concurrency").header,
                      format_value("concurrency", row.get("concurrency")))


def level_line(row: Mapping, repeats: Optional[int] = None) -> str:
    """The one line per finished level: the figures an operator watches, then what the report
    will say about the level (its verdict and flags). A repeat of a level measured more than
    once says which: "repeat 2/3" when the caller knows the repeats (the llm_bench action),
    else "repeat 2" from the row alone (repeat 1 then reads as the level)."""
    where = "%s/%s %s" % (row.get("host", "?"), row.get("profile", "?"), level_label(row))
    repeat = row_repeat(row)
    if repeats and repeats > 1:
        where += " %s %d/%d" % (_field("repeat").header, repeat, repeats)
    elif repeat > 1:
        where += " %s %d" % (_field("repeat").header, repeat)
    figures = ", ".join(cell_phrase(cell, row) for cell in LAYOUTS[VIEW_LINE])
    notes = [n for n in [level_verdict(row).note] + level_flags(row) if n]
    return "%s: %s" % (where, figures) + (" | " + "; ".join(notes) if notes else "")
