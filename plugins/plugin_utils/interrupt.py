"""Interrupt handling for bench.yml, in ansible-playbook's main process (docs/architecture.md,
"The run lifecycle").

ansible-core does not run `always:` sections on Ctrl-C, and on SIGTERM it kills itself with the
default action, so neither stops a server that llm_server started in its own session. The
progress callback installs this guard: SIGTERM is turned into what Ctrl-C does (ansible forwards
SIGINT to its workers, which end their modules, and unwinds with KeyboardInterrupt), and at exit
a run that was opened (bench_run state=opened) and never closed is cleaned up by
playbooks/bench_interrupted.yml: same inventory, limit, extra vars and connection options, in a
session of its own so that a second Ctrl-C from the terminal cannot cut it short. It stops the
run's servers, reaps, releases the locks, marks the manifest `interrupted` with the level in
flight, and writes the report of what finished.

A second interrupt while this runs is ignored (with a line saying so); a third exits at once and
says how to clean up by hand.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLEANUP_PLAYBOOK = os.path.join(COLLECTION_ROOT, "playbooks", "bench_interrupted.yml")
DEFAULT_CLEANUP_TIMEOUT = 600.0

# ansible-playbook options replayed for the cleanup (CLIARGS key -> flag). Prompted passwords
# (-k, -K) cannot be replayed: use keys or vault files for runs that must clean up after
# themselves.
_VALUE_FLAGS = (
    ("subset", "--limit"), ("remote_user", "--user"), ("private_key_file", "--private-key"),
    ("connection", "--connection"), ("timeout", "--timeout"), ("become_method", "--become-method"),
    ("become_user", "--become-user"), ("ssh_common_args", "--ssh-common-args"),
    ("ssh_extra_args", "--ssh-extra-args"), ("sftp_extra_args", "--sftp-extra-args"),
    ("scp_extra_args", "--scp-extra-args"), ("module_path", "--module-path"), ("forks", "--forks"),
)
_LIST_FLAGS = (("inventory", "--inventory"), ("vault_ids", "--vault-id"),
               ("vault_password_files", "--vault-password-file"), ("extra_vars", "--extra-vars"))


@dataclass
class OpenRun:
    run_id: str
    results_root: str
    run_dir: str
    locked_hosts: List[str] = field(default_factory=list)   # hosts where bench_lock acquired


def cli_defaults() -> Dict:
    """What ansible-playbook's options are when not given (ansible.cfg included): only options
    the user changed are replayed, so the cleanup reads its settings where the run did."""
    try:
        from ansible.cli.playbook import PlaybookCLI

        cli = PlaybookCLI(["ansible-playbook", "playbook.yml"])
        cli.init_parser()
        return vars(cli.parser.parse_args(["playbook.yml"]))
    except Exception:  # noqa: BLE001 - without them every option is replayed, which is only verbose
        return {}


def cleanup_command(cliargs: Dict, run: OpenRun, owner_pid: int, status: str, reason: str,
                    playbook: str = CLEANUP_PLAYBOOK, ansible_playbook: Optional[str] = None,
                    defaults: Optional[Dict] = None) -> List[str]:
    """The ansible-playbook command line of the cleanup: the run's own options, then the run's
    identity as the last extra vars (they win over the user's)."""
    exe = ansible_playbook or _ansible_playbook()
    cmd = [sys.executable, exe] if exe.endswith(".py") or _is_python_script(exe) else [exe]
    cmd += _replayed_options(cliargs, cli_defaults() if defaults is None else defaults)
    cmd += ["--extra-vars", json.dumps({
        "bench_run_id": run.run_id, "bench_results_root": run.results_root,
        "bench_lock_owner_pid": owner_pid, "bench_interrupt_status": status,
        "bench_interrupt_reason": reason,
        "bench_resume_command": resume_command(cliargs, run.run_id, defaults)})]
    cmd.append(playbook)
    return cmd


def resume_command(cliargs: Dict, run_id: str, defaults: Optional[Dict] = None) -> str:
    """What the user types to continue the run: ansible-playbook with the run's own options
    and playbook, and -e bench_resume=<run_id> (the report of an interrupted run gives it).
    A secret given inline (-e bench_api_key=...) is masked: the report never holds one."""
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.servelab.serving.plugins.module_utils.redact import redact_cmdline
    cmd = ["ansible-playbook"]
    cmd += _replayed_options(cliargs, cli_defaults() if defaults is None else defaults)
    cmd += ["-e", "bench_resume=%s" % run_id]
    cmd += [str(p) for p in cliargs.get("args") or ()] or ["bench.yml"]
    return str(redact_cmdline(shlex.join(cmd)))


def _replayed_options(cliargs: Dict, defaults: Dict) -> List[str]:
    """The options of the run's command line that differ from ansible-playbook's defaults."""
    cmd: List[str] = []
    for key, flag in _LIST_FLAGS:
        for value in cliargs.get(key) or ():
            cmd += [flag, str(value)]
    for key, flag in _VALUE_FLAGS:
        value = cliargs.get(key)
        if key in defaults and value == defaults[key]:
            continue
        if value not in (None, "", (), []):
            cmd += [flag, ":".join(value) if isinstance(value, (list, tuple)) else str(value)]
    if cliargs.get("become"):
        cmd.append("--become")
    verbosity = int(cliargs.get("verbosity") or 0)
    if verbosity:
        cmd.append("-" + "v" * verbosity)
    return cmd


def _is_python_script(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _ansible_playbook() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0).startswith("ansible-playbook") and os.path.isfile(argv0):
        return os.path.abspath(argv0)
    return shutil.which("ansible-playbook") or "ansible-playbook"


class InterruptGuard:
    """One per ansible-playbook process (GUARD below); the progress callback installs it."""

    def __init__(self, say: Callable[[str], None] = None) -> None:
        self.installed = False
        self.main_pid: Optional[int] = None
        self.run: Optional[OpenRun] = None
        self.signals = 0
        self.signal_name = ""
        self.cleaning = False
        self.cliargs: Dict = {}
        self.cleanup_timeout = DEFAULT_CLEANUP_TIMEOUT
        self.cleanup_grace = 15.0       # after the time-out: SIGTERM, this long, then SIGKILL
        self._previous: Dict[int, object] = {}
        self._say = say

    # -- set-up --------------------------------------------------------------------------------

    def install(self, cliargs: Optional[Dict] = None, say: Callable[[str], None] = None,
                cleanup_timeout: Optional[float] = None) -> None:
        if say is not None:
            self._say = say
        if cleanup_timeout:
            self.cleanup_timeout = float(cleanup_timeout)
        if cliargs is not None:
            self.cliargs = dict(cliargs)
        if self.installed:
            return
        self.main_pid = os.getpid()
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        atexit.register(self.at_exit)
        self.installed = True

    def arm(self, run: OpenRun) -> None:
        self.run = run

    def note_lock(self, host: str) -> None:
        if self.run is not None and host not in self.run.locked_hosts:
            self.run.locked_hosts.append(host)

    def disarm(self) -> None:
        self.run = None

    # -- signals -------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        try:
            if self._say is not None:
                self._say(text)
                return
        except Exception:  # noqa: BLE001 - the terminal may be gone; the cleanup must go on
            pass
        try:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass

    def _reinstall(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _pass_on(self, signum: int, frame) -> None:
        """What would have happened without the guard."""
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _on_signal(self, signum: int, frame) -> None:
        if os.getpid() != self.main_pid or self.run is None and not self.cleaning:
            # A fork that kept our handler, or no run open: ansible's own behaviour.
            self._pass_on(signum, frame)
            return
        self.signals += 1
        name = signal.Signals(signum).name
        if self.signals == 1:
            self.signal_name = name
            self.say("servelab: %s: stopping run %s. Its servers are stopped and the report of "
                     "the finished levels is written before ansible-playbook exits (a second "
                     "interrupt is ignored, a third exits at once)." % (name, self.run.run_id))
            if self.cleaning:
                return
            # Ctrl-C's path for both signals: ansible forwards SIGINT to its workers (which end
            # their modules) and unwinds with KeyboardInterrupt. SIGTERM's own path would kill
            # this process outright, before any cleanup.
            try:
                previous = self._previous.get(signal.SIGINT)
                if callable(previous) and previous is not signal.default_int_handler:
                    previous(signal.SIGINT, frame)
                raise KeyboardInterrupt()
            finally:
                self._reinstall()   # ansible's handler put SIG_DFL back for the next one
        elif self.signals == 2:
            self.say("servelab: %s again: still cleaning up run %s; a third interrupt exits "
                     "without finishing that" % (name, self.run.run_id if self.run else ""))
        else:
            self.say("servelab: %s a third time: exiting now. To finish the cleanup run: "
                     "ansible-playbook %s -e bench_run_id=%s" % (
                         name, CLEANUP_PLAYBOOK, self.run.run_id if self.run else "<run_id>"))
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # -- exit ----------------------------------------------------------------------------------

    def at_exit(self) -> None:
        if os.getpid() != self.main_pid or self.run is None:
            return
        run, self.cleaning = self.run, True
        status = "interrupted" if self.signal_name else "aborted"
        reason = self.signal_name or "the playbook stopped before the run was closed"
        try:
            if not run.locked_hosts:
                self._close_here(run, status, reason)
            else:
                self._cleanup_playbook(run, status, reason)
        except Exception as exc:  # noqa: BLE001 - say what is left rather than a traceback
            self.say("servelab: cleanup of run %s failed: %r; run ansible-playbook %s -e "
                     "bench_run_id=%s" % (run.run_id, exc, CLEANUP_PLAYBOOK, run.run_id))
        finally:
            self.run = None

    def _close_here(self, run: OpenRun, status: str, reason: str) -> None:
        """Nothing was locked on a host, so nothing can run there: close the run in-process."""
        from ansible_collections.servelab.serving.plugins.module_utils.run.lock import (
            Controller, utc_now,
        )
        from ansible_collections.servelab.serving.plugins.plugin_utils.run_record import close_run

        close_run(run.results_root, run.run_id, Controller.of_pid(self.main_pid), status,
                  now=utc_now(), reason=reason,
                  resume_command=resume_command(self.cliargs, run.run_id))

    def _cleanup_playbook(self, run: OpenRun, status: str, reason: str) -> None:
        cmd = cleanup_command(self.cliargs, run, self.main_pid, status, reason)
        self.say("servelab: cleaning up run %s (%s): stopping its servers on %s, then the report "
                 "of what finished" % (run.run_id, reason, ", ".join(run.locked_hosts)))
        started = time.monotonic()
        # Its own session: a second Ctrl-C to the terminal's process group does not reach it.
        # stdout and stderr named explicitly: ansible-core marks fds 0-2 close-on-exec, and a
        # child left to inherit them would have none (and fail on its first line of output).
        child = subprocess.Popen(cmd, start_new_session=True, cwd=os.getcwd(),
                                 stdin=subprocess.DEVNULL, stdout=_fd(1), stderr=_fd(2))
        try:
            rc = child.wait(self.cleanup_timeout)
        except subprocess.TimeoutExpired:
            from ansible_collections.servelab.serving.plugins.module_utils.proc.terminate import (
                end_group,
            )

            # Its session is its process group: end all of it (what it started included).
            end_group(child.pid, grace=self.cleanup_grace, kill_timeout=15.0)
            self.say("servelab: the cleanup of run %s did not finish within %.0f s and was "
                     "stopped; run it by hand: %s"
                     % (run.run_id, self.cleanup_timeout, " ".join(cmd)))
            return
        self.say("servelab: cleanup of run %s %s in %.1f s%s" % (
            run.run_id, "done" if rc == 0 else "FAILED (rc %d)" % rc, time.monotonic() - started,
            "" if rc == 0 else "; run it again by hand: " + " ".join(cmd)))


def _fd(number: int):
    """The fd itself when it is open (Popen then clears its close-on-exec flag), else DEVNULL."""
    try:
        os.fstat(number)
    except OSError:
        return subprocess.DEVNULL
    return number


GUARD = InterruptGuard()
