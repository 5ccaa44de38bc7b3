# gate serve as an OpenEnv environment image (docs/serve.md#docker).
#
#   docker build -t gate-env .
#   docker run --rm -p 8000:8000 -e GATE_SERVE_TOKEN=<a secret> gate-env
#
# Everything is installed at build time; the running server needs no network. It listens on
# 0.0.0.0 inside the container, so it refuses to start without a token (GATE_SERVE_TOKEN, or
# `gate serve --token`); clients send it as `Authorization: Bearer <token>` or in the URL
# (http://gate:<token>@host:8000). Other flags: `docker run ... gate-env gate serve --help`.
FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
# the wheel carries the shipped cases and contracts as files (gate_pipeline/data links to cases/, contracts/)
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install "$(ls /wheels/gate_pipeline-*.whl)[serve]" && rm -rf /wheels \
    && useradd --create-home --uid 10001 gate
USER gate
WORKDIR /home/gate
ENV GATE_HOME=/home/gate/.gate
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"
CMD ["gate", "serve", "--host", "0.0.0.0", "--port", "8000"]
