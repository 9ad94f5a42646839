# Control plane image: the ASGI server (web) and the Celery worker run from it with different
# commands (see compose.yaml). Build from the repository root:
#   docker build -f docker/control-plane.Dockerfile -t llm-platform/control-plane .
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app/platform:/app \
    DJANGO_SETTINGS_MODULE=config.settings \
    VAR_DIR=/app/var

WORKDIR /app

COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt

COPY manage.py ./
COPY platform/ platform/
COPY serving/ serving/
# The control plane parses the agents' frames with gpu_agent.protocol and checks models' engine
# options and hosts' addresses with gpu_agent's own rules: without it nothing imports.
COPY gpu_agent/ gpu_agent/
COPY frontend/ frontend/

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /app --no-create-home app \
    && mkdir -p /app/var \
    && chown 10001:10001 /app/var
USER 10001:10001

EXPOSE 8000
# GET /api/health/ with a Host header that ALLOWED_HOSTS admits (platform/core/healthcheck.py).
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
    CMD ["python", "-m", "core.healthcheck", "8000"]
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "config.asgi:application"]
