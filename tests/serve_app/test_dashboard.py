"""The dashboard's route (serve_app/routers/dashboard.py): the built page and its assets with a
strict CSP, the redirect under the Serve prefix, a page saying how to build it when the bundle is
missing, and nothing but the bundle's own asset names. In Chromium: tests/e2e/test_dashboard.py."""

from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.testclient import TestClient

from serve_app.errors import install_error_handlers
from serve_app.routers import dashboard


def client_for(static, root_path: str = "") -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(dashboard.router_for(static))
    return TestClient(app, root_path=root_path, follow_redirects=False)


def test_the_built_bundle_is_served_with_its_assets():
    index = dashboard.STATIC / "index.html"
    assert index.is_file(), "no dashboard bundle: run `make dashboard` (npm ci && npm run build in dashboard/)"
    client = client_for(dashboard.STATIC)
    page = client.get("/dashboard/")
    assert page.status_code == 200 and page.text == index.read_text()
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "http" not in page.text  # no CDN: every asset is this server's, by a relative URL
    assets = re.findall(r'(?:src|href)="\./assets/([^"]+)"', page.text)
    assert {a.rsplit(".", 1)[1] for a in assets} == {"js", "css"}
    for name in assets:
        asset = client.get(f"/dashboard/assets/{name}")
        assert asset.status_code == 200 and asset.content == (dashboard.STATIC / "assets" / name).read_bytes()
        assert "immutable" in asset.headers["cache-control"]


def test_the_redirect_keeps_the_serve_prefix(tmp_path):
    r = client_for(tmp_path, root_path="/openft").get("/dashboard")
    assert (r.status_code, r.headers["location"]) == (308, "/openft/dashboard/")


def test_a_missing_bundle_answers_how_to_build_it(tmp_path):
    r = client_for(tmp_path).get("/dashboard/")
    assert r.status_code == 503 and "make dashboard" in r.text and "npm run build" in r.text


def test_only_the_bundles_own_asset_names_are_served(tmp_path):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "app-1.js").write_text("x")
    (tmp_path / "secret.js").write_text("s")
    client = client_for(tmp_path)
    assert client.get("/dashboard/assets/app-1.js").text == "x"
    for name in ("..%2Fsecret.js", "app-2.js", "index.html", "%2E%2E%2Fsecret.js"):
        r = client.get(f"/dashboard/assets/{name}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", name
