# One image for every relayq process: `relayq worker`, `relayq beat`, `relayq api`,
# `relayq flower` (see compose.yaml). Configuration is RELAYQ_* environment only.
#
#   docker build -t relayq .
#   docker run --rm -e RELAYQ_BROKER_URL=redis://... -e RELAYQ_DATABASE_URL=... relayq worker
#
# Agents: put the modules that define them under /app (COPY in an image built
# FROM this one, or a volume) and name them in RELAYQ_AGENTS.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package is built from: no virtualenv, caches or local state.
COPY pyproject.toml README.md ./
COPY relayq ./relayq
COPY store ./store
COPY tasks ./tasks
COPY workers ./workers
COPY api ./api
COPY cli ./cli
RUN pip install . && rm -rf /src

# Never root: a tool an agent runs runs with these rights.
RUN useradd --create-home --uid 10001 relayq \
    && mkdir -p /app /var/lib/relayq \
    && chown relayq:relayq /var/lib/relayq
USER relayq
WORKDIR /app
# beat's schedule (and the embedded broker, were RELAYQ_BROKER_URL unset) live here.
ENV RELAYQ_HOME=/var/lib/relayq \
    PYTHONPATH=/app

ENTRYPOINT ["relayq"]
CMD ["worker"]
