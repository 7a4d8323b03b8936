"""The deployments API from the outside: one client for every program that drives it over HTTP,
the ``exo-deploy list/deploy/scale/set/undeploy`` commands and the TUI's create and delete.

Both read a refusal the same way: exo's error envelope (``{"error": {"message", ...}}``, what
our master and the bridge send), else FastAPI's ``{"detail": ...}`` (a string, or the list of
validation errors of a 422), else the start of the body. Every failure is an ``ApiError`` whose
``kind`` says what went wrong (the request could not be made, the master could not be reached,
or it refused or answered something unreadable), so the CLI maps it to an exit code and the TUI
shows its message.

It sits beside the data model, importing only it and httpx/anyio, so that the TUI, which may
import nothing of the cluster side, can use it (tests/pure/test_layering.py). It is async, with
deadlines on anyio's clock, because the TUI runs on an event loop (trio's virtual clock in its
tests); the CLI drives it with ``anyio.run``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast
from urllib.parse import quote

import anyio
import httpx
from pydantic import BaseModel, ValidationError

from keeper.model.api_models import (
    DEFAULT_HISTORY_HOURS,
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentHistoryResponse,
    DeploymentsResponse,
    ErrorResponse,
    NodesResponse,
)

# Bodies quoted in a message are cut to this many characters: an HTML error page is not news.
QUOTED_BODY_CHARS = 200

NO_DEPLOYMENTS_API = (
    "this master has no deployments API (a stock exo master?): run exo-deploy's master, "
    "or `exo-deploy bridge` beside it"
)
NO_SCALING_API = (
    "this master cannot scale deployments (no PATCH /deployments/{id}): it runs an older "
    "exo-deploy; delete the deployment and create it again with the replicas wanted"
)

NO_SETTINGS_API = (
    "this master cannot change a deployment's settings (no PATCH /deployments/{id}): it runs an "
    "older exo-deploy; delete the deployment and create it again with the settings wanted"
)

# usage: the request could not even be made (a URL that is not a master's); unreachable: no
# answer; refused: an answer saying no, or one we cannot read.
FailureKind = Literal["usage", "unreachable", "refused"]

Parsed = TypeVar("Parsed", bound=BaseModel)


class ApiError(Exception):
    """A request the master refused or could not answer; ``str()`` is for the operator."""

    def __init__(
        self, message: str, status: int | None = None, kind: FailureKind = "refused"
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind: FailureKind = kind


@dataclass(frozen=True)
class Answer(Generic[Parsed]):
    """A successful answer: read (``value``), and the JSON as the master sent it (``payload``,
    for ``--json``)."""

    value: Parsed
    payload: Any


def validation_summary(errors: Sequence[object]) -> str:
    """Validation errors (pydantic's ``errors()``, or a 422's ``detail`` list) in one line,
    ``loc: msg`` each; never fails, whatever the list holds, empty included."""
    parts: list[str] = []
    for error in errors:
        if not isinstance(error, dict):
            parts.append(str(error))
            continue
        entry = cast(dict[str, Any], error)
        loc = entry.get("loc")
        # A tuple from pydantic, a list once it has been through JSON.
        parts_of_loc = cast(Sequence[Any], loc) if isinstance(loc, (list, tuple)) else ()
        where = ".".join(str(p) for p in parts_of_loc)
        message = str(entry.get("msg", "invalid"))
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid, with no details given"


def error_message(response: httpx.Response) -> str:
    """The master's own words for a refusal: exo's error envelope, else FastAPI's ``detail``
    (a string, or a 422's list of validation errors), else the status and the start of the
    body."""
    try:
        return ErrorResponse.model_validate_json(response.content).error.message
    except ValidationError:
        pass
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    detail = cast(dict[str, Any], body).get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list):
        return validation_summary(cast(list[Any], detail))
    status = f"the master answered HTTP {response.status_code} {response.reason_phrase}"
    text = response.text.strip()[:QUOTED_BODY_CHARS]
    return f"{status}: {text}" if text else status


def master_http(
    url: str,
    token: str | None,
    timeout: httpx.Timeout | float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An HTTP client for the master at ``url``, sending ``token`` as a bearer token if there is
    one; ApiError (usage) if ``url`` is not a URL at all."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=headers, transport=transport, timeout=timeout
        )
    except httpx.InvalidURL as exc:
        raise ApiError(f"not a master URL: {url!r} ({exc})", kind="usage") from None


def _read(model: type[Parsed], payload: Any, what: str) -> Parsed:
    if isinstance(payload, dict):
        # Keys a newer master adds are not an error (command answers forbid unknown keys).
        known = {
            key
            for name, field in model.model_fields.items()
            for key in (name, field.alias or name, field.serialization_alias or name)
        }
        payload = {k: v for k, v in cast(dict[str, Any], payload).items() if k in known}
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApiError(f"unexpected answer to {what}: {validation_summary(exc.errors())}") from None


class DeploymentsClient:
    """Create, list and delete deployments through ``http`` (whose ``base_url`` is the master);
    each request must finish within ``timeout_s``. The caller owns and closes ``http``."""

    def __init__(self, http: httpx.AsyncClient, timeout_s: float) -> None:
        self._http = http
        self._timeout_s = timeout_s

    @property
    def url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    async def list(self) -> Answer[DeploymentsResponse]:
        return await self.call("GET", "/deployments", DeploymentsResponse)

    async def create(self, request: CreateDeploymentRequest) -> Answer[CommandResponse]:
        body = request.model_dump(mode="json")
        # The default repair is left out, so a master from before repair (which refuses keys
        # it does not know) still takes a create that asks nothing of it.
        if body.get("repair") == "auto":
            del body["repair"]
        return await self.call("POST", "/deployments", CommandResponse, body=body)

    async def scale(self, deployment_id: str, replicas: int) -> Answer[CommandResponse]:
        """Keep ``replicas`` instances of the deployment's model (``PATCH /deployments/{id}``);
        the master judges the count (1 to 16), so its refusal is the message."""
        return await self.update(deployment_id, {"replicas": replicas}, NO_SCALING_API)

    async def update(
        self,
        deployment_id: str,
        settings: Mapping[str, int | bool | str],
        no_api: str = NO_SETTINGS_API,
    ) -> Answer[CommandResponse]:
        """Change the deployment's ``settings`` in place (``PATCH /deployments/{id}``: replicas,
        standby, priority, preempt, sharding, instance_meta, min_nodes, repair); the master
        judges them, so its refusal is the message, and ``no_api`` is what a master from before
        the route says."""
        path = f"/deployments/{deployment_id}"
        try:
            return await self.call(
                "PATCH", path, CommandResponse, body=dict(settings), what="PATCH /deployments"
            )
        except ApiError as exc:
            if exc.status == 405:  # the path exists, for DELETE only: a master from before
                raise ApiError(no_api, 405) from exc
            raise

    async def history(
        self, deployment_id: str, hours: float = DEFAULT_HISTORY_HOURS
    ) -> Answer[DeploymentHistoryResponse]:
        """The deployment's last ``hours`` (``GET /deployments/{id}/history``)."""
        path = f"/deployments/{deployment_id}/history?hours={hours:g}"
        return await self.call(
            "GET", path, DeploymentHistoryResponse, what="GET /deployments/{id}/history"
        )

    async def delete(self, deployment_id: str) -> Answer[CommandResponse]:
        path = f"/deployments/{deployment_id}"
        return await self.call("DELETE", path, CommandResponse, what="DELETE /deployments")

    async def repair(self, instance_id: str) -> Answer[CommandResponse]:
        """Replace the instance now, whatever its deployment's ``repair`` (``POST
        /instances/{id}/repair``, docs/design.md §5.19)."""
        path = f"/instances/{quote(instance_id, safe='')}/repair"
        return await self.call("POST", path, CommandResponse, what="POST /instances/{id}/repair")

    # --- nodes: cordons and drains -------------------------------------------------------

    async def nodes(self) -> Answer[NodesResponse]:
        return await self.call("GET", "/nodes", NodesResponse)

    async def cordon(self, node: str) -> Answer[CommandResponse]:
        path = f"/nodes/{quote(node, safe='')}/cordon"
        return await self.call("POST", path, CommandResponse, what="POST /nodes/{node}/cordon")

    async def uncordon(self, node: str) -> Answer[CommandResponse]:
        path = f"/nodes/{quote(node, safe='')}/cordon"
        return await self.call("DELETE", path, CommandResponse, what="DELETE /nodes/{node}/cordon")

    async def drain(self, node: str, force: bool) -> Answer[CommandResponse]:
        path = f"/nodes/{quote(node, safe='')}/drain"
        return await self.call(
            "POST", path, CommandResponse, body={"force": force}, what="POST /nodes/{node}/drain"
        )

    async def call(
        self,
        method: str,
        path: str,
        model: type[Parsed],
        *,
        body: object = None,
        what: str | None = None,
        no_route: str = NO_DEPLOYMENTS_API,
    ) -> Answer[Parsed]:
        """One call and its answer read as ``model``; ``no_route``: what a service without the
        route is told as."""
        try:
            response = await self.request(method, path, body)
        except ApiError as exc:
            # A route that does not exist answers a bare "Not Found"; our master's own 404s
            # (an unknown model or deployment) say what was not found.
            if exc.status == 404 and exc.message == "Not Found":
                raise ApiError(no_route, 404) from exc
            raise
        try:
            payload: Any = response.json()
        except ValueError:
            raise ApiError(
                f"the master at {self.url} answered {path} with something that is not JSON"
            ) from None
        return Answer(_read(model, payload, what or f"{method} {path}"), payload)

    async def request(self, method: str, path: str, body: object = None) -> httpx.Response:
        """One request, its answer if it succeeded; otherwise ApiError saying why."""
        try:
            with anyio.fail_after(self._timeout_s):
                response = await self._http.request(method, path, json=body)
        except TimeoutError:
            raise ApiError(
                f"the master at {self.url} did not answer in time", kind="unreachable"
            ) from None
        except httpx.InvalidURL as exc:
            raise ApiError(f"not a master URL: {self.url!r} ({exc})", kind="usage") from None
        except httpx.UnsupportedProtocol:
            raise ApiError(
                f"not a master URL: {self.url!r} (expected http://HOST:PORT)", kind="usage"
            ) from None
        except httpx.HTTPError as exc:
            raise ApiError(
                f"cannot reach the master at {self.url}: {exc or type(exc).__name__}",
                kind="unreachable",
            ) from None
        if response.is_error:
            raise ApiError(error_message(response), response.status_code)
        return response
