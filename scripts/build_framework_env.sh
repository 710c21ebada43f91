#!/usr/bin/env bash
# Build the virtual environment of one framework example: .venv-frameworks/NAME, made fresh with `python -m venv`.
#
# It holds the agent side only: agentbolt's core dependencies (`pip install -e .`, no extras: no torch, no server)
# and examples/frameworks/NAME/requirements.txt (the framework, its openai version, its OpenInference instrumentor).
# Each framework gets its own environment because their pins conflict (crewai: openai<3, openai-agents: openai>=3;
# autogen: protobuf 5.x). Fails when torch, triton or an nvidia-* package got in. Prints the time taken and the size.
#
# Usage: scripts/build_framework_env.sh NAME   (PY=python3.12 to pick the interpreter; the Makefile calls it)
set -euo pipefail

name=${1:?usage: $0 NAME (a folder of examples/frameworks)}
root=$(cd "$(dirname "$0")/.." && pwd)
requirements=$root/examples/frameworks/$name/requirements.txt
venv=$root/.venv-frameworks/$name
stamp=$venv/.agentbolt-installed
py=${PY:-python3}

if [[ ! -f $requirements ]]; then
    echo "error: no $requirements" >&2
    exit 2
fi

start=$(date +%s)
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e "$root" -r "$requirements"

heavy=$("$venv/bin/python" -m pip list --format=freeze | grep -iE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' || true)
if [[ -n $heavy ]]; then
    echo "error: the $name environment pulled in packages it must not have (the agent side never needs them):" >&2
    echo "$heavy" >&2
    echo "find which requirement brings them with: $venv/bin/python -m pip show -v <package> (Required-by)" >&2
    exit 1
fi
"$venv/bin/python" -c "import agentbolt.runner.worker, agentbolt.cli.main" # the runner imports in this environment

"$venv/bin/python" -m pip freeze --exclude-editable > "$venv/requirements.freeze.txt"
touch "$stamp"
echo "framework environment $name: built in $(($(date +%s) - start)) s, $(du -sh "$venv" | cut -f1)," \
    "$(wc -l < "$venv/requirements.freeze.txt") packages (list: $venv/requirements.freeze.txt)"
