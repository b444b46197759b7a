"""A FUSE passthrough that loses what was not synced when its node "crashes"
(the lost-unsynced-writes fault, after Jepsen's lazyfs).

    python -m harness.lazyfs BACKING MOUNTPOINT --delay-file FILE --drop-flag FLAG [--fault-file FILE]

Every operation goes to BACKING at once (harness.slowfs, whose fsync delay it
keeps); the daemon also remembers what a power loss would undo. When it is
unmounted while FLAG exists (harness.datafs DataFs.crash_drop: the node is
SIGKILLed first), it rolls BACKING back to the durable state below, writes
what it dropped to FLAG.report.json and exits; without FLAG an unmount keeps
BACKING as it is (everything counts as synced). A new mount starts with all
of BACKING durable.

The durable state (what survives the crash), precisely:
- File data (by inode): the contents and size as of the file's last
  fsync or fdatasync (both the same here), or as of the mount. Writes and
  truncations since are undone: bytes overwritten inside the synced size
  get their old value back, the file is cut or extended (zeros) to the synced
  size. A file created since the mount and never synced is empty.
- Names of files and symlinks: a directory's entries are those of its last
  fsyncdir (fsync of a directory fd), or of the mount. A create, link,
  rename or unlink in it since then is undone: a new name disappears, a
  removed or replaced name comes back with its inode's durable contents (an
  unlinked inode a durable name still refers to is kept alive in a hidden
  attic, `BACKING/.lazyfs-attic`, until that directory's next fsyncdir). So a
  rename is durable only after an fsync of the target directory (and of the
  source directory for the old name to go); an fsync of a new file does NOT
  persist its name (stricter than ext4's auto_da_alloc habits, as lazyfs).
  A name made durable by an fsyncdir refers to its inode whatever that
  inode's data: an unsynced file under a durable name comes back empty (or
  with its last synced bytes).
- Directories themselves (mkdir, rmdir, renaming a directory) are durable at
  once; the node creates its directories once and never renames them while
  it runs. Entries of a directory removed since are not brought back.
- Metadata (mode, owner, times) is durable at once.
Not modelled: torn or reordered writes inside one unsynced range (the whole
range is lost, never part of it), mmap writes the kernel has not written
back (the node does not mmap its data).

Written for harness.datafs; not a general tool.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fuse import FUSE, FuseOSError

from harness.slowfs import SlowFs

ATTIC = ".lazyfs-attic"


@dataclass
class _File:
    """An inode written or truncated since its last sync."""

    synced_size: int
    undo: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, bytes before), oldest first


class LazyFs(SlowFs):
    def __init__(self, backing: str, delay_file: str | None, fault_file: str | None = None) -> None:
        super().__init__(backing, delay_file, fault_file)
        self.attic = os.path.join(self.backing, ATTIC)
        os.makedirs(self.attic, exist_ok=True)
        # one lock for every tracking decision and the operation it guards, so a
        # sync never splits a write from its undo record
        self._mu = threading.RLock()
        self.files: dict[int, _File] = {}  # inode -> unsynced state
        # directory inode -> its durable non-directory entries (name -> inode),
        # for the directories changed since their last fsyncdir
        self.dirs: dict[int, dict[str, int]] = {}
        self._fh_ino: dict[int, int] = {}

    # ------------------------------------------------------------ helpers
    def _p(self, path: str) -> str:
        if path.lstrip("/").split("/", 1)[0] == ATTIC:
            raise FuseOSError(errno.ENOENT)  # the attic is ours, never the node's
        return super()._p(path)

    def _ino_fh(self, fh: int) -> int:
        ino = self._fh_ino.get(fh)
        return ino if ino is not None else os.fstat(fh).st_ino

    def _tracked(self, ino: int, size: int) -> _File:
        f = self.files.get(ino)
        if f is None:
            f = self.files[ino] = _File(synced_size=size)  # untracked = all of it synced
        return f

    @staticmethod
    def _pread(fh: int, size: int, offset: int) -> bytes:
        try:
            return os.pread(fh, size, offset)
        except OSError as exc:  # an O_WRONLY fd: read through a second one
            if exc.errno != errno.EBADF:
                raise
            fd = os.open(f"/proc/self/fd/{fh}", os.O_RDONLY)
            try:
                return os.pread(fd, size, offset)
            finally:
                os.close(fd)

    def _save_range(self, fh: int, f: _File, offset: int, end: int) -> None:
        """Keep the synced bytes in [offset, end) before they change."""
        end = min(end, f.synced_size)
        if offset < end:
            f.undo.append((offset, self._pread(fh, end - offset, offset)))

    def _track_dir(self, dir_path: str) -> dict[str, int]:
        """The durable entries of a directory about to change (its current ones
        if it has not changed since its last fsyncdir)."""
        ino = os.lstat(dir_path).st_ino
        entries = self.dirs.get(ino)
        if entries is None:
            entries = self.dirs[ino] = {
                e.name: e.inode() for e in os.scandir(dir_path)
                if not e.is_dir(follow_symlinks=False)}
        return entries

    def _release_name(self, dir_path: str, name: str) -> None:
        """`dir_path/name` (not a directory) is about to be unlinked or replaced:
        keep its inode if a durable name refers to it."""
        path = os.path.join(dir_path, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            return
        if self._track_dir(dir_path).get(name) == st.st_ino:
            keep = os.path.join(self.attic, str(st.st_ino))
            if not os.path.lexists(keep):
                os.link(path, keep, follow_symlinks=False)
        elif st.st_nlink == 1 and not os.path.lexists(os.path.join(self.attic, str(st.st_ino))):
            self.files.pop(st.st_ino, None)  # its last name: the inode number may be reused

    def _parent(self, path: str) -> tuple[str, str]:
        full = self._p(path)
        return os.path.dirname(full), os.path.basename(full)

    # ------------------------------------------------------------ reads
    def readdir(self, path: str, fh: int) -> list[str]:
        names = super().readdir(path, fh)
        return [n for n in names if n != ATTIC] if path == "/" else names

    # ------------------------------------------------------------ names
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mu:
            parent, name = self._parent(path)
            self._track_dir(parent)
            full = os.path.join(parent, name)
            if os.path.lexists(full):  # O_TRUNC of an existing file
                self._release_name(parent, name)
                fd = os.open(full, os.O_RDWR)
                self._save_range(fd, self._tracked(os.fstat(fd).st_ino, os.fstat(fd).st_size), 0, 1 << 62)
                os.ftruncate(fd, 0)
            else:
                # O_RDWR, not the caller's O_WRONLY: a later overwrite must be read first
                fd = os.open(full, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
                self.files[os.fstat(fd).st_ino] = _File(synced_size=0)  # new: durable contents are none
            self._fh_ino[fd] = os.fstat(fd).st_ino
            return fd

    def open(self, path: str, flags: int) -> int:
        fd = super().open(path, flags)
        self._fh_ino[fd] = os.fstat(fd).st_ino
        return fd

    def release(self, path: str, fh: int) -> None:
        self._fh_ino.pop(fh, None)
        super().release(path, fh)

    def unlink(self, path: str) -> None:
        with self._mu:
            parent, name = self._parent(path)
            self._release_name(parent, name)
            os.unlink(os.path.join(parent, name))

    def rename(self, old: str, new: str) -> None:
        with self._mu:
            op, on = self._parent(old)
            np_, nn = self._parent(new)
            if not os.path.isdir(os.path.join(op, on)) or os.path.islink(os.path.join(op, on)):
                self._track_dir(op)
                self._track_dir(np_)
                self._release_name(np_, nn)
            os.replace(os.path.join(op, on), os.path.join(np_, nn))

    def link(self, target: str, source: str) -> None:
        with self._mu:
            self._track_dir(self._parent(target)[0])
            super().link(target, source)

    def symlink(self, target: str, source: str) -> None:
        with self._mu:
            self._track_dir(self._parent(target)[0])
            super().symlink(target, source)

    def rmdir(self, path: str) -> None:
        with self._mu:
            full = self._p(path)
            self.dirs.pop(os.lstat(full).st_ino, None)  # directories are durable at once
            os.rmdir(full)

    # ------------------------------------------------------------ data
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mu:
            ino = self._ino_fh(fh)
            f = self.files.get(ino)
            if f is None:
                f = self._tracked(ino, os.fstat(fh).st_size)
            self._save_range(fh, f, offset, offset + len(data))
            return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        with self._mu:
            fd = fh if fh is not None else os.open(self._p(path), os.O_RDONLY)
            try:
                f = self._tracked(os.fstat(fd).st_ino, os.fstat(fd).st_size)
                self._save_range(fd, f, length, f.synced_size)
            finally:
                if fh is None:
                    os.close(fd)
            super().truncate(path, length, fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        d = self.delay()
        if d > 0:
            time.sleep(d)
        self.fsyncs += 1
        with self._mu:  # no fsync of BACKING: only the node "crashes", never the host
            self.files.pop(self._ino_fh(fh), None)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        d = self.delay()
        if d > 0:
            time.sleep(d)
        with self._mu:
            if self.dirs.pop(os.lstat(self._p(path)).st_ino, None) is not None:
                self._gc_attic()

    def _gc_attic(self) -> None:
        """Drop the kept inodes no durable name refers to any more."""
        wanted = {str(i) for entries in self.dirs.values() for i in entries.values()}
        for name in os.listdir(self.attic):
            if name not in wanted:
                keep = os.path.join(self.attic, name)
                if os.lstat(keep).st_nlink == 1:
                    self.files.pop(int(name), None)
                os.unlink(keep)

    # ------------------------------------------------------------ the crash
    def drop_unsynced(self) -> dict[str, Any]:
        """Roll BACKING back to its durable state (unmounted: nobody else is in it)."""
        with self._mu:
            where: dict[int, str] = {}  # inode -> a path of it (files, symlinks)
            dirs: dict[int, str] = {}
            for root, dnames, fnames in os.walk(self.backing):
                if root == self.backing:
                    dnames[:] = [d for d in dnames if d != ATTIC]
                dirs[os.lstat(root).st_ino] = root
                for n in fnames + [d for d in dnames if os.path.islink(os.path.join(root, d))]:
                    p = os.path.join(root, n)
                    where.setdefault(os.lstat(p).st_ino, p)
            for n in os.listdir(self.attic):
                where[int(n)] = os.path.join(self.attic, n)
            # 1. every inode a durable name refers to gets a link in the attic (a
            #    renamed one may lose its only live name in step 3)
            for entries in self.dirs.values():
                for ino in entries.values():
                    keep = os.path.join(self.attic, str(ino))
                    if not os.path.lexists(keep) and ino in where:
                        os.link(where[ino], keep, follow_symlinks=False)
                        where[ino] = keep
            # 2. data back to its last sync
            rolled = dropped = 0
            for ino, f in self.files.items():
                path = where.get(ino)
                if path is None or os.path.islink(path):
                    continue
                fd = os.open(path, os.O_RDWR)
                try:
                    dropped += max(0, os.fstat(fd).st_size - f.synced_size)
                    for offset, old in reversed(f.undo):
                        os.pwrite(fd, old, offset)
                        dropped += len(old)
                    os.ftruncate(fd, f.synced_size)
                finally:
                    os.close(fd)
                rolled += 1
            # 3. names back to each changed directory's last fsyncdir
            removed, restored = [], []
            for dino, entries in self.dirs.items():
                d = dirs.get(dino)
                if d is None:
                    continue  # removed since: stays removed
                now = {e.name: e.inode() for e in os.scandir(d) if not e.is_dir(follow_symlinks=False)}
                if d == self.backing:
                    now.pop(ATTIC, None)
                for name, ino in now.items():
                    if entries.get(name) != ino:
                        os.unlink(os.path.join(d, name))
                        removed.append(os.path.relpath(os.path.join(d, name), self.backing))
                for name, ino in entries.items():
                    if now.get(name) != ino:
                        keep = os.path.join(self.attic, str(ino))
                        if os.path.lexists(keep):
                            os.link(keep, os.path.join(d, name), follow_symlinks=False)
                            restored.append(os.path.relpath(os.path.join(d, name), self.backing))
            self.files.clear()
            self.dirs.clear()
            shutil.rmtree(self.attic, ignore_errors=True)
            return {"files_rolled_back": rolled, "bytes_dropped": dropped,
                    "names_removed": sorted(removed), "names_restored": sorted(restored)}

    def forget(self) -> None:
        """A clean unmount: what is in BACKING stays, the attic goes."""
        shutil.rmtree(self.attic, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a FUSE passthrough that drops unsynced writes on a crash")
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--delay-file", default=None)
    ap.add_argument("--drop-flag", required=True)
    ap.add_argument("--fault-file", default=None)
    args = ap.parse_args(argv)
    fs = LazyFs(args.backing, args.delay_file, args.fault_file)
    # as slowfs; no kernel write-back cache: every write reaches the daemon before
    # the node's pwrite returns, so the daemon sees each one before its sync
    FUSE(fs, args.mountpoint, foreground=True, nothreads=False, allow_other=True, big_writes=True,
         max_write=131072)
    if os.path.exists(args.drop_flag):
        t0 = time.monotonic()
        report = fs.drop_unsynced()
        print(f"{time.strftime('%H:%M:%S')} dropped in {time.monotonic() - t0:.2f} s: {report}", flush=True)
        tmp = args.drop_flag + ".report.json.tmp"
        with open(tmp, "w") as out:
            json.dump(report, out)
        os.replace(tmp, args.drop_flag + ".report.json")
    else:
        fs.forget()


if __name__ == "__main__":
    main()
