"""Every format that crosses a process boundary, defined once: the HTTP wire between
agents and the backend (`wire`), the SDK <-> agent messages (`messages`) and the XID
catalog (`xid`). The backend imports this and nothing else of the agent."""
