// NVIDIA's XID catalog (GET /xids, served from the agent's own table): what an XID means
// and what to do about it. Loaded once per page; a server without the route gives an
// empty catalog and the feed shows the bare code.
import { apiGet } from "../api.js";

let loading = null; // Promise<Map<number, entry>>

/** Resolves to a Map xid -> {xid, meaning, action, action_text}; never rejects. */
export function loadXidCatalog() {
  if (!loading) {
    loading = apiGet("xids")
      .then((body) => new Map((body?.xids ?? []).map((entry) => [entry.xid, entry])))
      .catch((error) => {
        loading = null; // try again on the next view
        if (error.status !== 404 && error.status !== 405) {
          console.warn("trainguard: XID catalog unavailable", error);
        }
        return new Map();
      });
  }
  return loading;
}

/** The catalog entry for a code, or null when the code is not in the catalog. */
export function describeXid(catalog, xid) {
  return catalog?.get(Number(xid)) ?? null;
}
