"""A table as data (header + rows of strings, footnotes), written as Markdown, HTML or aligned
text: the one table writer of the report (render.py), the live progress lines (progress.py) and
the benchmark scripts (benchmarks/).

Standard library only, and a leaf: the benchmarks run where the report's pandas may be missing.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Optional, Sequence


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _widths(cells: Sequence[Sequence[str]], count: int) -> list:
    return [max(len(r[i]) for r in cells if i < len(r)) for i in range(count)]


def _aligned(values: Sequence[str], widths: Sequence[int], right: Sequence[bool], start: str,
             sep: str, end: str) -> str:
    flags = list(right) + [False] * (len(widths) - len(right))
    return start + sep.join(v.rjust(w) if r else v.ljust(w)
                            for v, w, r in zip(values, widths, flags)) + end


@dataclass
class Table:
    headers: list
    rows: list  # lists of str, one per header
    footnotes: list = field(default_factory=list)

    def to_markdown(self, right: Optional[Sequence[bool]] = None) -> str:
        """A GitHub Markdown table, `|` in a cell escaped, then the footnotes after a blank line.
        With `right` the columns are padded to one width, as to_text() aligns them (`right[i]`
        right-aligns column i): the same table, easier to read where it is printed as text."""
        head = [_md_cell(h) for h in self.headers]
        body = [[_md_cell(c) for c in row] for row in self.rows]
        if right is None:
            lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _h in head) + "|"]
            lines += ["| " + " | ".join(row) + " |" for row in body]
        else:
            widths = _widths([head] + body, len(head))
            lines = [_aligned(head, widths, right, "| ", " | ", " |"),
                     "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
            lines += [_aligned(row, widths, right, "| ", " | ", " |") for row in body]
        if self.footnotes:
            lines += [""] + list(self.footnotes)
        return "\n".join(lines)

    def to_html(self) -> str:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
            for row in self.rows
        )
        notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in self.footnotes)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"

    def to_text(self, right: Sequence[bool] = ()) -> str:
        """Aligned plain text for a terminal: columns two spaces apart, each as wide as its
        widest cell, a rule of dashes under the header; `right[i]` right-aligns column i
        (numbers), the others are left-aligned. Trailing spaces are dropped."""
        cells = [[str(c) for c in self.headers]] + [[str(c) for c in row] for row in self.rows]
        widths = _widths(cells, len(self.headers))
        lines = [_aligned(row, widths, right, "", "  ", "").rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        if self.footnotes:
            lines += [""] + list(self.footnotes)
        return "\n".join(lines)
