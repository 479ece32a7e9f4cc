"""Every format that crosses a process boundary, defined once, in msgspec:

- `wire`: the HTTP wire between agents and the backend (batches, commands, acks);
- `messages`: the datagrams between a training rank's SDK and its node's agent (one
  versioned tagged union each way);
- `xid`: NVIDIA's XID catalog (what each XID means, the action it calls for);
- `discovery`: where a rank finds its node's agent (the well-known sockets), the one
  rule both sides follow.

The backend imports this and nothing else of the agent; the SDK imports this and the
standard library only."""
