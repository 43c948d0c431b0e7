# PromptYoSelf as a service: delivery + HTTP (/mcp, /healthz, /livez, /readyz, /metrics) on port 8000.
# docs/deployment.md explains the compose file that runs it beside Letta and PostgreSQL.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    FASTMCP_CHECK_FOR_UPDATES=off

WORKDIR /app
COPY pyproject.toml README.md promptyoself_mcp_server.py ./
COPY promptyoself ./promptyoself
RUN pip install ".[postgres]"

# An unprivileged user; its home holds the SQLite default when PROMPTYOSELF_DB is not set.
RUN useradd --create-home --uid 10001 promptyoself
USER promptyoself

EXPOSE 8000
# /readyz is open (no token): 200 when the service can store schedules (its database takes a write),
# 503 when it cannot. A Letta outage does not make the container unhealthy (/healthz, the full
# verdict, says 503 then); /livez answers while the process serves.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["python", "-m", "promptyoself"]
# Binding 0.0.0.0 inside the container needs --allow-external and PROMPTYOSELF_HTTP_TOKEN.
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--allow-external"]
