"""The API docs of an app, Swagger UI at ``/docs`` and ReDoc at ``/redoc``, with their scripts,
styles and icon served by the app itself rather than from a CDN, so that they work on a
machine without internet access (FastAPI's own pages load them from a CDN: blank there).

The assets are the ones the ``fastapi-offline`` package ships (Swagger UI 5, which reads the
OpenAPI 3.1 documents FastAPI writes, and ReDoc 2), mounted at ``ASSETS``. An app built with
``docs_url=None, redoc_url=None`` gets both pages from ``serve_docs_offline``; like the
OpenAPI document they need no token.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
# the package and the folder inside it that hold swagger-ui-bundle.js, swagger-ui.css,
# redoc.standalone.js and favicon.png
ASSET_PACKAGE = ("fastapi_offline", "static")
SWAGGER_UI_PARAMETERS = {
    # no badge asking an online validator about the document
    "validatorUrl": None,
    # keep a pasted token across reloads of the page
    "persistAuthorization": True,
}


def serve_docs_offline(app: FastAPI, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Add the docs pages and their assets to ``app``, which must have been made without
    FastAPI's own (``docs_url=None, redoc_url=None``)."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("make the app with docs_url=None and redoc_url=None: its docs would load from a CDN")
    openapi_url = app.openapi_url
    if openapi_url is None:
        raise ValueError("the docs pages need the app's OpenAPI document")
    app.mount(ASSETS, StaticFiles(packages=[ASSET_PACKAGE]), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters={**SWAGGER_UI_PARAMETERS, **(app.swagger_ui_parameters or {})},
        )

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
