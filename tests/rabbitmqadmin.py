"""RabbitMQ's own `rabbitmqadmin` script, taken from Debian's rabbitmq-server
package without installing the server: `apt-get download` + `dpkg -x` into
a cache (MIRRORQ_RABBITMQADMIN_CACHE, default ~/.cache/mirrorq-rabbitmqadmin).
The package ships it as the management plugin's priv/www/cli/rabbitmqadmin
(and /usr/bin/rabbitmqadmin). `.ci/run` calls this module on a fresh
machine; the tests call `find()` and skip when it cannot be had.

    python3 tests/rabbitmqadmin.py      # fetch into the cache, print its path
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("MIRRORQ_RABBITMQADMIN_CACHE",
                            Path.home() / ".cache" / "mirrorq-rabbitmqadmin"))
INSIDE = "usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/rabbitmq_management-*/priv/www/cli/rabbitmqadmin"


def cached() -> Path | None:
    path = CACHE / "rabbitmqadmin"
    return path if path.is_file() else None


def fetch(timeout: float = 300.0) -> Path:
    """Download the package, extract the script into the cache; RuntimeError
    with the reason when that is impossible (no apt, no network)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise RuntimeError("apt-get/dpkg not available")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rmqdeb-") as tmp:
        os.chmod(tmp, 0o777)  # apt's sandbox user may write the .deb here

        def download() -> subprocess.CompletedProcess[str]:
            return subprocess.run(["apt-get", "download", "-q", "rabbitmq-server"], cwd=tmp,
                                  capture_output=True, text=True, timeout=timeout)
        res = download()
        if res.returncode != 0 and os.geteuid() == 0:  # a fresh machine: no package lists yet
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=timeout)
            res = download()
        debs = glob.glob(os.path.join(tmp, "rabbitmq-server_*.deb"))
        if res.returncode != 0 or not debs:
            raise RuntimeError(f"apt-get download rabbitmq-server failed: {res.stderr.strip()}")
        out = os.path.join(tmp, "x")
        subprocess.run(["dpkg", "-x", debs[0], out], check=True, timeout=timeout)
        found = glob.glob(os.path.join(out, INSIDE)) or glob.glob(
            os.path.join(out, "usr/bin/rabbitmqadmin"))
        if not found:
            raise RuntimeError("the rabbitmq-server package holds no rabbitmqadmin")
        target = CACHE / "rabbitmqadmin"
        shutil.copyfile(found[0], target)
        (CACHE / "SOURCE").write_text(os.path.basename(debs[0]) + "\n")
    target.chmod(0o755)
    return target


def find() -> Path:
    """The cached script, fetched if missing."""
    return cached() or fetch()


if __name__ == "__main__":
    try:
        print(find())
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"rabbitmqadmin: {exc}", file=sys.stderr)
        sys.exit(1)
