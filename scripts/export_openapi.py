"""Write the server's OpenAPI document to docs/openapi.json, so the API spec ships with the repository.

    .venv/bin/python scripts/export_openapi.py           # rewrite docs/openapi.json
    .venv/bin/python scripts/export_openapi.py --check   # exit 1 if docs/openapi.json is out of date

Run it after changing any route or any model a route reads or returns; tests/integration/test_http_openapi.py fails
until the committed file matches the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"


def render_openapi() -> str:
    """The OpenAPI document of ``create_app`` as stable JSON text (sorted keys, 2-space indent, final newline)."""
    from agentbolt.server.app import create_app
    from agentbolt.store.memory import InMemoryLightningStore

    spec = create_app(InMemoryLightningStore()).openapi()
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the document; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write (default: docs/openapi.json)")
    parser.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    args = parser.parse_args(argv)
    text = render_openapi()
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
    if args.check:
        if current != text:
            print(f"{args.out} is out of date; run: python scripts/export_openapi.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text)} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
