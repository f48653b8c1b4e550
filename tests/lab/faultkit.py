"""Fault injection for the lab tests of upgrade-cuda.yml (test_cuda_faults.py): a controller killed at a
chosen step while the container's apt, dpkg or pip go on, a package index that holds or fails its
answers, and reading the container's processes back.

- `start_playbook` runs ansible-playbook as its own process group, to be SIGKILLed (`kill_playbook`).
- `HoldingIndex` serves a PyPI "simple" directory on the lab link; `hold()` makes it keep every request
  waiting (a slow or hung mirror: pip waits on it), `fail()` answers 503 (an outage), `serve()` answers.
- `AlternativesPause`: an `update-alternatives` in /usr/local/sbin (put first on the maintainer
  scripts' PATH, which apt sets from DPkg::Path) that, while armed, holds the toolkit package's postinst at its `--install ... cuda-13.0` call:
  dpkg is then mid-configure, apt-get holds the frontend lock and dpkg the dpkg lock, as when a run is
  killed during the package step. Killing them there leaves dpkg interrupted (`iF`, its journal
  pending), as a container that crashed mid-install does.
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cudastack import ct

REPO = Path(__file__).resolve().parents[2]


def start_playbook(lab, tmp_path, playbook, extravars, skip_tags=None):
    """ansible-playbook as its own process group (run_playbook waits; this one is to be killed)."""
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(extravars))
    log = open(tmp_path / "play.log", "w")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.inventory_path), "-e", "@%s" % extra,
            str(REPO / playbook)]
    if skip_tags:
        argv += ["--skip-tags", skip_tags]
    proc = subprocess.Popen(argv, cwd=REPO, env=lab.ansible_env(), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def kill_playbook(proc, log) -> None:
    """SIGKILL ansible-playbook and everything of its process group on this side (ssh to pve1 with it)."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        log.close()


def wait_for(predicate, what, proc=None, timeout=600, every=2.0):
    """Poll until predicate() returns something true; fail naming `what` (and the playbook's end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError("the playbook ended (rc %s) before %s" % (proc.returncode, what))
        time.sleep(every)
    raise AssertionError("%s did not happen within %d s" % (what, timeout))


PS = r"""
import json, os
out = []
for name in os.listdir('/proc'):
    if name.isdigit():
        try:
            with open('/proc/%s/cmdline' % name, 'rb') as fh:
                cmd = fh.read().replace(b'\0', b' ').decode('utf-8', 'replace').strip()
        except OSError:
            continue
        if cmd:
            out.append([int(name), cmd])
print(json.dumps(out))
"""


def processes(lab, vmid=None) -> list[tuple[int, str]]:
    """(pid, command line) of every process in the container."""
    return [tuple(p) for p in json.loads(ct(lab, "python3 -c \"$1\"", PS, vmid=vmid).stdout)]


def alive(lab, pid: int) -> bool:
    return ct(lab, "kill -0 %d 2>/dev/null && echo yes || echo no" % pid).stdout.strip() == "yes"


class HoldingIndex:
    """A PyPI "simple" directory served on the lab link, whose answers a test holds or fails."""

    def __init__(self, lab, directory: Path):
        self.mode = "serve"
        self.changed = threading.Condition()
        self.held = threading.Event()           # a request arrived while holding
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):                   # noqa: N802 (http.server's name)
                with index.changed:
                    if index.mode == "hold":
                        index.held.set()
                        index.changed.wait_for(lambda: index.mode != "hold", timeout=900)
                    mode = index.mode
                if mode == "fail":
                    self.send_error(503, "Service Unavailable (servelab lab: index outage)")
                    return
                super().do_GET()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((lab.controller_address, 0),
                                                      functools.partial(Handler, directory=str(directory)))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://%s:%d/" % (lab.controller_address, self.server.server_address[1])

    def _set(self, mode: str) -> None:
        with self.changed:
            self.mode = mode
            self.changed.notify_all()

    def hold(self):
        self.held.clear()
        self._set("hold")

    def fail(self):
        self._set("fail")

    def serve(self):
        self._set("serve")

    def close(self) -> None:
        self.serve()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)


PAUSE_FLAG, PAUSED = "/run/servelab-lab-alt-pause", "/run/servelab-lab-alt-paused"
WRAPPER = "/usr/local/sbin/update-alternatives"
# apt runs dpkg with PATH=DPkg::Path (default /usr/sbin:/usr/bin:/sbin:/bin): /usr/local/sbin first.
APT_PATH_CONF, APT_PATH_TEXT = ("/etc/apt/apt.conf.d/99servelab-lab-dpkg-path",
                                'DPkg::Path "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin";\n')
# $PPID: the postinst's shell; its parent dpkg, dpkg's apt-get. Written as "wrapper postinst dpkg apt".
WRAPPER_TEXT = r"""#!/bin/sh
case " $* " in
  *" --install "*"/usr/local/cuda-13.0 "*)
    if [ -e %(flag)s ]; then
      parent() { sed 's/.*) //' /proc/$1/stat | cut -d' ' -f2; }
      dpkg=$(parent $PPID); apt=$(parent $dpkg)
      echo "$$ $PPID $dpkg $apt" > %(paused)s
      while [ -e %(flag)s ]; do sleep 0.2; done
    fi ;;
esac
exec /usr/bin/update-alternatives "$@"
""" % {"flag": PAUSE_FLAG, "paused": PAUSED}


class AlternativesPause:
    """Holds the cuda-toolkit-13-0 postinst (dpkg mid-configure) while armed; removed by close()."""

    def __init__(self, lab):
        self.lab = lab
        lab.ct_path(WRAPPER).write_text(WRAPPER_TEXT)
        os.chmod(lab.ct_path(WRAPPER), 0o755)
        lab.ct_path(APT_PATH_CONF).write_text(APT_PATH_TEXT)
        ct(lab, "touch %s; rm -f %s" % (PAUSE_FLAG, PAUSED))

    def paused(self):
        """(wrapper, postinst, dpkg, apt-get) PIDs once the postinst is held, else None."""
        out = ct(self.lab, "cat %s 2>/dev/null || true" % PAUSED).stdout.split()
        return tuple(int(p) for p in out) if len(out) == 4 else None

    def close(self) -> None:
        ct(self.lab, "rm -f %s %s %s %s" % (PAUSE_FLAG, PAUSED, WRAPPER, APT_PATH_CONF))
