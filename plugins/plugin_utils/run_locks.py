"""The controller's side of the run locks (plugins/module_utils/run/lock.py holds the records):
who this run's controller is, whether a holder is alive, what to take over, what to say, and the
bench_lock task's steps on the controller (`bench_lock_task`; plugins/action/bench_lock.py only
wires it to Ansible).

Controller only: a holder's pid means something only on the machine that recorded it.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.run.lock import (
    FOREIGN, LIVE, STALE, Controller, LockError, LockRecord, holder_state,
)


def controller_pid() -> int:
    """ansible-playbook's main process: the run's lifetime. Tasks run in worker processes that
    the main process forks for each task, so from a worker it is the parent; a worker pid would
    be dead as soon as the task ends and every lock would look stale."""
    if multiprocessing.current_process().name != "MainProcess":
        return os.getppid()
    return os.getpid()


def this_controller(owner_pid: Optional[int] = None) -> Controller:
    return Controller.of_pid(owner_pid or controller_pid())


def describe_resource(resource: str, host: str, server_port: Optional[int] = None) -> str:
    """What a lock resource is, in the operator's words. A port other than the run's
    `server_port` is one of the extra ports roles/bench/tasks/lock.yml holds with it: the
    router's halves (the server port + 1 and + 2) or a multi-node rank 0's dist-init port."""
    kind, _sep, value = resource.partition(":")
    if kind == "state_dir":
        return "the server state directory %s on %s" % (value, host)
    if kind == "port":
        if server_port is None or int(value) == int(server_port):
            return "server port %s on %s" % (value, host)
        if int(value) - int(server_port) in (1, 2):
            return ("port %s on %s (a router half: bench_server_port %s + %d)"
                    % (value, host, server_port, int(value) - int(server_port)))
        return "port %s on %s (the multi-node dist-init port, bench_dist_init_port)" % (value, host)
    if kind == "run":
        return "run id %s" % value
    return "%s on %s" % (resource, host)


@dataclass
class Decision:
    """What to do about the records that stood in the way of an acquisition."""
    take_over: List[str] = field(default_factory=list)     # tokens of records to replace
    warnings: List[str] = field(default_factory=list)
    refusals: List[str] = field(default_factory=list)      # non-empty: the run must not start


def _fix_variables(what: List[str]) -> str:
    """The variables that move this run off the resources described in `what`."""
    names = ["bench_state_dir", "bench_server_port"]
    if any("bench_dist_init_port" in w for w in what):
        names.append("bench_dist_init_port")
    return _joined(names)


def _joined(items: List[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def judge(conflicts: Iterable[tuple], me: Controller, break_lock: bool, host: str,
          server_port: Optional[int] = None) -> Decision:
    """conflicts: (resource, holder record). A live holder on this controller is never taken
    over; a stale one always is (with a warning); a foreign one only with break_lock. One
    refusal per holding run, naming everything it holds here (`server_port`: this run's, to
    tell it from the extra ports)."""
    decision = Decision()
    live: dict = {}
    foreign: dict = {}
    siblings: dict = {}
    for resource, holder in conflicts:
        what = describe_resource(resource, host, server_port)
        state = holder_state(holder.controller, me)
        if holder.controller.same_process(me):
            # This very run took it for another of its hosts: two inventory hosts on one machine.
            siblings.setdefault(holder.inventory_host or "another host", []).append(what)
        elif state == LIVE:
            live.setdefault(holder.describe(), (holder, []))[1].append(what)
        elif state == STALE:
            decision.take_over.append(holder.token)
            decision.warnings.append(
                "took over %s from %s: its ansible-playbook is gone (the run ended without "
                "releasing it)" % (what, holder.describe()))
        elif break_lock:
            decision.take_over.append(holder.token)
            decision.warnings.append(
                "broke the lock of %s held by %s from another controller, as bench_break_lock "
                "asked" % (what, holder.describe()))
        else:
            foreign.setdefault(holder.describe(), (holder, []))[1].append(what)
    for name, (holder, what) in live.items():
        decision.refusals.append(
            "%s %s in use by %s. One run at a time per state directory and port: wait for that "
            "run to end, or stop it (Ctrl-C, or kill %d: it stops its servers and writes its "
            "report), or give this run another %s"
            % (_joined(what), "is" if len(what) == 1 else "are", name, holder.controller.pid,
               _fix_variables(what)))
    for other, what in siblings.items():
        decision.refusals.append(
            "%s %s also used by %s in this same run: the two share one machine. Give each GPU "
            "server on a machine its own bench_state_dir and bench_server_port (host_vars)"
            % (_joined(what), "is" if len(what) == 1 else "are", other))
    for name, (holder, what) in foreign.items():
        decision.refusals.append(
            "%s %s held by %s, started from another controller (%s), whose liveness cannot be "
            "checked from here. If that run is over, rerun with -e bench_break_lock=true"
            % (_joined(what), "is" if len(what) == 1 else "are", name, holder.controller.host))
    return decision


def _same_host(record: LockRecord, inventory_host: Optional[str]) -> bool:
    """The record was taken for `inventory_host` (None: any host of the run; a record without a
    host name is the whole run's)."""
    return inventory_host is None or record.inventory_host in ("", inventory_host)


def ours(record: LockRecord, run_id: str, me: Controller,
         inventory_host: Optional[str] = None) -> bool:
    """A record of `run_id` (for `inventory_host`) that this controller process may act on: its
    own, or a stale one of the same run (the interrupt cleanup run by hand after its
    ansible-playbook was killed)."""
    if record.run_id != run_id or not _same_host(record, inventory_host):
        return False
    return record.controller.same_process(me) or holder_state(record.controller, me) == STALE


def others_alive(record: LockRecord, run_id: str, me: Controller,
                 inventory_host: Optional[str] = None) -> bool:
    """A record of another run that may still be running (live here, or on another controller),
    or of this same run for another of its hosts on this machine."""
    if record.run_id == run_id and record.controller.same_process(me):
        return not _same_host(record, inventory_host)
    return holder_state(record.controller, me) in (LIVE, FOREIGN)


def protect_pids(records: Sequence[LockRecord], servers: Sequence[dict], run_id: str,
                 me: Controller, own_state_dirs: Sequence[str] = (),
                 inventory_host: Optional[str] = None) -> List[int]:
    """Pids of the servers recorded in the state directories of the other live runs (and of this
    run's other hosts on the same machine): a reap for `inventory_host` must spare them (and
    their descendants). A state directory this host holds is never another's (the
    state-directory lock), so it is left out even if a stale record names it."""
    theirs = {r.state_dir for r in records
              if r.state_dir and others_alive(r, run_id, me, inventory_host)}
    theirs -= set(own_state_dirs)
    pids = set()
    for entry in servers:
        if entry.get("state_dir") in theirs:
            pids.update(int(s["pid"]) for s in entry.get("servers") or []
                        if s.get("alive") and s.get("pid"))
    return sorted(pids)


# ---------------------------------------------------------------------------------------------
# The bench_lock task on the controller (plugins/action/bench_lock.py is its Ansible wrapper)


class LockRefused(Exception):
    """The task must fail: the message says why and what to do; `result` goes with it."""

    def __init__(self, message: str, result: Optional[dict] = None):
        super().__init__(message)
        self.result = result or {}


def _record(data: dict, path: str) -> LockRecord:
    try:
        return LockRecord.from_dict(data, path=path)
    except LockError as exc:
        raise LockRefused("bench_lock: %s" % exc) from None


def _records(items) -> List[LockRecord]:
    return [_record(r, r.get("path", "")) for r in items or []]


def _describe_mine(result: dict, res: dict, records: Optional[List[LockRecord]] = None) -> None:
    if records is None:
        records = _records(res.get("acquired"))
    state_dirs = sorted({r.state_dir for r in records if r.state_dir})
    result["state_dirs"] = state_dirs
    result["ports"] = sorted({r.port for r in records if r.port is not None})
    # The servers recorded as running (or still alive) in the run's own state directories: what
    # the interrupt cleanup stops.
    result["servers"] = [
        {"name": s["name"], "state_dir": entry["state_dir"]}
        for entry in res.get("servers") or [] if entry.get("state_dir") in state_dirs
        for s in entry.get("servers") or [] if s.get("alive") or s.get("status") == "running"]
    result.setdefault("protect_pids", [])


def bench_lock_task(call: Callable[..., dict], args: dict, me: Controller, host: str,
                    check_mode: bool) -> dict:
    """The bench_lock task's result. `call(**module_args)` runs the module on the host (the
    target side, module_utils/run/lock.run_task) with `args`' own options plus the ones given,
    and raises when it fails; `host` is the inventory host the locks are for. Raises LockRefused
    when the run must not go on."""
    run_id, state = args["run_id"], args["state"]
    result = dict(run_id=run_id, state=state, controller=dataclasses.asdict(me),
                  changed=False, warnings=[])
    names = args.get("state_dir") or args.get("port") is not None
    if state == "acquired":
        if not names:
            raise LockRefused("bench_lock: state=acquired needs state_dir or port (what to "
                              "hold), e.g. state_dir: \"{{ bench_state_dir }}\"")
        controller = dataclasses.asdict(me)
        res = call(state="acquired", controller=controller)
        if res.get("conflicts"):
            decision = judge(((c["resource"], _record(c["holder"], c["path"]))
                              for c in res["conflicts"]), me, args["break_lock"], host,
                             args.get("port"))
            if decision.refusals:
                raise LockRefused("bench_lock: run %s refused: %s" % (
                    run_id, "; ".join(decision.refusals)), dict(conflicts=res["conflicts"]))
            res = call(state="acquired", controller=controller, take_over=decision.take_over)
            if res.get("conflicts"):
                holders = ["%s by %s" % (describe_resource(c["resource"], host, args.get("port")),
                                         _record(c["holder"], c["path"]).describe())
                           for c in res["conflicts"]]
                raise LockRefused("bench_lock: run %s refused: taken meanwhile: %s"
                                  % (run_id, "; ".join(holders)))
            result["warnings"].extend(decision.warnings)
        result.update(changed=bool(res.get("changed")), acquired=res.get("acquired") or [],
                      taken_over=res.get("taken_over") or [], held=True,
                      lock_dir=res.get("lock_dir"))
        _describe_mine(result, res)
        return result

    would_hold = False
    res = call(state="held")
    records = _records(res.get("records"))
    mine = [r for r in records if ours(r, run_id, me, host)]
    if state == "held" and names:
        # The role checks before each reap: a run whose lock was broken must not touch the state
        # directory or port again (the servers there are the other run's now).
        for resource in res.get("resources") or []:
            holder = next((r for r in records if r.resource == resource), None)
            if holder is None and check_mode:
                # --check took no lock (it writes nothing); a free resource is one the run
                # would hold.
                would_hold = True
                continue
            if holder is None or not ours(holder, run_id, me, host):
                by = holder.describe() if holder else "nobody (it was released)"
                raise LockRefused(
                    "bench_lock: run %s no longer holds %s: it is held by %s. This run stops "
                    "here without touching that state directory or port again"
                    % (run_id, describe_resource(resource, host, args.get("port")), by))
    if state == "released":
        pairs = [{"path": r.path, "token": r.token} for r in mine]
        rel = call(state="released", release=pairs)
        result.update(changed=bool(rel.get("changed")), released=rel.get("released") or [])
        res = rel
    result.update(held=(bool(mine) or would_hold) and state != "released",
                  lock_dir=res.get("lock_dir"))
    _describe_mine(result, res, records=mine if state != "released" else [])
    result["protect_pids"] = protect_pids(_records(res.get("records")), res.get("servers") or [],
                                          run_id, me, result["state_dirs"], host)
    return result
