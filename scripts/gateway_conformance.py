"""Write the gateway's conformance table (protocol x request field x backend) to docs/gateway_conformance.md.

    .venv/bin/python scripts/gateway_conformance.py           # rewrite docs/gateway_conformance.md
    .venv/bin/python scripts/gateway_conformance.py --check   # exit 1 if the file is out of date

Run it after changing what a protocol does with a field (the ``*_FIELDS`` tables of src/agentbolt/server/gateway)
or what a backend refuses; tests/unit/test_gateway_conformance.py fails until the committed file matches the code.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "gateway_conformance.md"


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the table; returns the exit status."""
    from agentbolt.server.gateway.conformance import conformance_markdown

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true", help="only report whether the file is up to date")
    args = parser.parse_args(argv)
    text = conformance_markdown()
    current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
    if args.check:
        if current != text:
            print(f"{args.out} is out of date; run: python scripts/gateway_conformance.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
