"""Builds the plain FastAPI app (`create_app`); serve_app.deployment wraps it in Ray Serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Depends, FastAPI

from openft.settings import Settings
from serve_app.errors import install_error_handlers
from serve_app.request_body import BodyLimit
from serve_app.request_head import HeadLimit, HeadLimits
from serve_app.request_params import refuse_nul_params
from serve_app.routers import (adapters, admin, api_docs, api_keys, batches, chat, dashboard, eval_compare, evals,
                               files, fine_tuning_jobs, graders, models, webhooks)
from serve_app.services.retention import reap_once
from serve_app.slow_clients import install_slow_body_guard
from serve_app.state import AppState
from webhooks.secrets import SecretBox, seal_stored

log = logging.getLogger("openft.api")


async def _reaper(state: AppState) -> None:
    while True:
        await asyncio.sleep(state.settings.reaper_interval_seconds)
        try:
            await asyncio.to_thread(reap_once, state)
        except Exception as exc:  # the loop must outlive one failed pass; the next pass retries
            log.error("reaper pass failed: %s", type(exc).__name__)


def create_app(settings: Settings, state: AppState | None = None) -> FastAPI:
    state = state or AppState.from_settings(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Webhook secrets stored before they were sealed (migration 0012) are sealed at the first start.
        await asyncio.to_thread(seal_stored, state.db, SecretBox(state.settings))
        task = asyncio.create_task(_reaper(state))
        try:
            yield
        finally:
            task.cancel()

    # FastAPI's own schema and docs routes answer anyone; serve_app/routers/api_docs.py replaces them.
    app = FastAPI(title="openft", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.openft = state
    install_error_handlers(app)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(refuse_nul_params)])
    v1.include_router(files.router)
    v1.include_router(fine_tuning_jobs.router)
    v1.include_router(models.router)
    v1.include_router(adapters.router)
    v1.include_router(batches.router)
    v1.include_router(webhooks.router)
    v1.include_router(graders.router)
    v1.include_router(evals.router)
    v1.include_router(eval_compare.router)
    v1.include_router(chat.router)
    v1.include_router(api_keys.router)
    # Without an admin key the admin API answers 404, so the schema must not list it either.
    v1.include_router(admin.router, include_in_schema=bool(settings.admin_key))
    app.include_router(v1)
    app.include_router(api_docs.router, dependencies=api_docs.access(settings))
    app.include_router(dashboard.router_for())  # static page; its API calls carry the key
    # Starlette runs the middleware added last outermost: the slow-body guard wraps BodyLimit, so
    # the reads BodyLimit makes (it reads bounded JSON bodies whole) are timed too.
    app.add_middleware(BodyLimit, routes=app.router.routes)
    install_slow_body_guard(app, settings)
    app.add_middleware(HeadLimit, limits=HeadLimits.of(settings))  # outermost: before anything reads the head
    return app
