"""Shared pytest setup."""

import os
import sys
from pathlib import Path

import pytest

# Make the repository root importable, so tests can import the examples (``examples.calc_agent``).
_REPO_ROOT = str(Path(__file__).resolve().parents[1])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

# Tests run on 2 cores next to a server thread and runner processes; keep torch from oversubscribing.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted once per test session into a temporary cache (bf16 HF directory)."""
    from agentbolt.inference.model_files import prepare_model

    # Laid out like $AGENTBOLT_CACHE/models, so tests can point AGENTBOLT_CACHE at smollm2_dir.parent.parent.
    return prepare_model("smollm2-135m", cache_dir=tmp_path_factory.mktemp("agentbolt-cache") / "models")
