from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# the package lives one level down in operator/ (also installed by `pip install -e .`)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """item.rep_call: the end-to-end fixture prints its diagnostics when the test failed."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
