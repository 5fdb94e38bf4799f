"""Search permission for instance users on the directories between them and what they run.

Instance users (``users.py``) must reach this Python, its packages and their own directories, which
may lie under directories only the platform's user may enter (``/root`` is 0700, so are the state
directory and pytest's temporary directories). They get *search* permission (x: pass through a
directory by name, never list or read it) through a POSIX ACL entry for the group every instance
process belongs to, so no other user of the machine gains anything; where the filesystem has no
ACLs, the directory becomes searchable by everyone (``o+x``), which the caller logs.

The ACL is read and written as the kernel's ``system.posix_acl_access`` attribute (what ``setfacl``
does), so no tool needs to be installed.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

ACL_XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF
_SEARCH = 0o1
_HEADER, _ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
_NO_ACL = {errno.ENOTSUP, errno.EOPNOTSUPP}

Entry = tuple[int, int, int]  # tag, permission bits (rwx), id


def _read_acl(path: Path) -> list[Entry] | None:
    """The access ACL of ``path`` (the mode as a minimal ACL when it has none); None without ACL support."""
    try:
        raw = os.getxattr(path, ACL_XATTR)
    except OSError as err:
        if err.errno in _NO_ACL:
            return None
        if err.errno != errno.ENODATA:
            raise
        mode = os.stat(path).st_mode
        return [
            (_USER_OBJ, (mode >> 6) & 7, _UNDEFINED),
            (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED),
            (_OTHER, mode & 7, _UNDEFINED),
        ]
    (version,) = _HEADER.unpack_from(raw)
    if version != _VERSION:
        raise OSError(errno.EINVAL, f"unknown POSIX ACL version {version}", str(path))
    return [_ENTRY.unpack_from(raw, offset) for offset in range(_HEADER.size, len(raw), _ENTRY.size)]


def searchable(path: Path, gid: int) -> bool:
    """Whether a process of group ``gid`` (owning nothing there) may pass through the directory ``path``."""
    st = os.stat(path)
    if st.st_mode & stat.S_IXOTH:
        return True
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    entries = _read_acl(path) or []
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 7)
    return any(tag == _GROUP and ident == gid and perm & mask & _SEARCH for tag, perm, ident in entries)


def grant_search(path: Path, gid: int) -> str:
    """Let group ``gid`` search the directory ``path``; says how (an ACL entry, or o+x). Raises OSError."""
    entries = _read_acl(path)
    if entries is None:
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | stat.S_IXOTH)
        return "o+x (the filesystem has no POSIX ACLs, so every user may now search it)"
    group_obj = next(perm for tag, perm, _ in entries if tag == _GROUP_OBJ)
    named = [e for e in entries if not (e[0] == _GROUP and e[2] == gid)]
    mine = next((perm for tag, perm, ident in entries if tag == _GROUP and ident == gid), 0)
    named.append((_GROUP, mine | _SEARCH, gid))
    # The mask bounds every group-class entry: it gains search only, so no other entry gains more.
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), group_obj)
    named = [e for e in named if e[0] != _MASK] + [(_MASK, mask | _SEARCH, _UNDEFINED)]
    named.sort(key=lambda e: (e[0], e[2]))
    blob = _HEADER.pack(_VERSION) + b"".join(_ENTRY.pack(*e) for e in named)
    try:
        os.setxattr(path, ACL_XATTR, blob)
    except OSError as err:
        if err.errno not in _NO_ACL:
            raise
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | stat.S_IXOTH)
        return "o+x (the filesystem has no POSIX ACLs, so every user may now search it)"
    return f"a POSIX ACL entry (group:{gid}:--x)"


def passed_through(target: Path) -> Iterator[Path]:
    """The directories the kernel passes through to reach ``target`` (its parents, by the path as written
    and as resolved), and ``target`` itself when it is a directory.
    """
    seen: set[Path] = set()
    for path in (target.absolute(), target.resolve()):
        chain = [*reversed(path.parents)]
        if path.is_dir():
            chain.append(path)
        for directory in chain:
            if directory not in seen:
                seen.add(directory)
                yield directory


def unsearchable(targets: Iterable[Path], gid: int) -> Iterator[tuple[Path, Path]]:
    """``(directory, target)`` for each directory on the way to a target that group ``gid`` cannot search."""
    seen: set[Path] = set()
    for target in targets:
        for directory in passed_through(target):
            if directory in seen:
                continue
            seen.add(directory)
            if not searchable(directory, gid):
                yield directory, target
