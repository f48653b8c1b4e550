"""The order of one sweep's measurements: its levels, each measured `repeats` times (llm_bench's
option; the bench role's `bench_repeats`), and the name each measurement's part files have.

The llm_bench action (plugins/action/llm_bench.py) runs one module call per measurement, in the
order given here, and keeps, remeasures or refuses each one that a resumed run already has
(plugin_utils/run_record.py), so a resumed sweep measures only the repeats it lacks.

The order is rounds: every level once (repeat 1), then every level again (repeat 2), and so on;
not a level's repeats back to back. Why:

- Drift. What changes over a run's minutes to hours (GPU clocks and heat, a neighbour's load on
  a shared host, the engine's caches and allocator) acts on whatever runs at the time. Back to
  back, a level's repeats share one stretch of time, so their spread misses the drift and the
  drift shifts the whole level: levels look more precise than they are, and a slow change can
  draw a fake trend across the levels. In rounds each level's repeats are spread over the sweep,
  so the drift lands in each level's spread, where the report's tie rule sees it.
- A run cut short (Ctrl-C, a dead host, a level that fails) still has a whole curve: every level
  measured at least once after the first round, rather than some levels N times and the rest
  not at all.
- The cost is the warm state a level leaves for the next one (prefix cache contents, KV usage,
  the batch mix): the next level starts after another load than in a back-to-back repeat. Every
  level already pays that in a sweep, and the sweep is built for it: the server is drained
  between levels (loadgen/drain.py) and every level has its warm-up before its window opens.

Controller only, standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

REPEATS_HELP = ("the times each level is measured (1: once; 2 or more give each level a spread, "
                "and the report calls a difference within it a tie)")


class RepeatsError(ValueError):
    """A repeats value that is not an integer >= 1; the message says what it must be."""


def check_repeats(value, name: str = "repeats") -> int:
    """`value` as the number of repeats; RepeatsError naming `name` otherwise."""
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
    if number is None or not number.is_integer() or number < 1:
        raise RepeatsError("%s: %r must be an integer >= 1, %s" % (name, value, REPEATS_HELP))
    return int(number)


@dataclass(frozen=True)
class Measurement:
    """One module call of a sweep: a level, one of its repeats."""
    position: int       # 0-based place in the sweep's order (the ETA counts measurements)
    level_index: int    # 0-based level of the sweep (the progress line's "level 3/8")
    repeat: int         # 1-based
    repeats: int        # the sweep's repeats
    cfg: object         # the level's loadgen LevelConfig
    step: dict          # the module's per-level option: {"concurrency": [C]} or request_rate
    label: str          # "C=5" or "rate=2/s"

    @property
    def where(self) -> str:
        """The level and, when there are several, the repeat: "C=5", "C=5 repeat 2/3"."""
        if self.repeats > 1:
            return "%s repeat %d/%d" % (self.label, self.repeat, self.repeats)
        return self.label


def sweep_order(configs: Sequence, repeats: int, rate_mode: bool) -> List[Measurement]:
    """Every (level, repeat) of the sweep in rounds (the module docstring says why)."""
    out: List[Measurement] = []
    for repeat in range(1, repeats + 1):
        for index, cfg in enumerate(configs):
            if rate_mode:
                step, label = {"request_rate": [cfg.request_rate]}, "rate=%g/s" % cfg.request_rate
            else:
                step, label = {"concurrency": [cfg.concurrency]}, "C=%d" % cfg.concurrency
            out.append(Measurement(position=len(out), level_index=index, repeat=repeat,
                                   repeats=repeats, cfg=cfg, step=step, label=label))
    return out


def part_key(host: str, profile: str, measurement: Measurement, rate_mode: bool) -> dict:
    """The row fields that name a measurement's part files (results/parts.py part_stem)."""
    key = {"host": host, "profile": profile, "concurrency": measurement.cfg.concurrency,
           "repeat": measurement.repeat}
    if rate_mode:
        key.update(load_mode="rate", request_rate=measurement.cfg.request_rate)
    return key
