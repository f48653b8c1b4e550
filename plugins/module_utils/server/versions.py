"""Engine version strings as comparable values (PEP 440 subset, stdlib only).

Flag spellings change at a release: the renderers compare the release tuple ("0.5.13.post1" is
release 0.5.13) against the first release with the new spelling. A pre-release or dev build of X
(0.5.14rc1, 0.5.14.dev20260101) is rendered as X, with a warning, because nightlies gain changes
one by one before the release does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Tuple

_VERSION_RE = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?P<pre>(?:a|b|rc)\d*)?"
    r"(?:\.?post(?P<post>\d*))?"
    r"(?:\.?(?P<dev>dev)\d*)?"
    r"(?:\+(?P<local>[A-Za-z0-9.]+))?\s*$")


class VersionError(ValueError):
    pass


@dataclass(frozen=True)
class EngineVersion:
    text: str
    release: Tuple[int, ...]
    prerelease: bool

    def at_least(self, release: Tuple[int, ...]) -> bool:
        return _pad(self.release) >= _pad(release)

    def __str__(self) -> str:
        return self.text


def _pad(release: Tuple[int, ...]) -> Tuple[int, ...]:
    return tuple(release) + (0,) * (4 - len(release))


def parse_version(text) -> EngineVersion:
    match = _VERSION_RE.match(str(text or ""))
    if not match:
        raise VersionError(
            f"engine_version {text!r} is not a version number; give it like 0.5.23 or 0.5.13.post1")
    release = tuple(int(part) for part in match.group("release").split("."))
    return EngineVersion(text=str(text).strip(), release=release,
                         prerelease=bool(match.group("pre") or match.group("dev")))
