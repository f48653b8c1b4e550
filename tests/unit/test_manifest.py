"""bench_manifest's logic: deep merge, the run lock, concurrent writers, the latest link."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError,
    deep_merge,
    git_commit,
    merge_into_manifest,
    read_manifest,
    run_lock,
    update_latest_link,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LATEST_LINK, MANIFEST


def test_deep_merge_merges_dicts_and_replaces_the_rest():
    base = {"hosts": {"a": {"gpu_facts": {"gpus": [1]}}}, "levels": [1, 2], "x": 1}
    update = {"hosts": {"b": {"gpu_facts": {}}, "a": {"extra": True}}, "levels": [5], "y": 2}
    merged = deep_merge(base, update)
    assert merged == {
        "hosts": {"a": {"gpu_facts": {"gpus": [1]}, "extra": True}, "b": {"gpu_facts": {}}},
        "levels": [5],
        "x": 1,
        "y": 2,
    }
    # Inputs untouched (the manifest read from disk is not mutated behind the caller's back).
    assert base["hosts"]["a"] == {"gpu_facts": {"gpus": [1]}} and "b" not in base["hosts"]


def test_merge_creates_then_merges(tmp_path):
    run = str(tmp_path / "results" / "r1")
    first = merge_into_manifest(
        run, {"run_id": "r1", "profiles": {"p": {"h1": {"status": "started"}}}}
    )
    assert first.changed
    second = merge_into_manifest(run, {"profiles": {"p": {"h1": {"status": "finished"}}}})
    assert second.changed
    data = json.loads((tmp_path / "results" / "r1" / MANIFEST).read_text())
    assert data["profiles"]["p"]["h1"]["status"] == "finished" and data["run_id"] == "r1"
    assert merge_into_manifest(run, {"run_id": "r1"}).changed is False


def test_check_mode_writes_nothing(tmp_path):
    run = str(tmp_path / "r1")
    update = merge_into_manifest(run, {"a": 1}, check_mode=True, create_latest_link=True)
    assert update.changed and update.manifest == {"a": 1}
    assert not os.path.exists(run) and not os.path.lexists(tmp_path / LATEST_LINK)
    merge_into_manifest(run, {"a": 1})
    update = merge_into_manifest(run, {"a": 2}, check_mode=True)
    assert update.changed and update.manifest["a"] == 2
    assert read_manifest(run)["a"] == 1


def test_bad_input_fails_before_touching_anything(tmp_path):
    run = tmp_path / "r1"
    with pytest.raises(ManifestError, match="`merge` must be a dict"):
        merge_into_manifest(str(run), ["not", "a", "dict"])
    with pytest.raises(ManifestError, match="cannot be written as JSON"):
        merge_into_manifest(str(run), {1: "int key", "a": "str key"})
    assert not run.exists()


def test_corrupt_manifest_is_a_clear_error(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        merge_into_manifest(str(tmp_path), {"a": 1})
    assert (tmp_path / MANIFEST).read_text() == "{not json"


def _merge_many(run_dir, worker, count):
    for i in range(count):
        merge_into_manifest(
            run_dir, {"hosts": {f"w{worker}": {f"k{i}": i}}, "counts": {f"w{worker}": i + 1}}
        )


def test_concurrent_merges_lose_nothing(tmp_path):
    run = str(tmp_path / "r1")
    workers, count = 6, 25
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_merge_many, args=(run, w, count)) for w in range(workers)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=240)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    data = read_manifest(run)
    assert data["counts"] == {f"w{w}": count for w in range(workers)}
    for w in range(workers):
        assert data["hosts"][f"w{w}"] == {f"k{i}": i for i in range(count)}


def test_lock_held_elsewhere_times_out_with_a_clear_error(tmp_path):
    run = str(tmp_path / "r1")
    with run_lock(run):
        # flock locks belong to the open file description: a second open in this process
        # conflicts just as another fork would.
        with pytest.raises(ManifestError, match="could not lock"):
            merge_into_manifest(run, {"a": 1}, lock_timeout=0.3)
    assert merge_into_manifest(run, {"a": 1}).changed


def test_latest_link_is_relative_and_replaced(tmp_path):
    root = tmp_path / "results"
    for run_id in ("r1", "r2"):
        update = merge_into_manifest(
            str(root / run_id), {"run_id": run_id}, create_latest_link=True
        )
        assert update.latest_changed
        link = root / LATEST_LINK
        assert os.readlink(link) == run_id  # relative: survives moving results/
        assert json.loads((link / MANIFEST).read_text())["run_id"] == run_id
    assert update_latest_link(str(root / "r2")) == (str(root / LATEST_LINK), False)
    assert [n for n in os.listdir(root) if n.startswith(".")] == []


def test_latest_that_is_a_directory_is_refused(tmp_path):
    (tmp_path / LATEST_LINK).mkdir()
    with pytest.raises(ManifestError, match="not a symlink"):
        update_latest_link(str(tmp_path / "r1"))


def test_git_commit_recorded_once(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    for cmd in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, timeout=60)
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    run = str(tmp_path / "r1")
    first = merge_into_manifest(run, {}, record_git_from=str(repo))
    assert first.recorded == ["git"] and first.manifest["git"]["commit"] == head
    assert first.manifest["git"]["dirty"] is False
    second = merge_into_manifest(run, {"a": 1}, record_git_from=str(repo))
    assert second.recorded == []


def test_git_commit_outside_a_repo_says_why(tmp_path):
    info = git_commit(str(tmp_path))
    assert info["commit"] is None and info["reason"]
