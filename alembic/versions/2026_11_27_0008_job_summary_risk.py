"""The jobs list's risk (issue 34): each summary says how much at risk its job is and what each of
its containers uses, runs with and is given.

``job_summaries.risk``: bit flags, 4 = a pinned memory limit below the job's observed peak (killed
on every run), 2 = a container in OOM backoff, 1 = an enforced CPU limit below the observed CPU p95
(throttled); the jobs list sorts by it. NULL: summarised before this revision (read as 0 until the
next refresh, within the hour). ``job_summaries.containers``: JSON, one entry per container of the
answer (``service/jobs/risk.py``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_summaries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("risk", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("containers", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_summaries", schema=None) as batch_op:
        batch_op.drop_column("containers")
        batch_op.drop_column("risk")
