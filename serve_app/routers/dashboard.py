"""The web dashboard's static files: `GET /dashboard/` (the page) and `/dashboard/assets/{name}`.

No key is needed to load them: the page asks for the API key and keeps it in the tab's
sessionStorage, and every object it shows comes from the public /v1 routes it calls with that key
(so it sees exactly what the key's account sees). The bundle is built from dashboard/ by `npm run
build` (the Makefile's `dashboard` rule) into serve_app/dashboard_static, which the package ships;
without it the page says how to build it.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from openft.errors import NotFound

STATIC = Path(__file__).resolve().parent.parent / "dashboard_static"
_ASSET = re.compile(r"^[A-Za-z0-9_.-]+\.(js|css|svg|png|woff2)$")
# Only this server's own scripts and styles, and API calls to this origin: the page handles a key.
_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
}
_NOT_BUILT = """<!doctype html><html lang="en"><meta charset="utf-8"><title>openft dashboard not built</title>
<h1>The dashboard is not built</h1>
<p>This install has no dashboard bundle. In the source checkout run <code>make dashboard</code>
(or <code>cd dashboard &amp;&amp; npm ci &amp;&amp; npm run build</code>; Node.js 20.19 or newer), then
reload this page (an editable install serves the new bundle at once; a wheel must be rebuilt and
reinstalled). The API under <code>/v1</code> works without it.</p></html>"""


def router_for(static: Path = STATIC) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/dashboard")
    def redirect_to_dashboard(request: Request) -> RedirectResponse:
        # The page's asset and API URLs are relative to /dashboard/; the prefix is the Serve route's, not the client's.
        return RedirectResponse(f"{request.scope.get('root_path', '').rstrip('/')}/dashboard/", status_code=308)

    @router.get("/dashboard/")
    def read_dashboard():
        index = static / "index.html"
        if not index.is_file():
            return HTMLResponse(_NOT_BUILT, status_code=503, headers=_HEADERS)
        return FileResponse(index, media_type="text/html", headers={**_HEADERS, "cache-control": "no-cache"})

    @router.get("/dashboard/assets/{name}")
    def read_dashboard_asset(name: str):
        path = static / "assets" / name
        if not _ASSET.match(name) or not path.is_file():
            raise NotFound("No such dashboard asset; the page names its own (rebuilt bundles rename them).", param="name")
        # Vite puts a content hash in every asset name, so a name never changes its bytes.
        return FileResponse(path, headers={**_HEADERS, "cache-control": "public, max-age=31536000, immutable"})

    return router
