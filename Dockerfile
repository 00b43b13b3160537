# syntax=docker/dockerfile:1
# Build stage: compile the wheel, Cython extension included.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY service ./service
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Runtime stage: slim, non-root, migrations shipped beside the package.
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 cisizer
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY alembic ./alembic
ENV CI_SIZER_ALEMBIC_DIR=/app/alembic \
    CI_SIZER_HOST=0.0.0.0 \
    CI_SIZER_DATABASE_URL=sqlite:////app/data/ci-sizer.db
RUN mkdir -p /app/data && chown cisizer /app/data
USER cisizer
EXPOSE 8080
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"
ENTRYPOINT ["ci-sizer"]
CMD ["serve"]
