"""The OpenAPI document: it describes every route, it is what the server serves, and docs/openapi.json is current."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx

from agentbolt import semconv
from agentbolt.server.app import create_app
from agentbolt.server.serving import serve_in_background
from agentbolt.store.memory import InMemoryLightningStore

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "export_openapi.py"
NOT_IN_SCHEMA = {"/", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
"""The service root and FastAPI's own documentation pages."""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_openapi", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_openapi_describes_every_route() -> None:
    from tests.integration.test_http_api_safety import all_operations

    app = create_app(InMemoryLightningStore())
    spec = app.openapi()
    documented = {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops}
    served = {(m, p) for m, p in all_operations(app) if m != "HEAD" and p not in NOT_IN_SCHEMA}
    assert served - documented == set(), "routes missing from /openapi.json"
    undescribed = [
        f"{method.upper()} {path}"
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if not op.get("summary", "").strip() or not op.get("description", "").strip()
    ]
    assert not undescribed, f"routes without a summary and a description (add a docstring): {undescribed}"
    traces = spec["paths"]["/v1/traces"]["post"]
    assert semconv.ROLLOUT_ID in traces["description"] and semconv.ATTEMPT_ID in traces["description"]
    assert set(traces["requestBody"]["content"]) == {"application/x-protobuf", "application/json"}
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_served_openapi_matches_the_export_and_needs_the_token() -> None:
    async def main() -> None:
        app = create_app(InMemoryLightningStore(), token="spec-token")
        async with serve_in_background(app) as url, httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/openapi.json")).status_code == 401
            resp = await client.get("/openapi.json", headers={"Authorization": "Bearer spec-token"})
            assert resp.status_code == 200
            assert resp.json() == json.loads(_script().render_openapi())

    asyncio.run(main())


def test_committed_openapi_json_is_up_to_date() -> None:
    committed = REPO / "docs" / "openapi.json"
    assert committed.exists(), "docs/openapi.json is missing; run: python scripts/export_openapi.py"
    assert committed.read_text(encoding="utf-8") == _script().render_openapi(), (
        "docs/openapi.json is out of date with the routes; run: python scripts/export_openapi.py"
    )


def test_export_script_check_mode(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    run = [sys.executable, str(SCRIPT), "--out", str(out)]
    assert subprocess.run([*run, "--check"], capture_output=True).returncode == 1  # missing file
    assert subprocess.run(run, capture_output=True).returncode == 0
    assert subprocess.run([*run, "--check"], capture_output=True).returncode == 0
    assert json.loads(out.read_text())["info"]["title"] == "agentbolt"
