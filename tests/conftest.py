"""Shared pytest setup."""

import sys
from pathlib import Path

# Make the repository root importable, so tests can import the examples (``examples.calc_agent``).
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)
