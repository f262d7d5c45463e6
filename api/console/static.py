"""Serves the built front end (``web/dist``, from ``npm run build``) at ``/console/``.

Every path under ``/console/`` that is not a built file gets ``index.html`` (the front end routes in
the browser); hashed assets are cached for a year, the page itself never.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from baton.api.console.common import problem
from baton.core import errors

#: Where ``npm run build`` in ``web/`` puts the console (the repository's ``web/dist``).
DEFAULT_DIST = Path(__file__).resolve().parents[2] / "web" / "dist"
BASE = "/console/"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}

_NOT_BUILT = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Baton console</title></head>
<body><main><h1>The console is not built</h1><p>Run <code>scripts/setup</code> (or <code>npm ci &amp;&amp;
npm run build</code> in <code>web/</code>) and reload this page.</p></main></body></html>"""

router = APIRouter(include_in_schema=False)


def dist_dir(request: Request) -> Path:
    ctx = getattr(request.app.state, "console", None)
    override = getattr(ctx, "extra", {}).get("static_dir") if ctx is not None else None
    return Path(override) if override else DEFAULT_DIST


def _index(dist: Path) -> Response:
    index = dist / "index.html"
    if not index.is_file():
        return HTMLResponse(_NOT_BUILT, status_code=503, headers=SECURITY_HEADERS)
    return FileResponse(index, media_type="text/html", headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"})


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse(BASE, status_code=307)


@router.get("/console")
def console_root() -> RedirectResponse:
    return RedirectResponse(BASE, status_code=307)


@router.get("/console/{path:path}")
def console_file(path: str, request: Request) -> Response:
    if path == "api" or path.startswith("api/"):
        missing: Response = problem(errors.NotFoundError("No such console API route."), request.url.path)
        return missing
    dist = dist_dir(request).resolve()
    if path:
        target = (dist / path).resolve()
        if target.is_file() and target.is_relative_to(dist):
            cache = "public, max-age=31536000, immutable" if path.startswith("assets/") else "no-cache"
            return FileResponse(target, headers={**SECURITY_HEADERS, "Cache-Control": cache})
        if path.startswith("assets/"):
            no_file: Response = problem(errors.NotFoundError("No such file."), request.url.path)
            return no_file
    return _index(dist)
