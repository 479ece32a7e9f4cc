"""GET /api/v1/xids: NVIDIA's XID catalog (from the agent, which parses XIDs) for the UI,
so the dashboard shows each XID's meaning and immediate action without a copy of its own."""

from __future__ import annotations

from fastapi import APIRouter, Response

from trainguard.backend import errors
from trainguard.backend.auth import ViewerDep
from trainguard.backend.catalog.schemas import XidCatalog, XidEntry
from trainguard.protocol.xid import UNKNOWN_XID, XID_CATALOG

router = APIRouter(tags=["catalog"])

# NVIDIA's "Resolution Bucket (Immediate Action)" names, in words an operator can act on.
ACTIONS: dict[str, str] = {
    "IGNORE": "no action needed; keep watching",
    "RESTART_APP": "restart the application",
    "RESET_GPU": "reset the GPU (or reboot the node)",
    "RESTART_BM": "reboot the node (bare metal)",
    "CONTACT_SUPPORT": "contact NVIDIA support",
    "WORKFLOW_NVLINK": "follow NVIDIA's NVLink workflow",
    "WORKFLOW_NVLINK5": "follow NVIDIA's NVLink5 workflow",
    "UNKNOWN": "not in the catalog; see NVIDIA's XID documentation",
}


def _entry(xid: int, meaning: str, action: str) -> XidEntry:
    return XidEntry(xid=xid, meaning=meaning, action=action, action_text=ACTIONS.get(action, ""))


@router.get(
    "/xids",
    summary="NVIDIA's XID catalog: meaning and immediate action of each code",
    responses=errors.responses(*errors.VIEWER),
)
def xid_catalog(response: Response, _: ViewerDep) -> XidCatalog:
    # The catalog changes only with a new release: let the browser keep it for an hour.
    response.headers["Cache-Control"] = "private, max-age=3600"
    return XidCatalog(
        xids=[_entry(x, info.meaning, info.action) for x, info in sorted(XID_CATALOG.items())],
        unknown=_entry(-1, UNKNOWN_XID.meaning, UNKNOWN_XID.action),
    )
