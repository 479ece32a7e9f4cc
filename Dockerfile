# One image for the backend and the agent; the command chooses the role:
#   trainguard server --host 0.0.0.0 --port 8000      (the default)
#   trainguard agent --server URL [--simulate N]      (on a GPU node: NVIDIA runtime)
#   trainguard db upgrade                             (once per release, before the replicas)
# Built in two stages so the image carries wheels' contents, not a compiler or caches.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY backend ./backend
COPY migrations ./migrations
# The dashboard, the Alembic scripts and the demo job travel inside the wheel (package data).
COPY frontend ./frontend
COPY examples ./examples
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[agent,server]'

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels 'trainguard[agent,server]' \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/trainguard trainguard \
    && mkdir -p /var/lib/trainguard/spool \
    && chown -R trainguard:trainguard /var/lib/trainguard
ENV TRAINGUARD_DATA_DIR=/var/lib/trainguard \
    TRAINGUARD_AGENT_SPOOL_DIR=/var/lib/trainguard/spool \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/trainguard
# The agent on a GPU node reads /dev/kmsg and signals training processes: its pod or
# container runs as root or with CAP_SYSLOG and CAP_KILL (deploy/kubernetes/agent.yaml).
USER 10001:10001
# 8000: the backend (API, dashboard, /metrics); 9401: the agent's Prometheus exporter.
EXPOSE 8000 9401
# No HEALTHCHECK here: the agent runs from this image too. docker-compose.yml and the
# Kubernetes probes check the backend's /readyz and /healthz.
CMD ["trainguard", "server", "--host", "0.0.0.0", "--port", "8000"]
