"""The agent side (types, tracing, client, runner) must never import torch, transformers or the server; the runner
package imports Ray only when Ray runners start."""

import subprocess
import sys


def test_agent_side_does_not_import_torch_or_server() -> None:
    code = (
        "import sys, agentbolt, agentbolt.types, agentbolt.tracing, agentbolt.client, agentbolt.runner, "
        "agentbolt.runner.worker, agentbolt.runner.processes, agentbolt.runner.ray_runners\n"
        "from agentbolt import rollout, emit_reward, LLM\n"
        "heavy = ('torch', 'transformers', 'fastapi', 'agentbolt.server', 'peft', 'ray')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"agent side imported: {out.stdout.strip()}"


def test_tracing_in_use_does_not_import_torch_or_server() -> None:
    """Recording spans (SDK, OTLP exporter, OpenInference openai instrumentor when installed) stays agent-side; and
    importing agentbolt.tracing alone does not even load the OpenTelemetry SDK."""
    code = (
        "import sys, agentbolt.tracing\n"
        "assert 'opentelemetry.sdk.trace' not in sys.modules, 'agentbolt.tracing imported the SDK eagerly'\n"
        "from agentbolt import emit_reward, emit_message, operation, trace_attempt\n"
        "from agentbolt.tracing.export import ExportQueue, otlp_exporter\n"
        "import agentbolt.runner.worker\n"
        "op = operation(lambda x: x)\n"
        "with trace_attempt(instrument=True) as attempt:\n"
        "    op(1); emit_message('m'); emit_reward(1.0)\n"
        "assert attempt.final_reward == 1.0 and len(attempt.spans) == 3\n"
        "ExportQueue(otlp_exporter('http://127.0.0.1:1')).shutdown()\n"
        "bad = [m for m in ('torch', 'transformers', 'fastapi', 'agentbolt.server', 'peft') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"agent side imported: {out.stdout.strip()}"
