"""node/app/local_cluster.py's dir_refusal: --dir must be the user's own and
writable by nobody else (issue 42 item 10)."""
from __future__ import annotations

from pathlib import Path

from node.app.local_cluster import dir_refusal

D = Path("/tmp/c")


def test_a_private_or_read_only_shared_dir_of_ones_own_is_fine() -> None:
    assert dir_refusal(D, 1000, 0o40700, 1000) is None
    assert dir_refusal(D, 1000, 0o40755, 1000) is None


def test_a_dir_its_group_or_others_may_write_in_is_refused() -> None:
    for mode in (0o40770, 0o40702, 0o41777):
        refused = dir_refusal(D, 1000, mode, 1000)
        assert refused is not None and "writable by its group or others" in refused


def test_a_dir_of_another_user_is_refused() -> None:
    refused = dir_refusal(D, 0, 0o40700, 1000)
    assert refused is not None and "owned by uid 0, not by you (uid 1000)" in refused
