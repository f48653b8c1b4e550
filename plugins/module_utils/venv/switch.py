"""The venv servers use, switched between venvs built side by side, and put back.

A venv is not relocatable: its bin/ scripts (pip, flashinfer, sglang) name the venv's python by
absolute path. So a new venv is built where it stays (role sglang: <sglang_venvs_dir>/<stack id>)
and the path servers run (sglang_venv, /opt/sglang/venv) becomes a symbolic link to it. The venv
that was there is never written to, so a failed or interrupted build leaves it as it was.

The switch is one rename, so the path always names a whole venv, never a half one:
- a link is replaced by a new link (symlink under a temporary name, rename(2) over the old one);
- a real directory (a venv an earlier release built in place) is exchanged with a link to the new
  venv in one renameat2(RENAME_EXCHANGE): the path becomes the link, the old directory lands at
  `park` (one directory, so its scripts' absolute paths work again once it is put back). Where the
  file system cannot exchange (EINVAL: NFS, ZFS before 2.2), two renames: for the moment between
  them the path is absent, and `restore` (or the next run) puts whichever venv is recorded back.
Putting back is the same steps in reverse, from the `Previous` recorded before the switch.

Standard library only (AnsiballZ ships it to bare containers); the module is
plugins/modules/venv_switch.py, the tests tests/unit/test_venv_switch.py.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import os
from typing import Callable, Optional

RENAME_EXCHANGE = 2          # linux/fs.h
AT_FDCWD = -100
# The file system (or the kernel) cannot exchange two names: fall back to two renames.
NO_EXCHANGE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV)


class SwitchError(Exception):
    """The switch or the restore cannot be done safely; nothing was changed by the failing step."""


@dataclasses.dataclass(frozen=True)
class VenvPath:
    """What is at the venv path now."""
    path: str
    kind: str                    # link, dir, absent, other
    link: Optional[str] = None   # the link's text (kind link)
    resolved: Optional[str] = None   # the directory it ends in (link or dir), None when it ends nowhere

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Previous:
    """What the path was before the switch, recorded before it (role sglang's rollback state)."""
    kind: str                    # link, dir, absent
    link: Optional[str] = None   # kind link: the link's text then
    parked: Optional[str] = None  # kind dir: where the directory is while the path is a link

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Previous":
        kind = (data or {}).get("kind")
        if kind not in ("link", "dir", "absent"):
            raise SwitchError("previous venv: kind %r is not link, dir or absent" % (kind,))
        if kind == "link" and not data.get("link"):
            raise SwitchError("previous venv: a link without its target")
        if kind == "dir" and not data.get("parked"):
            raise SwitchError("previous venv: a directory without the path it is parked at")
        return cls(kind=kind, link=data.get("link") or None, parked=data.get("parked") or None)


def inspect(path: str) -> VenvPath:
    if os.path.islink(path):
        resolved = os.path.realpath(path)
        return VenvPath(path, "link", os.readlink(path), resolved if os.path.isdir(resolved) else None)
    if os.path.isdir(path):
        return VenvPath(path, "dir", None, os.path.realpath(path))
    if os.path.lexists(path):
        return VenvPath(path, "other")
    return VenvPath(path, "absent")


def plan(path: str, park: str) -> Previous:
    """The Previous a switch of `path` would record (before any change)."""
    here = inspect(path)
    if here.kind == "other":
        raise SwitchError("%s is neither a venv directory nor a link to one: move it away, then run again" % path)
    if here.kind == "link":
        return Previous("link", link=here.link)
    if here.kind == "dir":
        return Previous("dir", parked=park)
    return Previous("absent")


def _libc_exchange(src: str, dst: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    try:
        renameat2 = libc.renameat2
    except AttributeError:                 # glibc < 2.28 / musl: no wrapper
        raise OSError(errno.ENOSYS, "renameat2 is not available") from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


@dataclasses.dataclass
class Switcher:
    """The file operations, replaceable in tests (exchange: the one that may be unsupported)."""
    exchange: Callable[[str, str], None] = _libc_exchange

    def _link(self, path: str, target: str) -> None:
        """path -> target in one rename (a link or nothing at path; never a directory)."""
        tmp = "%s.servelab-link-%d" % (path, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise

    def _swap(self, a: str, b: str) -> bool:
        """Exchange two names in one step when the file system can; False when it cannot."""
        try:
            self.exchange(a, b)
            return True
        except OSError as exc:
            if exc.errno in NO_EXCHANGE:
                return False
            raise

    def switch(self, path: str, target: str, park: str, check: bool = False) -> dict:
        """Make `path` a link to the venv directory `target`; a directory at `path` goes to `park`."""
        target = os.path.abspath(target)
        if not os.path.lexists(os.path.join(target, "bin", "python")):
            raise SwitchError("%s is not a venv (no bin/python): nothing to switch %s to" % (target, path))
        here = inspect(path)
        previous = plan(path, park)
        if here.kind == "link" and here.link == target:
            return {"changed": False, "atomic": True, "previous": previous.as_dict()}
        if here.kind == "dir":
            if os.path.realpath(path) == target:
                raise SwitchError("%s is the venv directory itself: it cannot become a link to itself" % path)
            if os.path.lexists(park):
                raise SwitchError("%s, where the venv directory %s would be kept, already exists: an earlier "
                                  "run's? Move it away, then run again" % (park, path))
        if check:
            return {"changed": True, "atomic": True, "previous": previous.as_dict()}
        atomic = True
        if here.kind == "dir":
            os.symlink(target, park)
            if not self._swap(park, path):
                os.unlink(park)
                atomic = False
                os.rename(path, park)          # from here until the next line the path is absent
                self._link(path, target)
        else:
            self._link(path, target)
        return {"changed": True, "atomic": atomic, "previous": previous.as_dict()}

    def restore(self, path: str, previous: Previous, check: bool = False) -> dict:
        """Put back what `path` was before the switch (Previous, recorded before it)."""
        here = inspect(path)
        if previous.kind == "link":
            if here.kind == "link" and here.link == previous.link:
                return {"changed": False, "atomic": True}
            if here.kind not in ("link", "absent"):
                raise SwitchError("%s is a %s now, not a link: it is not this role's to replace" % (path, here.kind))
            if not os.path.isdir(previous.link):
                raise SwitchError("the venv %s linked to before is gone: it cannot be put back" % previous.link)
            if not check:
                self._link(path, previous.link)
            return {"changed": True, "atomic": True}
        if previous.kind == "absent":
            if here.kind == "absent":
                return {"changed": False, "atomic": True}
            if here.kind != "link":
                raise SwitchError("%s is a %s now; there was no venv before, and a directory is not removed"
                                  % (path, here.kind))
            if not check:
                os.unlink(path)
            return {"changed": True, "atomic": True}
        parked = previous.parked or ""
        parked_is_dir = os.path.isdir(parked) and not os.path.islink(parked)
        if here.kind == "dir":
            # Back already (the switch never came, or an earlier restore exchanged it back);
            # what may be left at the parking place is the link the exchange put there.
            if os.path.islink(parked):
                if not check:
                    os.unlink(parked)
                return {"changed": True, "atomic": True}
            return {"changed": False, "atomic": True}
        if not parked_is_dir:
            raise SwitchError("the venv directory that was %s is not at %s: it cannot be put back" % (path, parked))
        if check:
            return {"changed": True, "atomic": True}
        if here.kind == "absent":
            os.rename(parked, path)
            return {"changed": True, "atomic": True}
        if here.kind != "link":
            raise SwitchError("%s is a %s now, not the link the switch made" % (path, here.kind))
        if self._swap(parked, path):
            os.unlink(parked)                  # the link, now at the parking place
            return {"changed": True, "atomic": True}
        os.unlink(path)                        # from here until the next line the path is absent
        os.rename(parked, path)
        return {"changed": True, "atomic": False}
