"""The operator client's models (agent/client/models.py) against the backend's OpenAPI
document: every field the client reads is one the API answers, with a JSON type the API
can give it, and a field the client requires is one the API always sends. The client
stays without the server's packages (an operator's laptop has no server), so its structs
are its own; this is where they cannot drift from the backend's schemas unseen."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.support import TOKEN
from trainguard.backend.app import create_app
from trainguard.backend.settings import Settings
from trainguard.client import models

# client struct -> the backend's schema (components/schemas) it decodes
PAIRS: dict[type[msgspec.Struct], str] = {
    models.Incident: "Incident",
    models.Timeline: "Timeline",
    models.Evidence: "EvidenceItem",
    models.Command: "IncidentCommand",
    models.Ack: "CommandPhase",
    models.NodeCordon: "CordonState",
}


@pytest.fixture(scope="module")
def components(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("openapi")
    settings = Settings(data_dir=data, admin_token=TOKEN, engine_enabled=False)
    doc = create_app(settings).openapi()
    return dict(doc["components"]["schemas"])


def _types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON types a (resolved) schema allows."""
    if "$ref" in schema:
        return _types(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "anyOf" in schema:
        return set().union(*(_types(s, defs) for s in schema["anyOf"]))
    if "type" in schema:
        t = schema["type"]
        return set(t) if isinstance(t, list) else {t}
    return {"any"}


def drift(client: type[msgspec.Struct], server: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """What the client expects that the server's schema does not give."""
    (ref,) = [msgspec.json.schema(client)["$ref"].rsplit("/", 1)[-1]]
    mine = msgspec.json.schema_components([client])[1][ref]
    out = []
    props = server.get("properties", {})
    for name, schema in mine["properties"].items():
        if name not in props:
            out.append(f"{client.__name__}.{name}: the API has no such field")
            continue
        want = _types(schema, msgspec.json.schema_components([client])[1])
        have = _types(props[name], defs)
        if "integer" in have:
            have.add("number")  # an integer decodes where a float is expected
        if "any" not in want | have and not want & have:
            out.append(f"{client.__name__}.{name}: client {sorted(want)}, API {sorted(have)}")
        if name in mine.get("required", []) and name not in server.get("required", []):
            out.append(f"{client.__name__}.{name}: required by the client, optional in the API")
    return out


def test_the_clients_models_read_only_what_the_api_answers(components: dict[str, Any]) -> None:
    found = [d for c, s in PAIRS.items() for d in drift(c, components[s], components)]
    assert found == [], "\n".join(found)


def test_the_check_sees_a_field_the_api_lacks_and_a_type_that_changed(
    components: dict[str, Any],
) -> None:
    class Incident(msgspec.Struct, kw_only=True):
        id: str  # the API's is an integer
        vanished: float | None = None

    found = drift(Incident, components["Incident"], components)
    assert any("Incident.id: client ['string'], API ['integer'" in d for d in found), found
    assert any("Incident.vanished: the API has no such field" in d for d in found), found
