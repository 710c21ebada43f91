#!/usr/bin/env bash
# GPU check of the torch backend: generation and training tokens/s, then GRPO steps (scripts/gpu_check.py, docs/gpu.md).
#
# Runs from a plain checkout: agentbolt need not be pip-installed (PYTHONPATH=src). The interpreter is $PYTHON, else
# the repository's .venv/bin/python when there is one, else python3. When pydantic (the one package agentbolt adds to
# torch + transformers + peft) is missing and $AGENTBOLT_WHEELS names a folder of wheels, it is installed from there,
# offline, into a temporary folder (never into the interpreter's site-packages).
#
#   scripts/gpu_check.sh                          # cuda, Qwen2.5-0.5B architecture (random weights), bf16
#   scripts/gpu_check.sh --device cpu --tiny      # CPU smoke test, well under a minute
#   scripts/gpu_check.sh --out "$OUT/gpu_check.jsonl" --budget-s 420
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
  python="$PYTHON"
elif [[ -x "$root/.venv/bin/python" ]]; then
  python="$root/.venv/bin/python"
else
  python="$(command -v python3 || command -v python)"
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ -n "${AGENTBOLT_WHEELS:-}" ]] && ! "$python" -c "import pydantic" 2>/dev/null; then
  site="$(mktemp -d)"
  "$python" -m pip install --quiet --no-index --find-links "$AGENTBOLT_WHEELS" --target "$site" pydantic
  export PYTHONPATH="$PYTHONPATH:$site"
fi

exec "$python" "$root/scripts/gpu_check.py" "$@"
