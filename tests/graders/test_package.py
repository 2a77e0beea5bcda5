"""graders/ stays pure: it imports nothing of the service's layers, no Ray, no HTTP, no database,
so that evals, the grader endpoints and reinforcement jobs can all call it (and tests run it alone)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "graders"
FORBIDDEN = ("serve_app", "storage", "jobs", "batches", "train", "pipelines", "entrypoints", "webhooks", "ray",
             "fastapi", "starlette", "httpx", "requests", "sqlalchemy", "boto3", "torch")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_graders_imports_no_service_layer_ray_http_or_database():
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        assert not _imports(path) & set(FORBIDDEN), path.name
