"""The agent side (types, tracing, client, runner) must never import torch, transformers or the server."""

import subprocess
import sys


def test_agent_side_does_not_import_torch_or_server() -> None:
    code = (
        "import sys, agentbolt, agentbolt.types, agentbolt.tracing, agentbolt.client, agentbolt.runner, "
        "agentbolt.runner.worker, agentbolt.runner.processes\n"
        "from agentbolt import rollout, emit_reward, LLM\n"
        "bad = [m for m in ('torch', 'transformers', 'fastapi', 'agentbolt.server', 'peft') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"agent side imported: {out.stdout.strip()}"
