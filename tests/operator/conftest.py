from __future__ import annotations

import sys
from pathlib import Path

# the package lives one level down in operator/ (also installed by `pip install -e .`)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))

