"""What goes to the backend: the outbox, the spool on disk, the batch sender."""
