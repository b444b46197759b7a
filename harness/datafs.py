"""Per-node data filesystems for the disk faults (chaosmirrorq.disk), opt-in in
Cluster / start_cluster:

- `data_fs_mb=N`: each node's data dir is its own tmpfs of N MiB, mounted before
  the node first starts (kept across restarts), so that a ballast file can fill
  exactly that node's disk (`fill_disk`);
- `slow_fs=True`: each node's data dir is a FUSE passthrough mount
  (harness.slowfs, over DATA_DIR.backing) whose fsync sleeps while the
  node's delay file says so (`slow_disk`), and whose writes fail with EIO or
  EROFS while its fault file says so (`set_fault`: `failed_disk`, issue 46);
- `lazy_fs=True`: the FUSE mount is harness.lazyfs instead (slowfs's delay
  too), which keeps what was not fsync'd apart; `crash_drop()` (the node
  SIGKILLed first) throws it away: the data dir is as a power loss would
  leave it (`kill_with_loss`, `power_cut`).

Both can be combined: the FUSE backing dir then lives on the tmpfs. Every mount
is listed in `registry` (a JSON file, BASE/mounts.json for start_cluster) so that
the suite's clean-up can undo them after a killed `chaos run`; `unmount_all`
undoes them in order (FUSE first, then the tmpfs under it).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def mounted(path: Path) -> bool:
    target = str(Path(path).resolve())
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below `base`, deepest first."""
    root = str(Path(base).resolve())
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mp = line.split()[1].replace("\\040", " ")
            if mp == root or mp.startswith(root + "/"):
                out.append(mp)
    return sorted(out, key=len, reverse=True)


def umount(path: str | Path) -> None:
    """Unmount (lazily if busy); no error when not mounted."""
    p = str(path)
    if subprocess.run(["umount", p], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", p], capture_output=True)


def umount_elsewhere(path: Path) -> list[int]:
    """Lazily unmount `path` in every other mount namespace that has it; returns
    a pid of each. `ip netns exec` gives each node a copy of the mount table as
    it was at its start, and with private propagation (/ here) an unmount in
    ours does not reach those copies: the other nodes' namespaces would keep a
    FUSE mount alive (its daemon running) after it is gone from ours."""
    target = str(Path(path).resolve())
    own = os.readlink("/proc/self/ns/mnt")
    seen = {own}
    done = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{entry}/ns/mnt")
            if ns in seen:
                continue
            seen.add(ns)
            with open(f"/proc/{entry}/mountinfo") as f:
                has = any(line.split()[4] == target for line in f)
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if has:
            subprocess.run(["nsenter", f"--mount=/proc/{entry}/ns/mnt", "umount", "-l", target],
                           capture_output=True)
            done.append(int(entry))
    return done


def fuse_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (mounting a FUSE filesystem)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        import fuse  # noqa: F401 - fusepy
    except (ImportError, OSError) as exc:
        return f"fusepy/libfuse2 unavailable: {exc} (pip install fusepy; apt-get install libfuse2)"
    return None


def tmpfs_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (mounting a tmpfs per node)"
    return None


class DataFs:
    """The mounts of one node's data dir."""

    def __init__(self, data_dir: Path, size_mb: int | None = None, slow: bool = False,
                 registry: Path | None = None, lazy: bool = False) -> None:
        self.data_dir = Path(data_dir)
        self.size_mb = size_mb
        self.slow = slow
        self.lazy = lazy
        self.fuse = slow or lazy
        self.registry = registry
        # with FUSE the node sees data_dir; the bytes live in `backing` (on the tmpfs if any)
        self.disk_dir = self.data_dir.with_name(self.data_dir.name + ".backing") if self.fuse else self.data_dir
        self.delay_file = self.data_dir.with_name(self.data_dir.name + ".fsync-delay-ms")
        self.fault_file = self.data_dir.with_name(self.data_dir.name + ".fault")
        self.drop_flag = self.data_dir.with_name(self.data_dir.name + ".lazyfs-drop")
        self.fuse_proc: subprocess.Popen[bytes] | None = None
        self.fuse_log = self.data_dir.with_name(self.data_dir.name + (".lazyfs.log" if lazy else ".slowfs.log"))
        self.drops: list[dict[str, Any]] = []  # crash_drop() reports

    def _record(self) -> None:
        if self.registry is None:
            return
        rec: dict[str, Any] = {"mounts": [], "pids": []}
        if self.registry.exists():
            with contextlib.suppress(ValueError):
                rec = json.loads(self.registry.read_text())
        for mp in ([str(self.disk_dir)] if self.size_mb else []) + ([str(self.data_dir)] if self.fuse else []):
            if mp not in rec["mounts"]:
                rec["mounts"].append(mp)
        if self.fuse_proc is not None and self.fuse_proc.pid not in rec["pids"]:
            rec["pids"].append(self.fuse_proc.pid)
        self.registry.write_text(json.dumps(rec))

    def mount(self) -> None:
        """Mount what is not mounted yet (idempotent; before every node start)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        if self.size_mb and not mounted(self.disk_dir):
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(self.size_mb)}m,mode=0755",
                            "tmpfs", str(self.disk_dir)], check=True, capture_output=True)
        if self.fuse and (self.fuse_proc is None or self.fuse_proc.poll() is not None
                          or not mounted(self.data_dir)):
            if not self.delay_file.exists():
                self.delay_file.write_text("0\n")
            argv = [sys.executable, "-m", "harness.lazyfs" if self.lazy else "harness.slowfs",
                    str(self.disk_dir), str(self.data_dir), "--delay-file", str(self.delay_file),
                    "--fault-file", str(self.fault_file)]
            if self.lazy:
                argv += ["--drop-flag", str(self.drop_flag)]
            with open(self.fuse_log, "ab") as log:
                self.fuse_proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + 15
            while not mounted(self.data_dir):
                if self.fuse_proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{argv[2]} did not mount {self.data_dir}: "
                                       f"{self.fuse_log.read_text(errors='replace')[-800:]}")
                time.sleep(0.05)
        self._record()

    def set_delay_ms(self, ms: float) -> None:
        tmp = self.delay_file.with_suffix(".tmp")
        tmp.write_text(f"{float(ms):g}\n")
        os.replace(tmp, self.delay_file)

    def set_fault(self, mode: str | None, timeout: float = 5.0) -> None:
        """Make every changing operation under the mount fail: "eio" (a failing
        disk), "erofs" (a read-only remount); None: none. Returns once the
        daemon (it re-reads the file every 50 ms) answers a create that way."""
        if mode is not None and mode not in ("eio", "erofs"):
            raise ValueError(f"unknown fault mode {mode!r}: eio or erofs")
        tmp = self.fault_file.with_name(self.fault_file.name + ".tmp")
        tmp.write_text(f"{mode or ''}\n")
        os.replace(tmp, self.fault_file)
        if self.fuse_proc is None or self.fuse_proc.poll() is not None or not mounted(self.data_dir):
            return  # (applies from the next mount)
        deadline = time.monotonic() + timeout
        while self._writable() != (mode is None):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.data_dir}: fault {mode!r} not in effect after {timeout}s")
            time.sleep(0.01)

    def _writable(self) -> bool:
        probe = self.data_dir / ".datafs-probe"
        try:
            probe.write_bytes(b"")
        except OSError:
            return False
        with contextlib.suppress(OSError):
            probe.unlink()
        return True

    def crash_drop(self, timeout: float = 60.0) -> dict[str, Any]:
        """The power loss of this node's disk: with the node already dead (SIGKILLed
        and reaped), unmount so that the lazyfs daemon rolls its backing dir back
        to what was synced, then mount again (all of it durable from there on).
        Returns the daemon's report (files_rolled_back, bytes_dropped,
        names_removed, names_restored)."""
        if not self.lazy or self.fuse_proc is None:
            raise RuntimeError(f"crash_drop needs a lazyfs mount of {self.data_dir} (lazy_fs=True)")
        report_path = Path(str(self.drop_flag) + ".report.json")
        report_path.unlink(missing_ok=True)
        self.drop_flag.write_text("drop\n")
        try:
            t0 = time.monotonic()
            deadline = t0 + timeout
            # a plain umount: a lazy one would let a straggler (the node's snapshot
            # child, dying) keep writing after the drop
            umount_elsewhere(self.data_dir)
            while mounted(self.data_dir):
                done = subprocess.run(["umount", str(self.data_dir)], capture_output=True, text=True)
                if done.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.data_dir} stays busy: cannot drop its unsynced writes "
                                       f"({done.stderr.strip()})")
                time.sleep(0.1)
            unmounted = time.monotonic()
            try:
                self.fuse_proc.wait(timeout=max(5.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"lazyfs of {self.data_dir} did not exit {time.monotonic() - unmounted:.1f} s "
                                   f"after its unmount ({unmounted - t0:.1f} s)") from None
            self.fuse_proc = None
            if not report_path.exists():
                raise RuntimeError(f"lazyfs of {self.data_dir} exited without dropping: "
                                   f"{self.fuse_log.read_text(errors='replace')[-800:]}")
            report: dict[str, Any] = json.loads(report_path.read_text())
        finally:
            self.drop_flag.unlink(missing_ok=True)
        self.drops.append(report)
        self.mount()
        return report

    def unmount(self) -> None:
        if self.fuse:
            umount_elsewhere(self.data_dir)  # (else its daemon lives on there: see umount_elsewhere)
            umount(self.data_dir)
            if self.fuse_proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.fuse_proc.wait(timeout=5)  # unmounted: it finishes by itself (lazyfs: its attic)
                if self.fuse_proc.poll() is None:
                    self.fuse_proc.send_signal(signal.SIGTERM)
                    try:
                        self.fuse_proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        self.fuse_proc.kill()
                        self.fuse_proc.wait()
                self.fuse_proc = None
        if self.size_mb:
            umount(self.disk_dir)


def cleanup_registry(registry: Path, base: Path | None = None) -> None:
    """After a killed run: SIGKILL the recorded FUSE daemons, unmount the recorded
    mounts and anything else mounted under `base`."""
    mps: list[str] = []
    if registry.exists():
        with contextlib.suppress(ValueError):
            rec = json.loads(registry.read_text())
            for pid in rec.get("pids", []):
                with contextlib.suppress(OSError):
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"harness.slowfs" in cmd or b"harness.lazyfs" in cmd:
                        os.kill(pid, signal.SIGKILL)
            mps = list(rec.get("mounts", []))
    if base is not None:
        mps += mounts_under(base)
    for mp in sorted(set(mps), key=len, reverse=True):
        if mounted(Path(mp)):
            umount(mp)
