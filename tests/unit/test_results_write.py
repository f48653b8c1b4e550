"""The results contract's writers: whole files or none, 0644, and nothing rewritten that is
already there (a report or export rerun on an unchanged run changes no file)."""
import os
import stat

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import write_if_changed


def test_write_if_changed_writes_a_new_file_whole_and_readable(tmp_path):
    path = tmp_path / "sub" / "levels.csv"
    assert write_if_changed(str(path), b"a,b\n1,2\n") is True
    assert path.read_bytes() == b"a,b\n1,2\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["levels.csv"]   # no temp file left


def test_write_if_changed_leaves_the_same_bytes_alone_and_replaces_others(tmp_path):
    path = tmp_path / "report.html"
    write_if_changed(str(path), b"old")
    before = os.stat(path).st_ino
    assert write_if_changed(str(path), b"old") is False
    assert os.stat(path).st_ino == before          # not even replaced by an equal copy
    assert write_if_changed(str(path), b"new") is True
    assert path.read_bytes() == b"new"


def test_write_if_changed_in_check_mode_says_so_and_writes_nothing(tmp_path):
    path = tmp_path / "summary.md"
    assert write_if_changed(str(path), b"x", check_mode=True) is True
    assert not path.exists()
    path.write_bytes(b"x")
    assert write_if_changed(str(path), b"x", check_mode=True) is False
