"""The operator's admin TLS files (issue 26) laid out as a pod mounts them, so a
test can load a rendered mirrorq.toml in the node outside Kubernetes."""
from __future__ import annotations

from pathlib import Path

from mirrorq_operator import pki
from mirrorq_operator.builders import ADMIN_TLS_DIR, ADMIN_TLS_KEYS, ADMIN_TLS_POD_FILES


def with_admin_tls_files(toml_text: str, directory: Path, name: str = "mq",
                         namespace: str = "ns1") -> str:
    """`toml_text` with ADMIN_TLS_DIR replaced by `directory`, which gets the pod's
    files (ca.crt, tls.crt, tls.key) of a fresh pki.generate()."""
    made = pki.generate(name, namespace)
    d = directory / "admin-tls"
    d.mkdir(parents=True, exist_ok=True)
    for field, file in ADMIN_TLS_KEYS.items():
        if file in ADMIN_TLS_POD_FILES:
            (d / file).write_bytes(getattr(made, field))
    return toml_text.replace(ADMIN_TLS_DIR, str(d))
