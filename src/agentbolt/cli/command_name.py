"""How the hints agentbolt prints should spell the ``agentbolt`` command so that a user can paste them.

Imported by the trainer and the server as well as the CLI: it depends on nothing else of the package.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from functools import cache
from pathlib import Path


@cache
def agentbolt_command() -> str:
    """``agentbolt`` when that name on ``PATH`` is this environment's script; else the script's path (relative to the
    working directory when it lies under it, e.g. ``.venv/bin/agentbolt`` for a virtual environment that is not
    activated); ``agentbolt`` when this environment has no script either (e.g. run from a source tree)."""
    script = Path(sys.executable).parent / "agentbolt"
    if not script.is_file():
        return "agentbolt"
    found = shutil.which("agentbolt")
    if found is not None and Path(found).resolve() == script.resolve():
        return "agentbolt"
    try:
        shown = os.path.relpath(script)
    except ValueError:
        shown = str(script)
    if shown.startswith(".."):
        shown = str(script)
    return shlex.quote(shown)
