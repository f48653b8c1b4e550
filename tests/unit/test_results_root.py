"""bench_results_root where no run directory can be made is named by the preflight, with the fix.

What was seen (issue 26): a results root under a regular file, or in /proc, failed at "Open the
run" with `cannot create the lock directory .../.locks: Not a directory`."""
from __future__ import annotations

import os

from ansible_collections.servelab.serving.plugins.plugin_utils.results_root import results_root_problem

FIX = "set bench_results_root (-e bench_results_root=DIR, or SERVELAB_RESULTS_ROOT)"


def test_a_root_under_a_regular_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    root = str(tmp_path / "a-file" / "results")
    msg = results_root_problem(root)
    assert msg.startswith("bench_results_root: %s cannot be made: %s is a file" % (
        root, tmp_path / "a-file")), msg
    assert FIX in msg


def test_a_root_in_proc():
    msg = results_root_problem("/proc/servelab-results")
    assert msg.startswith("bench_results_root: /proc/servelab-results is on the kernel's proc "
                          "filesystem"), msg
    assert FIX in msg


def test_a_root_that_can_be_made_or_exists_passes(tmp_path):
    assert results_root_problem(str(tmp_path / "new" / "results")) is None
    assert results_root_problem(str(tmp_path)) is None
    assert not os.path.exists(tmp_path / "new")        # the check makes nothing
