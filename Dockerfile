# One image for the backend and the agent (the command chooses the role).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY backend ./backend
COPY migrations ./migrations
COPY frontend ./frontend
RUN pip install --no-cache-dir '.[agent,server]'
ENV TRAINGUARD_FRONTEND_DIR=/app/frontend PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["trainguard", "server", "--host", "0.0.0.0", "--port", "8000"]
