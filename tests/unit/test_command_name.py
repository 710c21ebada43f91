"""The ``agentbolt`` command as hints spell it: the bare name only when ``PATH`` finds this environment's script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentbolt.cli.command_name import agentbolt_command

SCRIPT = Path(sys.executable).parent / "agentbolt"


@pytest.mark.skipif(not SCRIPT.is_file(), reason="this environment has no agentbolt script (not pip-installed)")
def test_the_bare_name_only_when_path_finds_this_environments_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agentbolt_command.cache_clear()
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}/usr/bin")
    assert agentbolt_command() == "agentbolt"

    agentbolt_command.cache_clear()
    other = tmp_path / "bin"
    other.mkdir()
    (other / "agentbolt").write_text("#!/bin/sh\n")  # another install's script first on PATH
    (other / "agentbolt").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}/usr/bin")
    shown = agentbolt_command()
    assert shown != "agentbolt" and Path(shown).resolve() == SCRIPT.resolve()
    # the hint runs as printed, from the working directory it was printed in
    done = subprocess.run([*shown.split(), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "train" in done.stdout

    agentbolt_command.cache_clear()
    monkeypatch.setenv("PATH", "/usr/bin")
    assert Path(agentbolt_command()).resolve() == SCRIPT.resolve()
    agentbolt_command.cache_clear()
