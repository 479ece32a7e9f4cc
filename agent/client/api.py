"""The operator's client of the REST API (`/api/v1`, docs/api-contract.md) over httpx:
one method per action, typed results, and every failure as one `ClientError`."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import msgspec

from trainguard.client.models import (
    DEFAULT_SERVER,
    ClientError,
    Incident,
    NodeCordon,
    RestartLevel,
)


class Client:
    """Calls on one server with one bearer token. `transport` stands in for the network
    (an ASGI app in a test); use it as a context manager, or call `close()`."""

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        token: str | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=f"{self.server}/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- incidents --------------------------------------------------------------------

    def restart(self, job: str, level: RestartLevel, reason: str) -> Incident:
        """Ask for a restart of `job` at `level`: the incident that carries it."""
        body = {"level": level, "reason": reason}
        return self._call("POST", f"/jobs/{_seg(job)}/restarts", Incident, json=body)

    def incidents(
        self, job: str | None = None, status: str | None = None, limit: int | None = None
    ) -> list[Incident]:
        """Incidents, newest first, of one job and in one status when given (one page)."""
        return self.incidents_page(job=job, status=status, limit=limit)[0]

    def incidents_page(
        self,
        job: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        node: str | None = None,
        cursor: str | None = None,
    ) -> tuple[list[Incident], str | None]:
        """One page of incidents, newest first, and the cursor of the next (older) page,
        None at the end (the server's X-Next-Cursor header)."""
        pairs = (("job", job), ("status", status), ("limit", limit), ("node", node))
        params = {k: v for k, v in (*pairs, ("cursor", cursor)) if v is not None}
        response = self._send("GET", "/incidents", params=params)
        return self._decode(response, list[Incident]), response.headers.get("X-Next-Cursor")

    def incident(self, incident_id: int) -> Incident:
        return self._call("GET", f"/incidents/{int(incident_id)}", Incident)

    def approve(self, incident_id: int, reason: str) -> Incident:
        """Carry out a dry-run recommendation (the engine acts at its next cycle)."""
        body = {"reason": reason}
        return self._call("POST", f"/incidents/{int(incident_id)}/approve", Incident, json=body)

    def reject(self, incident_id: int, reason: str) -> Incident:
        body = {"reason": reason}
        return self._call("POST", f"/incidents/{int(incident_id)}/reject", Incident, json=body)

    # -- nodes ------------------------------------------------------------------------

    def cordon(self, node: str, reason: str, force: bool = False) -> NodeCordon:
        body: dict[str, str | bool] = {"reason": reason}
        if force:
            body["force"] = True
        return self._call("POST", f"/nodes/{_seg(node)}/cordon", NodeCordon, json=body)

    def uncordon(self, node: str, reason: str) -> NodeCordon:
        body = {"reason": reason}
        return self._call("POST", f"/nodes/{_seg(node)}/uncordon", NodeCordon, json=body)

    # -- plumbing ---------------------------------------------------------------------

    def _call(self, method: str, path: str, type_: Any, **kwargs: Any) -> Any:
        return self._decode(self._send(method, path, **kwargs), type_)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ClientError(None, f"{self.server} did not answer in time") from None
        except httpx.TransportError as exc:
            raise ClientError(None, f"cannot reach {self.server}: {_reason(exc)}") from None
        if response.is_error:
            raise ClientError(response.status_code, _detail(response))
        return response

    def _decode(self, response: httpx.Response, type_: Any) -> Any:
        try:
            return msgspec.json.decode(response.content, type=type_)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise ClientError(
                None, f"{self.server} answered something that is not the trainguard API: {exc}"
            ) from None


def _seg(name: str) -> str:
    """A job or node name as one path segment."""
    return quote(name, safe="")


def _reason(exc: httpx.TransportError) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "connection refused"
    text = text.rpartition("] ")[2] if text.startswith("[Errno") else text
    return text[:1].lower() + text[1:]


def _detail(response: httpx.Response) -> str:
    """The server's `detail` as one line: a message, or the first validation error."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        first = detail[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        detail = f"{where}: {first.get('msg', 'invalid')}" if where else first.get("msg")
    if not isinstance(detail, str) or not detail:
        detail = response.reason_phrase or "error"
    return " ".join(detail.split())
