# syntax=docker/dockerfile:1
# Base image, pinned by digest for a reproducible build. The tag alone is kept here because a digest
# can only be read from the registry, and one copied from anywhere else is not evidence of what the
# tag holds. To pin (and to bump the pin, e.g. from Renovate's or Dependabot's docker manager):
#   docker buildx imagetools inspect python:3.11-slim          # prints "Digest: sha256:<64 hex>"
#   (or: docker pull python:3.11-slim && docker inspect --format '{{index .RepoDigests 0}}' python:3.11-slim)
# then build with
#   docker build --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<64 hex> .
# or write that value as the default below; with both a tag and a digest, the digest is what is pulled.
ARG PYTHON_IMAGE=python:3.11-slim

# Build stage: compile the wheel, Cython extension included.
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY service ./service
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Runtime stage: slim, non-root, migrations shipped beside the package.
FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 cisizer && useradd --create-home --uid 10001 --gid 10001 cisizer
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY alembic ./alembic
ENV CI_SIZER_ALEMBIC_DIR=/app/alembic \
    CI_SIZER_HOST=0.0.0.0 \
    CI_SIZER_DATABASE_URL=sqlite:////app/data/ci-sizer.db
RUN mkdir -p /app/data && chown 10001:10001 /app/data
# numeric, so that Kubernetes' runAsNonRoot can verify it is not root without reading /etc/passwd
USER 10001:10001
EXPOSE 8080
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"
ENTRYPOINT ["ci-sizer"]
CMD ["serve"]
