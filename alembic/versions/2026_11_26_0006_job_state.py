"""Each job's build-path state (issue 20): counts over its stored runs, kept by every write of
them on PostgreSQL, so that neither a build's GET nor a run's POST scans the job's runs.

``job_state``: the job's runs and clean runs (NULL: the row must be rebuilt from the runs), its runs
that are samples of the efficient policy, and its newest reported node memory (``service/sizing/state.py``).
The table starts empty: the service rebuilds every job's row from its stored runs in the background
at start, and counts the runs themselves until then.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_state",
        sa.Column("job_id", PK, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("runs", sa.BigInteger(), nullable=True),
        sa.Column("clean_runs", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("node_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("node_memory_at", sa.DateTime(), nullable=True),
        sa.Column("node_memory_run", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_state_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_state")),
    )


def downgrade() -> None:
    op.drop_table("job_state")
