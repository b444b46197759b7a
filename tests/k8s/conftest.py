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
    if os.environ.get("MIRRORQ_PREBUILT_IMAGE") == IMAGE_REF:
        # tests/suite.sh built it from this tree in the background while other tests ran
        exists = subprocess.run(["podman", "--storage-driver", "vfs", "image", "exists", IMAGE_REF])
        assert exists.returncode == 0, f"MIRRORQ_PREBUILT_IMAGE={IMAGE_REF}, but podman has no such image"
        print(f"image {IMAGE_REF}: built before this session by tests/suite.sh")
        return IMAGE_REF
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


# The previous release the upgrade test (tests/k8s/test_kubelet_e2e.py) starts from:
# main as it last landed (stop 38). Refresh it at each release.
PREVIOUS_RELEASE = "de92fd1d68d7a0a203e4e01ba7a76daf4075aad7"


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The previous release's image, built by its own k8s/image.sh from its commit
    (`git archive`) and kept in podman's storage under a tag naming the commit, and
    its chart directory."""
    import os
    import subprocess
    import time
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("building and running images needs root")
    repo = Path(__file__).resolve().parents[2]
    tree = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(repo), "archive", PREVIOUS_RELEASE],
                             capture_output=True, timeout=120)
    assert archive.returncode == 0, \
        f"git archive {PREVIOUS_RELEASE} (a clone with history is needed): {archive.stderr.decode()}"
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    ref = f"localhost/mirrorq:release-{PREVIOUS_RELEASE[:12]}"
    if subprocess.run(["podman", "--storage-driver", "vfs", "image", "exists", ref]).returncode:
        t0 = time.monotonic()
        res = subprocess.run(["bash", "k8s/image.sh", ref], cwd=tree, capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, "the previous release's k8s/image.sh failed:\n" \
            f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        print(f"previous release's image {ref}: built in {time.monotonic() - t0:.0f}s")
    return ref, tree / "helm" / "mirrorq"
