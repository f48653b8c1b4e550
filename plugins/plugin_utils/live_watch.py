"""During a level: print its figures so far from the file the llm_bench module rewrites.

The module's level controller writes a small JSON snapshot about once a second when it is given a
`progress_file` (module_utils/loadgen/live.py). llm_bench's action plugin can read that file only
where the module runs on the controller (a local connection: the bench client is this machine, as
in the embedded default inventory and `servelab bench --base-url`); there it watches the file from
a thread while it waits for the module, and prints a line (plugin_utils/progress.py's live_line)
every SERVELAB_LEVEL_PROGRESS_INTERVAL seconds (default 5; 0 turns the lines off), through the
same Display channel as the lines between levels. It only reads a file and prints: the level
never waits on it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Callable, Iterator, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.live import read_live
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import live_line
from ansible_collections.servelab.serving.plugins.plugin_utils.ticker import ticking

INTERVAL_ENV = "SERVELAB_LEVEL_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 5.0
LOCAL_TRANSPORTS = ("local", "ansible.builtin.local")
FILE_NAME = "level.json"


def interval_s(environ: Optional[Mapping] = None) -> float:
    """The seconds between two lines (SERVELAB_LEVEL_PROGRESS_INTERVAL); 0 when off or bad."""
    environ = os.environ if environ is None else environ
    try:
        value = float(environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return 0.0
    return value if value > 0 else 0.0


def is_local(connection) -> bool:
    """Whether the module runs on this machine (its file is readable here)."""
    return str(getattr(connection, "transport", "") or "") in LOCAL_TRANSPORTS


class LiveWatch:
    """A directory for the module's file, and the thread that prints from it during a call."""

    def __init__(self, say: Callable[[str], None], interval: float):
        self.say, self.interval = say, float(interval)
        self.directory = tempfile.mkdtemp(prefix="servelab-live-")
        self.path = os.path.join(self.directory, FILE_NAME)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    @contextlib.contextmanager
    def watching(self, where: str) -> Iterator[None]:
        """Print `where`'s figures every interval while the block runs (a new level each time:
        the previous level's file is removed first)."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        last = None

        def tick() -> bool:
            nonlocal last
            record = read_live(self.path)
            if record is None or record == last:
                return True
            last = record
            try:
                self.say(live_line(where, record))
            except Exception:  # noqa: BLE001 - a progress line never stops a level
                return False
            return True

        with ticking(self.interval, tick, "servelab-live-watch"):
            yield


def live_watch(connection, say: Callable[[str], None],
               environ: Optional[Mapping] = None) -> Optional[LiveWatch]:
    """A LiveWatch when the module runs here and the lines are on; else None."""
    interval = interval_s(environ)
    if not interval or not is_local(connection):
        return None
    return LiveWatch(say, interval)
