"""Files under the capture directory that nobody can redirect.

Every operation works relative to an open directory descriptor and opens
each path component with O_NOFOLLOW, so a symbolic link planted anywhere
below the capture root (as a per-capture directory, as a file name, as a
subdirectory of a serving engine's trace directory) is never followed:
the operation fails with `UnsafePath` instead. Directories the agent
creates are 0700, files 0600, and a file is only ever created new
(O_EXCL), never truncated or appended to.

The capture root itself (`--capture-dir`) is trusted up to its parent (the
operator chose it); the root must be a real directory, owned by the agent's
user and not writable by group or others, else it is refused. Its read bits
are left as the operator set them; what is below it is private. A root that
is missing is made 0700 with its missing parents, never through a symbolic
link anywhere on its path.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

DIR_MODE, FILE_MODE = 0o700, 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted in place of a trace must not hang the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class UnsafePath(OSError):
    """A path the agent refuses to use: a symbolic link, something that is
    not a regular file or directory, or a directory others may write to."""


class TooLarge(UnsafePath):
    """A file over the size the caller reads; `size` is what it had when
    refused (at least the bound plus one where it grew while read)."""

    def __init__(self, message: str, size: int):
        super().__init__(message)
        self.size = size


def _component(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(f"{name!r} is not a plain file name")
    return name


def _what(name: str, dir_fd: int) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    return "a special file"


def _refused(exc: OSError, name: str, dir_fd: int, where: str, action: str) -> OSError:
    """A clear error for an open that O_NOFOLLOW / O_EXCL / O_DIRECTORY stopped."""
    what = _what(name, dir_fd)
    if what == "a symbolic link":
        return UnsafePath(f"{where}/{name} is a symbolic link; not {action} through it")
    if exc.errno == errno.EEXIST:
        return UnsafePath(f"{where}/{name} already exists ({what}); not overwritten")
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        return UnsafePath(f"{where}/{name} is {what}, not a directory")
    return exc


def open_root(path: str | os.PathLike, create: bool = True) -> int:
    """The capture root as a directory descriptor, created 0700 when missing
    (with its missing parents, see `walk`). Refused (UnsafePath) when it is a
    symbolic link others could have planted, not a directory, owned by another
    user, or writable by group or others. The caller closes it."""
    path = Path(path)
    fd = walk(path, create=True) if create and not os.path.lexists(path) else None
    if fd is None:
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            if os.path.islink(path):
                fd = _through_trusted_link(path)         # /var/lib/gpuscope/captures -> /data/captures
            elif exc.errno in (errno.ENOTDIR, errno.ELOOP):
                raise UnsafePath(f"{path} is not a directory") from None
            else:
                raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafePath(f"{path} is owned by uid {st.st_uid}, not by the agent's user (uid {os.geteuid()}); "
                             f"give a directory the agent owns")
        if st.st_mode & 0o022:
            raise UnsafePath(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                             f"run `chmod 700 {path}` or choose another directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def walk(path: Path, create: bool) -> int | None:
    """A root that does not exist yet, reached one component at a time from
    / (or the working directory). A symbolic link on the way is followed
    only where nobody else could have planted it: the link is root's or
    ours, in a directory that only its owner may write to (/home -> /data/home
    is followed; a link in /tmp, where anyone may plant one where the root's
    parents will be, is not: directories are never made through it). With
    `create`, the missing components are made 0700 whatever the umask, and
    the root's descriptor is returned; without, None once a component is
    missing (what is there is checked). UnsafePath names the link."""
    fd = os.open("/" if path.is_absolute() else ".", _DIR_FLAGS)
    here = Path(path.anchor or ".")
    try:
        for name in path.parts[1:] if path.is_absolute() else path.parts:
            made = False
            try:
                nxt = _open_component(fd, name)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass                            # made meanwhile: opened below like any other
                try:
                    nxt = _open_component(fd, name)
                except OSError as exc:
                    raise _unwalkable(exc, here / name, path) from None
            except OSError as exc:
                raise _unwalkable(exc, here / name, path) from None
            os.close(fd)
            fd, here = nxt, here / name
            mode = os.fstat(fd).st_mode
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                # anyone may rename or replace what lies below it, after any check of ours (found in a trial)
                raise UnsafePath(f"{here} is writable by anyone and not sticky (mode {stat.S_IMODE(mode):04o}); "
                                 f"choose a capture directory under one only its owner may write to, or "
                                 f"`chmod o-w {here}` (or +t, as /tmp is)")
            if made:
                os.fchmod(fd, DIR_MODE)             # exactly 0700: the umask may neither widen nor narrow it
                if os.fstat(fd).st_uid != os.geteuid():
                    raise UnsafePath(f"{here} was replaced by another user's directory")
        if not create:
            return None
        done, fd = fd, None
        return done
    finally:
        if fd is not None:
            os.close(fd)


def _through_trusted_link(path: Path) -> int:
    """The directory a root that is a symbolic link leads to, if the link is
    one nobody but root or us could have made (_trusted_link)."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_component(parent, path.name)
    except OSError:
        raise UnsafePath(f"{path} {_PLANTED}; give the directory itself") from None
    finally:
        os.close(parent)


_PLANTED = "is a symbolic link others could have planted (not root's or yours, or in a directory others may write to)"


def _open_component(fd: int, name: str) -> int:
    """`name` under `fd`, opened as a directory; through a symbolic link only
    if it is trusted (_trusted_link)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not _trusted_link(fd, name):
            raise
    return os.open(name, _DIR_FLAGS & ~os.O_NOFOLLOW, dir_fd=fd)


def _trusted_link(fd: int, name: str) -> bool:
    """A symbolic link nobody but root or us could have made: owned by one
    of them, in a directory writable by its owner alone (as OpenSSH's
    StrictModes judges a path)."""
    try:
        link = os.lstat(name, dir_fd=fd)
    except OSError:
        return False
    where = os.fstat(fd)
    return (stat.S_ISLNK(link.st_mode) and link.st_uid in (0, os.geteuid())
            and where.st_uid in (0, os.geteuid()) and not where.st_mode & 0o022)


def _unwalkable(exc: OSError, at: Path, path: Path) -> OSError:
    if os.path.islink(at):
        return UnsafePath(f"{at} {_PLANTED}; directories are not created through one: give the path it leads to "
                          f"({os.path.realpath(path)}), or create {path} first")
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        return UnsafePath(f"cannot create {path}: {at} is not a directory")
    return exc


def make_private_dir(parent_fd: int, name: str, where: str = "") -> int:
    """Create `name` (0700) under `parent_fd` and open it without following
    links; returns its descriptor (the caller closes it). Refuses a name that
    exists already, whatever it is."""
    name = _component(name)
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise _refused(exc, name, parent_fd, where, "written") from None
    try:
        os.fchmod(fd, DIR_MODE)                     # exactly 0700, whatever the umask
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafePath(f"{where}/{name} was replaced by another user's directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def hand_to(root_fd: int, dir_fd: int, uid: int, gid: int) -> None:
    """Lets a job running as another user write its trace into its own
    per-capture directory: the directory becomes the job's (still 0700), and
    the root gains search permission for others (--x, never read or write),
    so the job reaches its directory by name but can list or touch nothing
    else. Everything the agent reads back there is read without following
    links, so what the job plants in its own directory cannot redirect us."""
    os.fchown(dir_fd, uid, gid)
    mode = stat.S_IMODE(os.fstat(root_fd).st_mode)
    if mode & 0o011 != 0o011:
        os.fchmod(root_fd, mode | 0o011)


def write_new(dir_fd: int, name: str, data: bytes, where: str = "") -> int:
    """Write `data` to a new file `name` (0600) in the directory `dir_fd`;
    never through a link, never over an existing file. Returns bytes written."""
    name = _component(name)
    try:
        fd = os.open(name, _NEW_FILE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    except OSError as exc:
        raise _refused(exc, name, dir_fd, where, "written") from None
    try:
        view, written = memoryview(data), 0
        while written < len(view):
            written += os.write(fd, view[written:])
        return written
    finally:
        os.close(fd)


def read_beneath(dir_fd: int, relative: str | os.PathLike, max_bytes: int, where: str = "",
                 make_private: bool = False) -> bytes:
    """The bytes of the regular file at `relative` below `dir_fd`, reached
    without following any link and without `..`; at most `max_bytes`.
    make_private: also chmod it 0600 (a file the job wrote into our directory)."""
    parts = Path(relative).parts
    if not parts or Path(relative).is_absolute():
        raise UnsafePath(f"{relative!s} is not a path below {where}")
    fds: list[int] = []
    cur, here = dir_fd, where
    try:
        for part in parts[:-1]:
            _component(part)
            try:
                cur = os.open(part, _DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                raise _refused(exc, part, cur, here, "read") from None
            fds.append(cur)
            here = f"{here}/{part}"
        name = _component(parts[-1])
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=cur)
        except OSError as exc:
            raise _refused(exc, name, cur, here, "read") from None
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{here}/{name} is not a regular file")
        if st.st_size > max_bytes:
            raise TooLarge(f"{here}/{name} is {st.st_size >> 20} MiB, more than the {max_bytes >> 20} MiB "
                           f"a capture may be", st.st_size)
        if make_private:
            try:
                os.fchmod(fd, FILE_MODE)
            except PermissionError:
                pass                               # another user's file in our 0700 directory: unreadable to others anyway
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise TooLarge(f"{here}/{name} grew past the {max_bytes >> 20} MiB a capture may be", total)
        return b"".join(chunks)
    finally:
        for fd in fds:
            os.close(fd)


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove the directory `name` below `parent_fd` and all it holds,
    following no links (best effort: a failed capture's leftovers)."""
    shutil.rmtree(_component(name), dir_fd=parent_fd, ignore_errors=True)


def used_bytes(dir_fd: int) -> int:
    """Bytes of the regular files below `dir_fd`; links are neither followed
    nor counted."""
    total = 0
    for _, _, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for name in files:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue                            # removed meanwhile
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def free_bytes(dir_fd: int) -> int:
    st = os.fstatvfs(dir_fd)
    return st.f_bavail * st.f_frsize
