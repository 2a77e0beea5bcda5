"""The OpenAPI schema and its viewers (`/openapi.json`, `/docs`, `/docs/oauth2-redirect`, `/redoc`),
which FastAPI would otherwise serve to anyone.

They need a valid account key, like every /v1 route, unless `Settings.api_docs_public` is on; a
missing or wrong key answers 401 as those routes do (not 404: the routes exist in every FastAPI
deployment, so hiding them would protect nothing, and 401 tells a caller what to send). The admin
routes are in the schema only when an admin key is configured (serve_app/app.py). Tests and tools
in-process read the schema with `create_app(settings).openapi()`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse

from openft.settings import Settings
from serve_app.auth import current_account


router = APIRouter(include_in_schema=False)


def access(settings: Settings) -> list:
    """The dependencies the app includes this router with: an account key, unless the docs are public."""
    return [] if settings.api_docs_public else [Depends(current_account)]


def _root(request: Request) -> str:
    """The Serve route prefix this app is mounted under (from the deployment, not the client)."""
    return request.scope.get("root_path", "").rstrip("/")


@router.get("/openapi.json")
def read_openapi_schema(request: Request) -> JSONResponse:
    schema, root = request.app.openapi(), _root(request)
    if root and root not in {s.get("url") for s in schema.get("servers", [])}:
        schema = {**schema, "servers": [{"url": root}, *schema.get("servers", [])]}
    return JSONResponse(schema)


@router.get("/docs")
def read_swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title=f"{request.app.title} - Swagger UI",
                               oauth2_redirect_url=f"{root}/docs/oauth2-redirect")  # fmt: skip


@router.get("/docs/oauth2-redirect")
def read_swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
def read_redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=f"{_root(request)}/openapi.json", title=f"{request.app.title} - ReDoc")
