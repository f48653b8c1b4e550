"""One benchmark run at a time per state directory and per server port (docs/architecture.md,
"The run lifecycle").

A lock is a small JSON record (LockRecord): which run holds the resource, and which controller
process runs that run (machine, boot, pid and its start time). It is published with link(2),
which either creates the name with the complete record or fails because the name exists: two
runs racing for a free resource cannot both win, and a reader never sees a half-written record.

Where the records live, on each host that serves (target side; standard library only):
  <state_dir>/run.lock.json        the server state directory (llm_server's state_dir)
  <lock_dir>/port-<port>.json      the server port; lock_dir is machine-wide (default
                                   <tmp>/servelab-locks), so it also lists every run that is
                                   benchmarking on this machine, whatever its state directory,
                                   and the reaper can spare the others' servers.
and on the controller <results_root>/.locks/run-<run_id>.json (one run per run id).

This module only reads, creates, replaces and removes records, every change under an flock on
<lock_dir>/.guard. Whether a holder is alive is decided where its controller pid means something,
on the controller (holder_state; the bench_lock and bench_run action plugins): a holder started
by this same controller machine in this boot whose pid still runs with the same start time holds
the lock; one whose process is gone is stale and may be taken over; one from another controller
machine cannot be checked from here and holds the lock unless the user breaks it.

Within one run, a record also names the inventory host it was taken for (`inventory_host`): two
GPU servers of the same run that turn out to share a machine (two inventory hosts on one box, the
test's network namespaces) must not both "hold" one state directory or port, release each
other's records, or reap each other's servers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.flock import held
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime as proc_lifetime
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process

STATE_DIR_LOCK = "run.lock.json"
GUARD = ".guard"
RUN_LOCK_DIR = ".locks"          # under the controller's results root
SERVER_STATE = "state.json"      # llm_server's per-server record (server/state.py)

# What a holder is, seen from this controller (holder_state).
LIVE = "live"          # this controller machine, this boot, the pid runs with its start time
STALE = "stale"        # this controller machine, but the process (or the boot) is gone
FOREIGN = "foreign"    # another controller machine: cannot be checked from here


class LockError(Exception):
    """An unusable lock directory or record; the message names the file and the fix."""


def default_lock_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "servelab-locks")


def _read_first(paths: Sequence[str]) -> str:
    for path in paths:
        try:
            with open(path, encoding="ascii") as fh:
                value = fh.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if value:
            return value
    return ""


@dataclass(frozen=True)
class Controller:
    """The ansible-playbook process that runs a run, and the machine it runs on."""
    host: str                         # host name, for messages
    machine_id: str                   # /etc/machine-id (the host name without one)
    boot_id: str                      # a reboot ends every process: all its locks are stale
    pid: int
    start_time: Optional[int] = None  # /proc/<pid>/stat field 22: a reused pid is not the run

    @classmethod
    def of_pid(cls, pid: int) -> Controller:
        """This machine's identity and process `pid` (call it on the controller)."""
        info = read_process(pid, stat_only=True)
        host = socket.gethostname()
        return cls(host=host,
                   machine_id=_read_first(("/etc/machine-id", "/var/lib/dbus/machine-id")) or host,
                   boot_id=_read_first(("/proc/sys/kernel/random/boot_id",)),
                   pid=int(pid), start_time=info.start_time if info else None)

    @classmethod
    def from_dict(cls, data: dict) -> Controller:
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in dict(data).items() if k in known})
        except TypeError as exc:
            raise LockError("controller identity %r is incomplete (%s)" % (data, exc)) from None

    def same_process(self, other: Controller) -> bool:
        return (self.machine_id, self.boot_id, self.pid, self.start_time) == (
            other.machine_id, other.boot_id, other.pid, other.start_time)

    def describe(self) -> str:
        return "ansible-playbook pid %d on %s" % (self.pid, self.host)


@dataclass(frozen=True)
class LockRecord:
    run_id: str
    resource: str                     # "state_dir:<real path>" | "port:<n>" | "run:<run_id>"
    controller: Controller
    token: str                        # unique per acquisition: what release and take-over name
    created: str                      # UTC, ISO 8601
    host: str = ""                    # the machine that holds the record
    state_dir: Optional[str] = None   # the run's server state directory on that machine
    port: Optional[int] = None
    # The inventory host the run took it for ("" for the controller's run-id record): one run
    # benchmarks many hosts, and two of them may share a machine.
    inventory_host: str = ""
    path: str = ""                    # where the record is (not stored in the file)

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("path")
        return data

    @classmethod
    def from_dict(cls, data: dict, path: str = "") -> LockRecord:
        known = {f.name for f in dataclasses.fields(cls)} - {"path", "controller"}
        try:
            return cls(controller=Controller.from_dict(data["controller"]), path=path,
                       **{k: v for k, v in data.items() if k in known})
        except (KeyError, TypeError) as exc:
            raise LockError("%s is not a servelab lock record (%s); delete it if no servelab run "
                            "is using this machine" % (path or "lock record", exc)) from None

    def describe(self) -> str:
        who = " for %s" % self.inventory_host if self.inventory_host else ""
        return "run %s%s (%s, since %s)" % (self.run_id, who, self.controller.describe(),
                                            self.created)

    def held_for(self, run_id: str, controller: Controller, inventory_host: str) -> bool:
        """This very run and controller process, for this inventory host: the record is the
        caller's own (a record without a host name is the whole run's)."""
        return (self.run_id == run_id and self.controller.same_process(controller)
                and self.inventory_host in ("", inventory_host))


@dataclass
class Conflict:
    resource: str
    path: str
    holder: LockRecord


@dataclass
class AcquireResult:
    acquired: List[LockRecord] = field(default_factory=list)    # ours now (new or kept)
    written: List[LockRecord] = field(default_factory=list)     # of those, the new records
    taken_over: List[LockRecord] = field(default_factory=list)  # the stale/broken ones replaced
    conflicts: List[Conflict] = field(default_factory=list)     # non-empty: nothing was written


def holder_state(holder: Controller, me: Controller) -> str:
    """LIVE, STALE or FOREIGN: what the controller `holder` is, judged on the controller `me`."""
    if holder.machine_id != me.machine_id:
        return FOREIGN
    if holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
        return STALE
    if proc_lifetime.is_alive(holder.pid, holder.start_time):
        return LIVE
    return STALE


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------------------------
# Files


def prepare_lock_dir(lock_dir: str) -> str:
    """Create the machine-wide lock directory. Sticky and world-writable like /tmp, so every user
    on the machine sees every run, and none can remove another user's records."""
    lock_dir = os.path.abspath(os.path.expanduser(lock_dir))
    try:
        os.makedirs(lock_dir)
        os.chmod(lock_dir, 0o1777)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LockError("cannot create the lock directory %s: %s" % (lock_dir, exc.strerror)) from None
    return lock_dir


def _open_guard(path: str) -> int:
    """The guard file, shared by every user of the machine: whoever creates it makes it
    writable for all (the umask would leave it 0644, and the next user could not open it for
    writing). flock needs no write access, so a guard made 0644 by an older release is opened
    read-only."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        pass
    except OSError as exc:
        raise LockError("cannot open %s: %s" % (path, exc.strerror)) from None
    else:
        try:
            os.fchmod(fd, 0o666)
        except OSError:
            pass
        return fd
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            return os.open(path, flags)
        except PermissionError:
            continue
        except OSError as exc:
            raise LockError("cannot open %s: %s" % (path, exc.strerror)) from None
    raise LockError("cannot open %s: permission denied" % path)


@contextlib.contextmanager
def guarded(lock_dir: str, timeout: float = 30.0) -> Iterator[None]:
    """Every change of a machine's records happens under this flock: a take-over reads the holder
    and replaces it in one step, so two runs cannot both take over the same stale record."""
    path = os.path.join(lock_dir, GUARD)
    with held(_open_guard(path), timeout, 0.05, lambda: LockError(
            "another servelab task has held %s for more than %.0f s; if none is running, delete "
            "the file" % (path, timeout))):
        yield


def read_record(path: str) -> Optional[LockRecord]:
    """The record at `path`, None when there is none."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LockError("cannot read the lock record %s (%s); delete it if no servelab run is "
                        "using it" % (path, exc)) from None
    if not isinstance(data, dict):
        raise LockError("%s is not a servelab lock record; delete it" % path)
    return LockRecord.from_dict(data, path=path)


def _tmp_record(directory: str, record: LockRecord) -> str:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-lock-", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record.as_dict(), fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    return tmp


def _publish(path: str, record: LockRecord, replace: bool) -> None:
    """link(2) a complete temporary record to `path`: fails with FileExistsError when `path`
    exists (unless `replace`, used under the guard for a take-over)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = _tmp_record(directory, record)
    try:
        if replace:
            os.replace(tmp, path)
            tmp = None
        else:
            os.link(tmp, path)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def real_dir(path: str) -> str:
    """The one spelling of a directory (~ expanded, links resolved): two runs naming one state
    directory differently still meet at one record."""
    return os.path.realpath(os.path.expanduser(path))


def state_dir_resource(state_dir: str) -> Tuple[str, str]:
    real = real_dir(state_dir)
    return "state_dir:" + real, os.path.join(real, STATE_DIR_LOCK)


def port_resource(lock_dir: str, port: int) -> Tuple[str, str]:
    return "port:%d" % int(port), os.path.join(lock_dir, "port-%d.json" % int(port))


def run_resource(lock_dir: str, run_id: str) -> Tuple[str, str]:
    return "run:" + run_id, os.path.join(lock_dir, "run-%s.json" % run_id)


def new_record(run_id: str, resource: str, controller: Controller, *, state_dir=None,
               port=None, inventory_host: str = "", path: str = "") -> LockRecord:
    return LockRecord(run_id=run_id, resource=resource, controller=controller,
                      token=uuid.uuid4().hex, created=utc_now(), host=socket.gethostname(),
                      state_dir=state_dir, port=port, inventory_host=inventory_host, path=path)


# ---------------------------------------------------------------------------------------------
# Operations (each under the guard)


def acquire(lock_dir: str, resources: Sequence[Tuple[str, str]], run_id: str,
            controller: Controller, *, state_dir: Optional[str] = None,
            port: Optional[int] = None, take_over: Sequence[str] = (),
            inventory_host: str = "", check_mode: bool = False,
            share_run: bool = False) -> AcquireResult:
    """Take every (resource, path) for `run_id` (on behalf of `inventory_host`), or none of them.

    A record of this very run, controller process and inventory host is kept as it is (running
    the lock task twice is harmless). A record whose token is in `take_over` (judged stale or
    broken by the caller) is replaced. Any other existing record is a conflict, also one of this
    same run taken for another inventory host (two hosts of the run on one machine): then nothing
    is written and the caller decides (holder_state) whether to try again with its token in
    `take_over`. With `share_run` a record of this same run and controller process for another
    of its inventory hosts counts as held, not as a conflict: a multi-node profile's rank binds
    the port of rank 0 on its own address, and two ranks on one machine (loopback) meet at one
    machine-wide port record."""
    result = AcquireResult()
    if check_mode:
        # Read only: no lock directory, no guard file, nothing written anywhere.
        lock_dir, guard = os.path.abspath(os.path.expanduser(lock_dir)), contextlib.nullcontext()
    else:
        lock_dir = prepare_lock_dir(lock_dir)
        guard = guarded(lock_dir)
    with guard:
        plan = []
        for resource, path in resources:
            holder = read_record(path)
            if holder is not None and (
                    holder.held_for(run_id, controller, inventory_host)
                    or (share_run and holder.run_id == run_id
                        and holder.controller.same_process(controller))):
                result.acquired.append(holder)
            elif holder is not None and holder.token not in take_over:
                result.conflicts.append(Conflict(resource, path, holder))
            else:
                plan.append((resource, path, holder))
        if result.conflicts or check_mode:
            return result
        for resource, path, holder in plan:
            # a port record names its own port (a router half's, say); the state directory's
            # names the server port
            own_port = int(resource.split(":", 1)[1]) if resource.startswith("port:") else port
            record = new_record(run_id, resource, controller, state_dir=state_dir,
                                port=own_port, inventory_host=inventory_host, path=path)
            _publish(path, record, replace=holder is not None)
            result.acquired.append(record)
            result.written.append(record)
            if holder is not None:
                result.taken_over.append(holder)
    return result


def release(lock_dir: str, paths_tokens: Sequence[Tuple[str, str]],
            check_mode: bool = False) -> List[str]:
    """Remove each record at path whose token is the given one (a record that changed hands
    since it was read is left alone). Returns the paths removed."""
    removed = []
    if not os.path.isdir(os.path.expanduser(lock_dir)):
        return removed
    lock_dir = prepare_lock_dir(lock_dir)
    with contextlib.nullcontext() if check_mode else guarded(lock_dir):
        for path, token in paths_tokens:
            holder = read_record(path)
            if holder is None or holder.token != token:
                continue
            if not check_mode:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            removed.append(path)
    return removed


def port_records(lock_dir: str) -> List[LockRecord]:
    """Every port record on this machine: every run that benchmarks here now (or died doing
    it), each naming its state directory."""
    out = []
    for path in sorted(glob.glob(os.path.join(os.path.expanduser(lock_dir), "port-*.json"))):
        record = read_record(path)
        if record is not None:
            out.append(record)
    return out


@dataclass
class RecordedServer:
    """A server llm_server recorded under a state directory (server/state.py's state.json)."""
    name: str
    pid: Optional[int]
    start_time: Optional[int]
    status: str
    alive: bool


def servers_in(state_dir: str) -> List[RecordedServer]:
    """The servers recorded under `state_dir`, alive or not (read-only)."""
    out = []
    base = real_dir(state_dir)
    for path in sorted(glob.glob(os.path.join(base, "*", SERVER_STATE))):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        pid, start = data.get("pid"), data.get("start_time")
        out.append(RecordedServer(
            name=os.path.basename(os.path.dirname(path)), pid=pid, start_time=start,
            status=str(data.get("status") or ""),
            alive=bool(pid) and proc_lifetime.is_alive(pid, start)))
    return out


def survey(lock_dir: str, state_dirs: Sequence[str] = ()) -> Dict[str, list]:
    """What the action plugin needs to decide, read in one go: every port record, the state
    directory records they name (and those of `state_dirs`), and the servers recorded in each of
    those state directories. JSON-ready."""
    records: Dict[str, LockRecord] = {}
    for record in port_records(lock_dir):
        records[record.path] = record
    dirs = list(state_dirs) + [r.state_dir for r in list(records.values()) if r.state_dir]
    servers = {}
    for state_dir in dirs:
        _name, path = state_dir_resource(state_dir)
        record = read_record(path)
        if record is not None:
            records[record.path] = record
        real = real_dir(state_dir)
        servers[real] = [dataclasses.asdict(s) for s in servers_in(real)]
    return {
        "records": [dict(r.as_dict(), path=r.path) for r in records.values()],
        "servers": [{"state_dir": d, "servers": s} for d, s in sorted(servers.items())],
    }


# ---------------------------------------------------------------------------------------------
# The bench_lock module's task (plugins/modules/bench_lock.py is its Ansible wrapper)


def task_resources(params: dict, lock_dir: str) -> List[Tuple[str, str]]:
    """(resource, path) of what a bench_lock task names: its state directory, its port and its
    extra ports."""
    out = []
    if params.get("state_dir"):
        out.append(state_dir_resource(params["state_dir"]))
    if params.get("port") is not None:
        out.append(port_resource(lock_dir, params["port"]))
    for extra in params.get("extra_ports") or ():
        if extra != params.get("port"):
            out.append(port_resource(lock_dir, extra))
    return out


def run_task(params: dict, check_mode: bool, result: dict) -> dict:
    """Do what a bench_lock task asks on this host, filling in `result` (also when a LockError
    stops it half-way: the module fails with what was found so far)."""
    lock_dir = params.get("lock_dir") or default_lock_dir()
    if params["state"] == "acquired":
        outcome = acquire(
            lock_dir, task_resources(params, lock_dir), params["run_id"],
            Controller.from_dict(params["controller"]),
            state_dir=real_dir(params["state_dir"]) if params.get("state_dir") else None,
            port=params.get("port"), take_over=params.get("take_over") or (),
            inventory_host=params.get("inventory_host") or "", check_mode=check_mode,
            share_run=bool(params.get("share_run")))
        result["acquired"] = [r.as_dict() for r in outcome.acquired]
        result["taken_over"] = [r.as_dict() for r in outcome.taken_over]
        result["conflicts"] = [dict(resource=c.resource, path=c.path, holder=c.holder.as_dict())
                               for c in outcome.conflicts]
        result["changed"] = bool(outcome.written)
    elif params["state"] == "released":
        pairs = [(str(item.get("path")), str(item.get("token")))
                 for item in params.get("release") or ()]
        result["released"] = release(lock_dir, pairs, check_mode=check_mode)
        result["changed"] = bool(result["released"])
    state_dirs = [params["state_dir"]] if params.get("state_dir") else []
    result.update(survey(lock_dir, state_dirs))
    # The resources as this host spells them (its realpath, its ~): the action compares records
    # with these, never with a path resolved on the controller.
    result["resources"] = [name for name, _path in task_resources(params, lock_dir)]
    result["lock_dir"] = lock_dir
    return result
