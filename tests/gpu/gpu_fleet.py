"""Start, track and always end the GPU processes of the GPU checks and the reap benchmark.

A "server" is shaped like a stopped SGLang TP=8 server: a CPU-only launcher that spawned
8 GPU workers (spread over the GPUs there are) and a CPU-only detokenizer; optionally a worker
with a setsid child holding a CUDA context, one with a double-forked daemon grandchild holding
one, and one that ignores SIGTERM. The launcher is then SIGKILLed, so the rest are orphans
reparented to init, as after a server stop that left its workers behind.
Besides: a decoy (CPU-only python, unrelated), an NVML monitor (GPU nodes open, no CUDA
context) and a protected GPU process.

Every process is tracked by PID (grandchildren report theirs through ready files) and its
command line carries the fleet's token; `cleanup()` SIGKILLs by PID whatever is left, checking
the token first so a reused PID is never hit.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Optional

from gpu_env import gpu_child_env, use_module_utils

use_module_utils()
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "gpu_worker.py")
READY_TIMEOUT = 300.0


def proc_state(pid: int) -> Optional[str]:
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


alive = lifetime.is_alive        # running and not a zombie: the code's own rule


def flatten(info: dict) -> List[dict]:
    out = [info]
    for sub in info.get("children", []) + info.get("detached", []):
        out.extend(flatten(sub))
    return out


class FleetError(RuntimeError):
    pass


class Fleet:
    def __init__(self, gpu_count: int = 1, workdir: Optional[str] = None) -> None:
        self.token = "slgpu" + uuid.uuid4().hex[:10]
        self.gpu_count = max(1, gpu_count)
        self.dir = workdir or tempfile.mkdtemp(prefix="servelab-gpu-")
        self.popens: List[subprocess.Popen] = []
        self.records: Dict[int, dict] = {}       # pid -> ready record (role in "tag")
        self._n = 0

    def tag(self, role: str) -> str:
        return "%s-%s" % (self.token, role)

    def args(self, role: str, *extra: str) -> List[str]:
        return [self.tag(role)] + list(extra)

    # -- starting ------------------------------------------------------------------------------
    def _start(self, role: str, extra: List[str], new_session: bool = True) -> dict:
        self._n += 1
        ready = os.path.join(self.dir, "ready-%d-%s" % (self._n, role))
        log = open(os.path.join(self.dir, "log-%d-%s" % (self._n, role)), "w")
        proc = subprocess.Popen([sys.executable, WORKER] + self.args(role, *extra)
                                + ["--ready", ready],
                                stdout=log, stderr=subprocess.STDOUT, env=gpu_child_env(),
                                start_new_session=new_session)
        log.close()
        self.popens.append(proc)
        self.records[proc.pid] = {"pid": proc.pid, "tag": self.tag(role)}
        return {"role": role, "ready": ready, "proc": proc, "log": log.name}

    def _wait(self, started: List[dict]) -> List[dict]:
        deadline = time.monotonic() + READY_TIMEOUT
        infos = []
        for s in started:
            while not os.path.exists(s["ready"]):
                if s["proc"].poll() is not None:
                    raise FleetError("%s exited with %s before it was ready; log tail:\n%s"
                                     % (s["role"], s["proc"].returncode, self.log_tail(s["log"])))
                if time.monotonic() > deadline:
                    raise FleetError("%s not ready after %.0f s; log tail:\n%s"
                                     % (s["role"], READY_TIMEOUT, self.log_tail(s["log"])))
                time.sleep(0.05)
            with open(s["ready"]) as fh:
                info = json.load(fh)
            info["popen"] = s["proc"]
            for rec in flatten(info):
                self.records[rec["pid"]] = {k: rec.get(k) for k in
                                            ("pid", "tag", "device", "mib", "pgid", "sid")}
            infos.append(info)
        return infos

    @staticmethod
    def log_tail(path: str, n: int = 30) -> str:
        try:
            with open(path) as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return "(no log)"

    def start_decoy(self) -> dict:
        return self._wait([self._start("decoy", ["--cpu-only"])])[0]

    def start_monitor(self) -> dict:
        """An NVML poller (GPU nodes open, no CUDA context), like a metrics exporter."""
        return self._wait([self._start("monitor", ["--nvml-monitor"])])[0]

    def start_protected(self, mib: int = 768) -> dict:
        return self._wait([self._start("protected", ["--mib", str(mib)])])[0]

    def start_server(self, workers: int = 8, mib: int = 1024, detached: bool = True,
                     ignore_term: bool = False) -> dict:
        """The launcher and its tree; returns the launcher's ready record."""
        specs = []
        for i in range(workers):
            extra = ["--mib", str(mib), "--device", str(i % self.gpu_count)]
            if detached and i == 1:
                extra += ["--setsid-child", json.dumps(self.args(
                    "worker1-setsid", "--mib", "512", "--device", str(i % self.gpu_count)))]
            if detached and i == 2:
                extra += ["--daemon-child", json.dumps(self.args(
                    "worker2-daemon", "--mib", "512", "--device", str(i % self.gpu_count)))]
            if ignore_term and i == 3:
                extra += ["--ignore-term"]
            specs.append(["--spawn", json.dumps(self.args("worker%d" % i, *extra))])
        specs.append(["--spawn", json.dumps(self.args("detokenizer", "--cpu-only"))])
        launcher_args = ["--cpu-only"] + [a for spec in specs for a in spec]
        return self._wait([self._start("launcher", launcher_args)])[0]

    # -- the "stopped server" --------------------------------------------------------------------
    def kill_launcher(self, launcher: dict) -> None:
        """SIGKILL the launcher (it is our child: reap it) so its tree is orphaned."""
        launcher["popen"].kill()
        launcher["popen"].wait(timeout=60)

    def pids(self, role_prefix: str = "") -> List[int]:
        return sorted(pid for pid, rec in self.records.items()
                      if (rec.get("tag") or "").startswith(self.tag(role_prefix)))

    def server_targets(self) -> List[int]:
        """Everything of the server except its launcher: what a reap must remove."""
        return sorted(p for p in self.pids() if self._role(p).startswith(("worker", "detok")))

    def _role(self, pid: int) -> str:
        return (self.records[pid].get("tag") or "")[len(self.token) + 1:]

    def role(self, pid: int) -> str:
        return self._role(pid) if pid in self.records else "?"

    # -- ending ----------------------------------------------------------------------------------
    def _ours(self, pid: int) -> bool:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                return self.token.encode() in fh.read()
        except OSError:
            return False

    def kill(self, pids: List[int]) -> None:
        for pid in pids:
            if alive(pid) and self._ours(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def wait_gone(self, pids: List[int], timeout: float = 60.0) -> List[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [p for p in pids if alive(p)]
            if not left:
                return []
            time.sleep(0.02)
        return [p for p in pids if alive(p)]

    def cleanup(self) -> List[int]:
        """Kill everything of ours by PID; returns the PIDs that would not die."""
        self.kill(list(self.records))
        for proc in self.popens:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        left = self.wait_gone(list(self.records), timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
        return left
