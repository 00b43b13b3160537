"""Service settings: CLI flags and ``CI_SIZER_*`` environment variables, through pydantic-settings."""

from __future__ import annotations

import ipaddress
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.jobs import money
from service.quantity import QuantityError, parse_memory_bytes

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./ci-sizer.db"


def normalize_database_url(url: str) -> str:
    """Accept the usual spellings and pick the async driver the service uses."""
    for prefix, replacement in (
        ("postgres://", "postgresql+asyncpg://"),
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgresql+psycopg://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if url.startswith(prefix):
            return replacement + url[len(prefix) :]
    if url.startswith(("postgresql+asyncpg://", "sqlite+aiosqlite://")):
        return url
    raise ValueError("must be a sqlite:// or postgresql:// URL")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything the service can be told; each field is also ``CI_SIZER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="CI_SIZER_", extra="ignore")

    database_url: str = DEFAULT_DATABASE_URL
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    cpu_sizing_mode: Literal["observe", "enforce"] = "observe"
    memory_qos: Literal["guaranteed", "burstable"] = "guaranteed"
    sizing_policy: Literal["seed", "efficient", "growth"] = Field(
        default="seed",
        description="the sizing policy of every job without a per-scope override: seed (rules S1-S17), "
        "efficient (rules E1-E13, docs/sizing.md) or growth (rule G8: efficient aimed at a typical peak)",
    )
    max_memory: int | None = Field(default=None, description="node ceiling in bytes (rule S15)")
    max_backoff_memory: int = Field(
        default=64 << 30,
        description="with no node ceiling known (rule S15), the OOM backoff raises a memory limit to at most "
        "this (default 64Gi), or leaves it at its base when that is higher already",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    tokens_file: Path | None = None
    runner_ceilings_file: Path | None = None
    allow_anonymous: bool = False
    max_body_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, description="a request body, in bytes (then 413)")
    max_body_bytes_in_flight: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="large request bodies held at once, in bytes per worker (then 503 before reading another)",
    )
    workers: int = Field(default=1, ge=1, le=64)
    fleet_flush_seconds: float = Field(default=10.0, gt=0)
    sizing_deadline_ms: int = Field(default=250, ge=1, le=60_000, description="fail-open deadline of GET sizing")
    write_timeout_seconds: float = Field(
        default=2.5,
        gt=0,
        le=3600,
        description="bound on a write (a run's ingest, each run of a batch, an override's PUT or DELETE): 503 "
        "with Retry-After past it, the stuck database connection terminated",
    )
    ingest_timeout_seconds: float | None = Field(
        default=None, gt=0, le=3600, description="the former name of write_timeout_seconds (it wins when set)"
    )
    finished_at_max_ahead_seconds: float = Field(
        default=86_400,
        ge=0,
        description="a run's finished_at may be at most this far ahead of the server's clock (default a day)",
    )
    finished_at_max_age_days: float = Field(
        default=3650,
        gt=0,
        description="a run's started_at and finished_at may be at most this far in the past (default ten years)",
    )
    database_connect_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="bound on getting to the database: a new connection, a pooled one, SQLite's lock (then 503)",
    )
    database_statement_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="bound on one statement on PostgreSQL (then 503)"
    )
    database_pool_size: int = Field(
        default=8,
        ge=1,
        le=100,
        description=(
            "PostgreSQL connections per worker in each of its two pools (the build path's, opened at start, "
            "and the engine's, opened as needed)"
        ),
    )
    retention_runs: int = Field(default=200, ge=1, le=1_000_000, description="newest runs kept per job")
    retention_interval_seconds: float = Field(default=5.0, gt=0)
    jobs_summary_seconds: float = Field(default=2.0, gt=0, description="how often job summaries are refreshed")
    sizing_cache_entries: int = Field(
        default=20_000, ge=0, description="jobs whose answers are kept in process (0: no cache, no degraded answers)"
    )
    sizing_cache_ttl_seconds: float = Field(
        default=1.0, gt=0, description="freshness bound of cached answers with SQLite and several workers"
    )
    # money (issue 34): the operator's prices, never looked up on the network; defaults are OpenCost's
    # configs/default.json (service/jobs/money.py)
    price_per_gib_hour: float = Field(default=money.DEFAULT_PRICE_PER_GIB_HOUR, ge=0, le=1000)
    price_per_core_hour: float = Field(default=money.DEFAULT_PRICE_PER_CORE_HOUR, ge=0, le=1000)
    price_currency: str = Field(
        default=money.DEFAULT_CURRENCY,
        min_length=1,
        max_length=8,
        pattern=r"^[A-Za-z$€£¥]+$",
        description="shown beside amounts",
    )
    # connection bounds of `ci-sizer serve` (service/connections.py, docs/reliability.md)
    max_connections: int = Field(
        default=512, ge=1, le=1_000_000, description="client connections held per worker process (then evict or 503)"
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="a request's head must arrive within this of opening or of the last answer",
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a request's body must arrive within this of its head; an answer not taken for this long is dropped",
    )
    keep_alive_seconds: int = Field(default=5, ge=1, le=3600, description="idle time between two requests")
    max_header_bytes: int = Field(
        default=16 * 1024, ge=1024, le=1 << 20, description="request line and headers, in bytes (then 431)"
    )
    listen_backlog: int = Field(default=256, ge=1, le=65535, description="connections the kernel queues for accept")
    # a debug aid (issue 38): off by default, and then it costs one comparison per POST
    slow_post_log_ms: float = Field(
        default=0.0,
        ge=0,
        le=60_000,
        description="debug: log the phases of a POST of a run that takes at least this long, in ms (0: off)",
    )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return normalize_database_url(value)

    @field_validator("max_memory", "max_backoff_memory", mode="before")
    @classmethod
    def _max_memory(cls, value: object) -> object:
        if value is None or value == "":
            return None
        if isinstance(value, int):
            text = str(value)
        elif isinstance(value, str):
            text = value
        else:
            raise ValueError("must be a memory quantity such as 16Gi")
        try:
            parsed = parse_memory_bytes(text)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        if parsed <= 0:
            raise ValueError("must be greater than zero")
        return parsed

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @property
    def write_timeout(self) -> float:
        """The bound on a write: ``write_timeout_seconds``, or its former name when that is set."""
        return self.ingest_timeout_seconds if self.ingest_timeout_seconds is not None else self.write_timeout_seconds

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


@lru_cache
def get_settings() -> Settings:
    """Settings from the environment, built on first use (never at import)."""
    return Settings()


ModelT = TypeVar("ModelT", bound=BaseModel)


def read_config_file(path: Path, model: type[ModelT], what: str, error: type[Exception]) -> ModelT:
    """A TOML (``.toml``) or YAML file validated into ``model``. Every failure raises ``error``
    with one line naming the ``what`` file and why (the first three invalid fields)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} file {path}: {exc.strerror}") from None
    try:
        raw: Any = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise error(f"{what} file {path} does not parse: {type(exc).__name__}") from None
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        where = "; ".join(".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in exc.errors()[:3])
        raise error(f"{what} file {path} is invalid: {where}") from None
