"""Interactive API docs at /docs (Swagger UI) and /redoc, served from assets shipped in the
``fastapi-offline`` wheel: no request leaves the machine, so the docs work on a host without
internet (FastAPI's defaults load their JavaScript and CSS from a CDN: a blank page offline).

Swagger UI's "Authorize" button takes an API key (the document declares bearer authentication),
and "Try it out" sends from the page to this API only.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSET_PATH = "/docs/assets"
ASSET_FILES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
# validatorUrl None: Swagger UI would otherwise ask validator.swagger.io for a badge.
SWAGGER_PARAMETERS = {"validatorUrl": None, "persistAuthorization": False, "tryItOutEnabled": False}


def docs_router(app: FastAPI) -> APIRouter:
    """The docs routes for ``app`` (built with ``docs_url=None, redoc_url=None``)."""
    router = APIRouter(include_in_schema=False)
    openapi_url = app.openapi_url or "/openapi.json"

    @router.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSET_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSET_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSET_PATH}/favicon.png",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{ASSET_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSET_PATH}/favicon.png",
            with_google_fonts=False,
        )

    @router.get(ASSET_PATH + "/{name}")
    async def asset(name: str) -> FileResponse:
        media = ASSET_FILES.get(name)
        if media is None:  # a fixed list: no path from the request reaches the file system
            raise HTTPException(404, "Not Found")
        return FileResponse(
            ASSETS / name, media_type=media, headers={"Cache-Control": "public, max-age=86400"}
        )

    return router
