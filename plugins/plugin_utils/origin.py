# -*- coding: utf-8 -*-
"""Where a variable's value was set (file:line), for the messages of the controller's checks
(bench_preflight, role_vars_check): ansible-core 2.19's data tags carry it."""
from __future__ import annotations

import os

try:   # ansible-core 2.19's data tags say which file and line a value came from
    from ansible._internal._datatag._tags import Origin
except ImportError:   # older cores: messages go without the location
    Origin = None


def value_origin(value) -> str:
    """file:line where `value` was set (relative to the working directory when under it), or ''."""
    if Origin is None:
        return ""
    try:
        tag = Origin.get_tag(value)
    except Exception:  # noqa: BLE001 - diagnostics only; never fail a check over a location
        return ""
    if not tag or not tag.path:
        return ""
    path, cwd = str(tag.path), os.getcwd()
    if path.startswith(cwd + os.sep):
        path = os.path.relpath(path, cwd)
    return "%s:%s" % (path, tag.line_num) if tag.line_num else path
