"""Ray Serve's declarative REST API (the dashboard's ``/api/serve/applications/``), behind one small class.

The reconciler only needs two calls: read what Serve runs (:meth:`ServeClient.status`) and replace the
whole config (:meth:`ServeClient.apply`, a ``PUT``: Serve deploys, updates and deletes applications to
match, the same declarative path KubeRay uses). Ray 2.60's dashboard wants a bearer token: the head
writes it to ``~/.ray/auth_token``.

:class:`RayServeClient` talks to a real head (tested against one); unit tests use a fake with the same
:class:`ServeClient` shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from baton.core import errors

SERVE_PATH = "/api/serve/applications/"

#: Serve application status -> the deployment's observed state.
APP_STATUS_TO_OBSERVED = {
    "RUNNING": "running",
    "DEPLOYING": "deploying",
    "NOT_STARTED": "deploying",
    "UNHEALTHY": "unhealthy",
    "DEPLOY_FAILED": "failed",
    "DELETING": "deploying",
}


@dataclass(frozen=True, slots=True)
class ServeApp:
    name: str
    status: str
    message: str = ""
    #: The application's entry as last submitted (name, route_prefix, import_path, args, ...).
    config: dict[str, Any] = field(default_factory=dict)
    deployments: dict[str, str] = field(default_factory=dict)
    #: How it was deployed: ``declarative`` (a config ``PUT``: the reconciler's), ``imperative``
    #: (``serve.run`` from a driver: not Baton's, and a ``PUT`` leaves it alone) or ``unknown``.
    source: str = "declarative"

    @property
    def managed(self) -> bool:
        """Whether a config ``PUT`` governs it (Serve keeps an imperative app through any ``PUT``)."""
        return self.source != "imperative"

    def matches(self, entry: dict[str, Any]) -> bool:
        """Whether Serve runs exactly this rendered application entry."""
        return all(self.config.get(k) == entry.get(k) for k in ("route_prefix", "import_path", "args"))


@dataclass(frozen=True, slots=True)
class ServeStatus:
    apps: dict[str, ServeApp]

    @classmethod
    def parse(cls, body: dict[str, Any]) -> ServeStatus:
        apps: dict[str, ServeApp] = {}
        for name, app in (body.get("applications") or {}).items():
            deps = {
                dname: str(d.get("status", ""))
                for dname, d in (app.get("deployments") or {}).items()
                if isinstance(d, dict)
            }
            apps[name] = ServeApp(
                name=name,
                status=str(app.get("status", "")),
                message=str(app.get("message") or ""),
                config=dict(app.get("deployed_app_config") or {}),
                deployments=deps,
                source=str(app.get("source") or "unknown"),
            )
        return cls(apps=apps)


class ServeClient(Protocol):
    def status(self) -> ServeStatus: ...

    def apply(self, config: dict[str, Any]) -> None: ...


class RayServeClient:
    """HTTP client of one Ray head's dashboard."""

    def __init__(self, dashboard_url: str, *, token: str | None = None, timeout_s: float = 15.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=dashboard_url.rstrip("/"), headers=headers, timeout=timeout_s,
                                  transport=transport)

    @classmethod
    def from_settings(cls, settings: Any) -> RayServeClient:
        return cls(settings.ray.dashboard_url, token=read_token(settings.ray.token_file),
                   timeout_s=settings.control.ray_timeout_s)

    def close(self) -> None:
        self._http.close()

    def status(self) -> ServeStatus:
        resp = self._request("GET")
        try:
            return ServeStatus.parse(resp.json())
        except ValueError as exc:
            raise errors.UpstreamError("Ray Serve answered with something other than JSON.") from exc

    def apply(self, config: dict[str, Any]) -> None:
        self._request("PUT", json=config)

    def _request(self, method: str, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, SERVE_PATH, **kw)
        except httpx.HTTPError as exc:
            raise errors.UnavailableError("The Ray dashboard is unreachable.") from exc
        if resp.status_code in (401, 403):
            raise errors.ConfigurationError("The Ray dashboard refused Baton's token.")
        if 400 <= resp.status_code < 500:
            # Serve refused the config itself: retrying the same config cannot help.
            raise errors.ConfigurationError(
                f"Ray Serve rejected the request ({resp.status_code}): {_short(resp.text)}", rejected=True
            )
        if resp.status_code >= 500:
            raise errors.UpstreamError(f"Ray Serve failed ({resp.status_code}): {_short(resp.text)}")
        return resp


def read_token(path: Path) -> str | None:
    try:
        return path.expanduser().read_text().strip() or None
    except OSError:
        return None


def _short(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
