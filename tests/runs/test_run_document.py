"""The run as answered: the one-statement POST writes ``run_document`` as JSON as it is, the route
through ``RunPublic`` (service/runs/service.py); both give the same bytes for any run."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from service.runs import service as runs_service
from service.runs.schemas import RunCreate

from ..helpers import container, examples, run

CONTAINER = st.builds(
    lambda name, samples, stats, mem, limit, killed: container(
        name, cpu=samples if samples is not None else stats, mem=mem, limit=limit, oom_killed=killed
    ),
    st.sampled_from(["build", "db", "redis", "helper"]),
    st.one_of(st.none(), st.lists(st.floats(0, 64_000, allow_nan=False), min_size=1, max_size=30)),
    st.sampled_from([0.0, 1.0, 999.5, 12_345.678]),
    st.integers(1, 1 << 40),
    st.one_of(st.none(), st.integers(1, 1 << 40)),
    st.one_of(st.none(), st.booleans()),
)


@settings(max_examples=examples(60), deadline=None)
@given(containers=st.lists(CONTAINER, min_size=1, max_size=4, unique_by=lambda c: c["name"]), n=st.integers(0, 500))
def test_the_fast_posts_document_is_the_routes_answer_byte_for_byte(containers: list[dict[str, Any]], n: int) -> None:
    body = RunCreate.model_validate(run(n, *containers))
    prepared = runs_service.prepare(body)
    stored = SimpleNamespace(run_id=body.run_id, finished_at=body.finished_at, clean=prepared.clean)
    rows = [SimpleNamespace(**c) for c in prepared.containers]
    fast = orjson.dumps(runs_service.run_document(body, stored, rows, "created"))
    route = orjson.dumps(runs_service.run_public(body, stored, rows, "created").model_dump(mode="json"))
    assert fast == route
