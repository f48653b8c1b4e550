"""The run manifest (docs/architecture.md, results contract): results/<run_id>/manifest.json.

Several hosts benchmark in parallel Ansible forks and each records its own part (GPU facts, the
server command line of each profile, failures). Every writer takes an exclusive fcntl lock on
results/<run_id>/.lock, reads the manifest, deep-merges its dict and writes it back atomically, so
no fork's part is lost and readers never see a torn file. llm_bench takes the same lock (same
file, also `fcntl.flock`) while it rebuilds levels.csv.

Controller-side only (pandas-free, stdlib).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

# deep_merge is also re-exported from here: the manifest merges with it.
from ansible_collections.servelab.serving.plugins.module_utils.flock import held_file
from ansible_collections.servelab.serving.plugins.module_utils.mapping import deep_merge
from ansible_collections.servelab.serving.plugins.module_utils.redact import collect_secrets, redact_tree
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LATEST_LINK,
    MANIFEST,
    atomic_write_json,
)

LOCK_FILE = ".lock"


class ManifestError(Exception):
    """Bad input or an unusable results directory; the message names the field and the fix."""


@dataclass
class ManifestUpdate:
    path: str
    changed: bool
    manifest: dict
    latest_link: str | None = None
    latest_changed: bool = False
    recorded: list = field(default_factory=list)


@contextlib.contextmanager
def run_lock(run_dir: str, timeout: float = 120.0) -> Iterator[None]:
    """Hold the run's exclusive lock (fcntl.flock on <run_dir>/.lock), bounded by `timeout`.

    flock, not lockf: the two kinds do not exclude each other on Linux, and every servelab writer
    of a run directory uses flock on this file.
    """
    os.makedirs(run_dir, exist_ok=True)
    lock_path = os.path.join(run_dir, LOCK_FILE)
    with held_file(lock_path, timeout, 0.02, lambda: ManifestError(
            f"could not lock {lock_path} within {timeout:.0f} s: another servelab task holds it; "
            "if none is running, delete the file")):
        yield


def read_manifest(run_dir: str) -> dict:
    """The manifest of a run, {} when there is none yet."""
    path = os.path.join(run_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); fix or remove it") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def git_commit(directory: str) -> dict:
    """`git rev-parse HEAD` of `directory` and whether its tree is dirty; else the reason."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "-C", directory, *args], capture_output=True, text=True, timeout=30, check=False
        )

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {
                "commit": None,
                "dirty": None,
                "reason": (head.stderr.strip().splitlines() or ["git rev-parse failed"])[-1],
            }
        status = git("status", "--porcelain", "--untracked-files=no")
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return {"commit": head.stdout.strip(), "dirty": dirty, "reason": None}
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"commit": None, "dirty": None, "reason": f"git unavailable: {exc}"}


def check_json_serialisable(data: Any, name: str = "merge") -> None:
    """Fail before touching anything when `data` cannot go into JSON as it is."""
    try:
        json.dumps(data, allow_nan=True, sort_keys=True, default=str)
    except (TypeError, ValueError) as exc:
        raise ManifestError(
            f"`{name}` cannot be written as JSON ({exc}); pass plain dicts, lists, "
            "strings and numbers"
        ) from exc


def update_latest_link(run_dir: str, check_mode: bool = False) -> tuple[str, bool]:
    """Point <results_root>/latest at <run_id> (relative symlink), replaced atomically.

    Returns (link path, changed). A temporary link renamed over the old one means a reader sees
    either the old target or the new one, never a missing link.
    """
    run_dir = os.path.abspath(run_dir)
    root, run_id = os.path.dirname(run_dir), os.path.basename(run_dir)
    link = os.path.join(root, LATEST_LINK)
    if run_id == LATEST_LINK:
        raise ManifestError("results_dir must be the run's own directory, not the `latest` link")
    if os.path.lexists(link) and not os.path.islink(link):
        raise ManifestError(
            f"{link} exists and is not a symlink; move it away so servelab can "
            "maintain the `latest` link"
        )
    if os.path.islink(link) and os.readlink(link) == run_id:
        return link, False
    if check_mode:
        return link, True
    tmp = os.path.join(root, f".{LATEST_LINK}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(run_id, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return link, True


def redacted(manifest: dict) -> dict:
    """The manifest as it may be written (0644, mailed with the report): every env dict, command
    line and text with its secrets blanked, wherever in the merge they came (module_utils/redact.py);
    a secret value seen anywhere in it is masked everywhere else too (a log tail quoting it)."""
    return redact_tree(manifest, collect_secrets(manifest))


def merge_into_manifest(
    run_dir: str,
    merge: Mapping,
    *,
    record_git_from: str | None = None,
    create_latest_link: bool = False,
    check_mode: bool = False,
    lock_timeout: float = 120.0,
) -> ManifestUpdate:
    """Deep-merge `merge` into <run_dir>/manifest.json under the run lock; atomic write.

    record_git_from: a directory whose git commit is recorded as `git` (once per run: kept when
    the manifest already has it, so forks that start later do not each run git).
    """
    if not isinstance(merge, Mapping):
        raise ManifestError(f"`merge` must be a dict, got {type(merge).__name__}")
    check_json_serialisable(merge)
    if not run_dir:
        raise ManifestError("`results_dir` is empty; pass results/<run_id>")
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ManifestError(f"results_dir {run_dir} exists and is not a directory")
    path = os.path.join(run_dir, MANIFEST)
    recorded = []

    if check_mode and not os.path.isdir(run_dir):
        before = {}
        after = redacted(deep_merge(before, merge))
        link = None
        if create_latest_link:
            link, _changed = update_latest_link(run_dir, check_mode=True)
        return ManifestUpdate(
            path=path,
            changed=True,
            manifest=after,
            latest_link=link,
            latest_changed=create_latest_link,
        )

    lock = contextlib.nullcontext() if check_mode else run_lock(run_dir, lock_timeout)
    with lock:
        before = read_manifest(run_dir)
        after = redacted(deep_merge(before, merge))
        if record_git_from and "git" not in after:
            after["git"] = git_commit(record_git_from)
            recorded.append("git")
        changed = after != before
        if changed and not check_mode:
            atomic_write_json(path, after)
        link, link_changed = None, False
        if create_latest_link:
            link, link_changed = update_latest_link(run_dir, check_mode=check_mode)
    return ManifestUpdate(
        path=path,
        changed=changed or link_changed,
        manifest=after,
        latest_link=link,
        latest_changed=link_changed,
        recorded=recorded,
    )
