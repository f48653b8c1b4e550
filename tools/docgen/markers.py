"""A generated section of a text file, between `<!-- NAME:begin -->` and `<!-- NAME:end -->`:
shared by the generators in tools/docgen/ (each owns its NAME)."""
from __future__ import annotations

import re


class MarkerError(ValueError):
    """The file lacks the markers, or has them more than once."""


def markers(name: str):
    return "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name


def replace_section(text: str, name: str, body: str) -> str:
    """`text` with the section `name` holding `body` (the markers kept)."""
    begin, end = markers(name)
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if len(pattern.findall(text)) != 1:
        raise MarkerError("expected one %s ... %s section" % (begin, end))
    return pattern.sub(lambda _m: "%s\n%s\n%s" % (begin, body.rstrip("\n"), end), text)
