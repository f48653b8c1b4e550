"""The simulator's side of a tune: which flags it models (a flag -> its SimProfile field) and
what a candidate's simulator settings are.

The simulator's own flags (`--max-running`, `--max-prefill-tokens`, every SimProfile field as
module_utils/simulator/cli.py defines it) name its fields directly. SGLang's names of the flags it
models come from the simulator's own table (module_utils/simulator/knobs.py; the stated
assumption of each flag's effect is docs/simulator.md's), so a tune space written for SGLang runs
unchanged on the embedded default.
Controller only.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict

from ansible_collections.servelab.serving.plugins.module_utils.simulator import knobs
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import SimProfile

_NOT_FLAGS = ("name", "description", "mode")


@functools.cache
def simulator_fields() -> Dict[str, str]:
    """{flag: SimProfile field}: the simulator's own flags, then SGLang's names it models."""
    out = {"--" + f.name.replace("_", "-"): f.name for f in dataclasses.fields(SimProfile)
           if f.name not in _NOT_FLAGS}
    for knob in knobs.SGLANG_KNOBS:
        out.setdefault("--" + knob.flag.replace("_", "-"), knob.field)
    for alias, flag in knobs.FLAG_ALIASES.items():
        out.setdefault("--" + alias.replace("_", "-"), out["--" + flag.replace("_", "-")])
    return out
