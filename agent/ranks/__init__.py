"""The ranks on this node: the local socket server, the rank table, liveness."""
