"""The room agent's answer step: the model writes ``choose(rooms)`` in Python and the agent runs it on the tool result.

Why a program rather than a room name (measured, 10-19 train tasks, temperature 0): asked for a room name, neither
Qwen2.5-Coder-0.5B nor -1.5B applied a booking rule written in the prompt (every answer the same room, whatever the
prompt); asked for ``choose(rooms)``, the 1.5B writes the filter the prompt describes, so the prompt decides the
choice. This is the "program of thoughts" answer format (Chen et al., 2022, arXiv:2211.12588).

Running model-written code: :func:`run_program` runs it in a separate ``python -I`` process with a wall-clock timeout,
CPU-time and memory limits (POSIX), no ``import``, no name or attribute starting with ``_``, and a small set of
builtins. That keeps a buggy program (an endless loop, a huge list) from hurting the agent's process. It is NOT a
security sandbox: run agents whose model you do not trust inside a container.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FUNCTION_NAME = "choose"
TIMEOUT_S = 10.0
CPU_LIMIT_S = 5
MEMORY_LIMIT_BYTES = 1 << 30
_FENCE_RE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ALLOWED_BUILTINS = [
    "abs",
    "all",
    "any",
    "bool",
    "dict",
    "enumerate",
    "filter",
    "float",
    "int",
    "isinstance",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "min",
    "next",
    "range",
    "reversed",
    "round",
    "set",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "Exception",
    "IndexError",
    "KeyError",
    "StopIteration",
    "TypeError",
    "ValueError",
]


@dataclass(frozen=True)
class ProgramResult:
    """What :func:`run_program` got: the string ``choose(rooms)`` returned (``value``), or why there is none
    (``error``, one line such as ``"KeyError: 'name'"``). Exactly one of them is set."""

    value: str | None
    error: str | None


def extract_program(reply: str | None) -> str | None:
    """The Python source in a reply that defines ``choose``: the first fenced block (```python ... ```) that does,
    else the whole reply when it does; ``None`` when the reply defines no ``choose`` (a plain-text answer)."""
    if not reply:
        return None
    for block in _FENCE_RE.findall(reply):
        if f"def {FUNCTION_NAME}" in block:
            return str(block)
    return reply if f"def {FUNCTION_NAME}" in reply else None


def check_program(source: str) -> str | None:
    """Why ``source`` may not run (a syntax error, an ``import``, a name or attribute starting with ``_``, no
    top-level ``def choose``), or ``None`` when it may."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            return "import is not allowed: use the builtins only"
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and name.startswith("_"):
            return f"names starting with '_' are not allowed ({name})"
    if not any(isinstance(node, ast.FunctionDef) and node.name == FUNCTION_NAME for node in tree.body):
        return f"the program defines no top-level function {FUNCTION_NAME}(rooms)"
    return None


def run_program(source: str, rooms: Sequence[object], timeout_s: float = TIMEOUT_S) -> ProgramResult:
    """Run ``source`` and call ``choose(rooms)`` in a child process (see the module docstring for its limits).

    Args:
        source: Python source that defines ``choose(rooms)``; module-level code runs first, with ``rooms`` already
            defined (so a trailing ``print(choose(rooms))`` works; ``print`` does nothing).
        rooms: the JSON-serialisable list passed to ``choose`` (the tool result's ``"rooms"``).
        timeout_s: wall-clock limit in seconds for the child process.

    Returns:
        :class:`ProgramResult`: the returned string, or an error (the check's refusal, the exception raised,
        ``"choose returned <type>, not a string"``, or a timeout). Never raises for a bad program.
    """
    refused = check_program(source)
    if refused is not None:
        return ProgramResult(value=None, error=refused)
    payload = json.dumps({"source": source, "rooms": list(rooms)})
    try:
        completed = subprocess.run(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ProgramResult(value=None, error=f"the program ran longer than {timeout_s:g} s")
    lines = completed.stdout.strip().splitlines()
    try:
        outcome = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        outcome = {}
    if isinstance(outcome.get("value"), str):
        return ProgramResult(value=outcome["value"], error=None)
    if isinstance(outcome.get("error"), str):
        return ProgramResult(value=None, error=outcome["error"])
    reason = completed.stderr.strip().splitlines()[-1:] or [f"exit status {completed.returncode}"]
    return ProgramResult(value=None, error=f"the program process failed: {reason[0]}")


def _child_main() -> None:
    """Child side of :func:`run_program`: read ``{"source", "rooms"}`` from stdin, write one JSON line."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ImportError, ValueError, OSError):  # not POSIX, or a limit the platform refuses: run without it
        pass
    request = json.load(sys.stdin)
    out = sys.stdout
    import builtins

    allowed = {name: getattr(builtins, name) for name in _ALLOWED_BUILTINS}
    allowed["print"] = lambda *args, **kwargs: None
    namespace: dict[str, object] = {"__builtins__": allowed, "rooms": json.loads(json.dumps(request["rooms"]))}
    try:
        exec(compile(request["source"], "<choose>", "exec"), namespace)  # noqa: S102 - checked, limited, own process
        value = namespace[FUNCTION_NAME](request["rooms"])  # type: ignore[operator]
    except MemoryError:
        outcome = {"error": "MemoryError: the program used too much memory"}
    except Exception as exc:  # noqa: BLE001 - any failure of the model's program is its outcome
        outcome = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    else:
        if isinstance(value, str):
            outcome = {"value": value}
        else:
            outcome = {"error": f"{FUNCTION_NAME} returned {type(value).__name__}, not a string (the room id)"}
    out.write("\n" + json.dumps(outcome) + "\n")
    out.flush()


if __name__ == "__main__":
    _child_main()
