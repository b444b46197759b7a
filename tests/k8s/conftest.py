from __future__ import annotations

from typing import Any

import pytest

IMAGE_REF = "localhost/mirrorq:e2e"  # what the chart is told to run (image.repository:tag)


@pytest.fixture(scope="session")
def broker_image(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The broker's OCI image, built from the Dockerfile by k8s/image.sh (mmdebstrap +
    buildah; no Docker, no registry) and extracted for the node agent, which runs
    the broker pods as runc containers of it."""
    import os
    import subprocess
    import time
    from pathlib import Path

    from k8s.node_agent import export_image

    if os.geteuid() != 0:
        pytest.skip("building and running images needs root")
    repo = Path(__file__).resolve().parents[2]
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(repo / "k8s" / "image.sh"), IMAGE_REF], cwd=repo,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"k8s/image.sh failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    image = export_image(IMAGE_REF, tmp_path_factory.mktemp("image") / "rootfs")
    print(f"broker image {IMAGE_REF}: built and extracted in {time.monotonic() - t0:.0f}s "
          f"({res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ''})")
    return image
