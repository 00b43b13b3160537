"""A live sizer (``ci-sizer serve`` on SQLite) shared by the growth tests (of one pytest process): each test
posts a run of its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..live import LiveServer


@dataclass
class Sizer:
    url: str
    database: Path


@pytest.fixture(scope="session")
def sizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sizer]:
    database = tmp_path_factory.mktemp("sizer") / "sizer.db"
    with LiveServer(f"sqlite:///{database}") as server:
        yield Sizer(server.url, database)
