"""The venv switch (plugins/module_utils/venv/switch.py): the path servers run becomes a link to a
venv built beside it in one rename, the venv that was there is kept whole and put back, and a
restore finishes from every state an interrupted switch or restore can leave."""
from __future__ import annotations

import errno
import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.venv import switch as s


def make_venv(path, marker):
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text("#!/bin/sh\n")
    (path / "marker").write_text(marker)
    return str(path)


def no_exchange(a, b):
    raise OSError(errno.EINVAL, "Invalid argument")


@pytest.fixture
def opt(tmp_path):
    """A field host's layout: /opt/sglang/venv a real venv directory, and a new venv built beside it."""
    venv = tmp_path / "sglang" / "venv"
    old = make_venv(venv, "old")
    new = make_venv(tmp_path / "sglang" / "venvs" / "new", "new")
    return {"path": str(venv), "old": old, "new": new, "park": str(tmp_path / "sglang" / "venvs" / "previous"),
            "inode": os.stat(old).st_ino}


def marker(path):
    with open(os.path.join(path, "marker")) as fh:
        return fh.read()


@pytest.mark.parametrize("exchange", [s._libc_exchange, no_exchange], ids=["renameat2", "two-renames"])
def test_a_venv_directory_is_parked_whole_and_put_back(opt, exchange):
    sw = s.Switcher(exchange=exchange)
    previous = s.plan(opt["path"], opt["park"])
    assert previous == s.Previous("dir", parked=opt["park"])

    done = sw.switch(opt["path"], opt["new"], opt["park"])
    assert done["changed"] and done["previous"] == previous.as_dict()
    assert done["atomic"] is (exchange is s._libc_exchange)
    here = s.inspect(opt["path"])
    assert (here.kind, here.link, here.resolved) == ("link", opt["new"], opt["new"])
    assert marker(opt["path"]) == "new"
    # The old venv is one directory at the parking place, the same inode: nothing was copied or rewritten.
    assert not os.path.islink(opt["park"]) and os.stat(opt["park"]).st_ino == opt["inode"]

    assert sw.switch(opt["path"], opt["new"], opt["park"])["changed"] is False

    back = sw.restore(opt["path"], previous)
    assert back["changed"] and back["atomic"] is (exchange is s._libc_exchange)
    assert s.inspect(opt["path"]).kind == "dir" and os.stat(opt["path"]).st_ino == opt["inode"]
    assert marker(opt["path"]) == "old" and not os.path.lexists(opt["park"])
    assert sw.restore(opt["path"], previous)["changed"] is False
    assert marker(opt["new"]) == "new", "the new venv is left for the caller to remove"


def test_a_link_is_replaced_in_one_rename_and_put_back(tmp_path):
    first, second = make_venv(tmp_path / "venvs" / "a", "a"), make_venv(tmp_path / "venvs" / "b", "b")
    path = str(tmp_path / "venv")
    os.symlink(first, path)
    sw = s.Switcher(exchange=no_exchange)
    previous = s.plan(path, str(tmp_path / "park"))
    assert previous == s.Previous("link", link=first)
    assert sw.switch(path, second, str(tmp_path / "park"))["changed"]
    assert os.readlink(path) == second and not os.path.lexists(tmp_path / "park")
    assert sw.restore(path, previous)["changed"] and os.readlink(path) == first
    assert sorted(os.listdir(tmp_path)) == ["venv", "venvs"], "no temporary link left behind"


def test_no_venv_before_means_no_link_after_the_restore(tmp_path):
    new = make_venv(tmp_path / "venvs" / "a", "a")
    path = str(tmp_path / "venv")
    previous = s.plan(path, str(tmp_path / "park"))
    assert previous.kind == "absent"
    sw = s.Switcher()
    sw.switch(path, new, str(tmp_path / "park"))
    assert os.readlink(path) == new
    assert sw.restore(path, previous)["changed"] and not os.path.lexists(path)
    assert sw.restore(path, previous)["changed"] is False


def test_a_restore_finishes_from_every_state_an_interruption_leaves(opt):
    previous = s.Previous("dir", parked=opt["park"])
    sw = s.Switcher(exchange=no_exchange)
    # Between the two renames of a switch (or of a restore) without exchange: the path is absent.
    os.rename(opt["path"], opt["park"])
    assert sw.restore(opt["path"], previous)["changed"]
    assert marker(opt["path"]) == "old" and not os.path.lexists(opt["park"])
    # After a restore's exchange, before it removed the link it left at the parking place.
    os.symlink(opt["new"], opt["park"])
    assert sw.restore(opt["path"], previous)["changed"]
    assert marker(opt["path"]) == "old" and not os.path.lexists(opt["park"])
    # The switch never came: nothing to do.
    assert sw.restore(opt["path"], previous)["changed"] is False


def test_refusals_change_nothing(opt, tmp_path):
    sw = s.Switcher()
    os.mkdir(opt["park"])
    with pytest.raises(s.SwitchError, match="already exists"):
        sw.switch(opt["path"], opt["new"], opt["park"])
    os.rmdir(opt["park"])
    with pytest.raises(s.SwitchError, match="no bin/python"):
        sw.switch(opt["path"], str(tmp_path), opt["park"])
    assert marker(opt["path"]) == "old" and s.inspect(opt["path"]).kind == "dir"
    # The venv directory that was parked is gone: say so, do not make something up.
    with pytest.raises(s.SwitchError, match="cannot be put back"):
        os.symlink(opt["new"], str(tmp_path / "elsewhere"))
        sw.restore(str(tmp_path / "elsewhere"), s.Previous("dir", parked=str(tmp_path / "missing")))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(s.SwitchError, match="neither a venv directory nor a link"):
        s.plan(str(a_file), opt["park"])
    with pytest.raises(s.SwitchError, match="kind"):
        s.Previous.from_dict({"kind": "file"})


def test_check_mode_says_and_changes_nothing(opt):
    sw = s.Switcher()
    assert sw.switch(opt["path"], opt["new"], opt["park"], check=True)["changed"]
    assert s.inspect(opt["path"]).kind == "dir" and not os.path.lexists(opt["park"])
    sw.switch(opt["path"], opt["new"], opt["park"])
    assert sw.restore(opt["path"], s.Previous("dir", parked=opt["park"]), check=True)["changed"]
    assert s.inspect(opt["path"]).kind == "link"
