"""Builds the plain FastAPI app (`create_app`); serve_app.deployment wraps it in Ray Serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Depends, FastAPI

from openft.settings import Settings
from serve_app.errors import install_error_handlers
from serve_app.request_params import refuse_nul_params
from serve_app.routers import adapters, admin, files, fine_tuning_jobs, models
from serve_app.services.retention import reap_once
from serve_app.state import AppState

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
        task = asyncio.create_task(_reaper(state))
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="openft", lifespan=lifespan)
    app.state.openft = state
    install_error_handlers(app)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(refuse_nul_params)])
    v1.include_router(files.router)
    v1.include_router(fine_tuning_jobs.router)
    v1.include_router(models.router)
    v1.include_router(adapters.router)
    v1.include_router(admin.router)
    app.include_router(v1)
    return app
