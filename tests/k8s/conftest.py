from __future__ import annotations

from typing import Any

import pytest

IMAGE_REF = "localhost/mirrorq:e2e"  # what the chart is told to run (image.repository:tag)


@pytest.fixture(scope="session")
def built_image() -> str:
    """The image of broker and operator, built from the Dockerfile by k8s/image.sh
    (mmdebstrap + buildah; no Docker, no registry) into podman's vfs storage: its
    reference."""
    import os
    import subprocess
    import time
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("building and running images needs root")
    repo = Path(__file__).resolve().parents[2]
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(repo / "k8s" / "image.sh"), IMAGE_REF], cwd=repo,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"k8s/image.sh failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    print(f"image {IMAGE_REF}: built in {time.monotonic() - t0:.0f}s "
          f"({res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ''})")
    return IMAGE_REF


@pytest.fixture(scope="session")
def broker_image(built_image: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """That image extracted for the node agent, which runs pods as runc containers of it."""
    from k8s.node_agent import export_image

    return export_image(built_image, tmp_path_factory.mktemp("image") / "rootfs")

