"""During a level: print its figures so far from the file the llm_bench module rewrites.

The module's level controller writes a small JSON snapshot about once a second when it is given a
`progress_file` (module_utils/loadgen/live.py). llm_bench's action plugin can read that file only
where the module runs on the controller (a local connection: the bench client is this machine, as
in the embedded default inventory and `servelab bench --base-url`); there it watches the file from
a thread while it waits for the module, and prints a line (plugin_utils/progress.py's live_line)
every SERVELAB_LEVEL_PROGRESS_INTERVAL seconds (default 5; 0 turns the lines off), through the
same Display channel as the lines between levels. It only reads a file and prints: the level
never waits on it. The file's directory is named for the process that made it, so a run killed
before its cleanup leaves nothing that the next run does not remove (sweep_stale).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from typing import Callable, Iterator, List, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.live import read_live
from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import live_line
from ansible_collections.servelab.serving.plugins.plugin_utils.ticker import ticking

INTERVAL_ENV = "SERVELAB_LEVEL_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 5.0
LOCAL_TRANSPORTS = ("local", "ansible.builtin.local")
FILE_NAME = "level.json"
PREFIX = "servelab-live-"
STALE_NAME = re.compile("^%s(\\d+)-" % re.escape(PREFIX))   # PREFIX<pid>-<random>


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


def sweep_stale(parent: Optional[str] = None) -> List[str]:
    """Remove the directories of watches whose process is gone; return their paths.

    A watch's directory goes in its own `close` (the action's finally), which a SIGKILLed
    ansible-playbook never runs. Its name carries the PID of the process that made it, so the
    next watch removes it once that process is gone (by is_alive's rule). Only this user's
    directories, never a link; a directory of a live PID is kept, even if that PID was reused."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = STALE_NAME.match(entry.name)
        try:
            if not match or not entry.is_dir(follow_symlinks=False) \
                    or entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        if is_alive(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


class LiveWatch:
    """A directory for the module's file, and the thread that prints from it during a call."""

    def __init__(self, say: Callable[[str], None], interval: float, parent: Optional[str] = None):
        self.say, self.interval = say, float(interval)
        sweep_stale(parent)
        self.directory = tempfile.mkdtemp(prefix="%s%d-" % (PREFIX, os.getpid()), dir=parent)
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
