"""Job summaries for the jobs list and the operator's page; the CPU request a run ran with.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("run_containers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cpu_request_millicores", sa.Float(), nullable=True))
    op.create_table(
        "job_summaries",
        sa.Column("job_id", PK, nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("override_scope", sa.String(length=16), nullable=False),
        sa.Column("oom_backoff", sa.Boolean(), nullable=False),
        sa.Column("last_run_at", sa.DateTime(), nullable=True),
        sa.Column("window_runs", sa.Integer(), nullable=False),
        sa.Column("window_oom_kills", sa.Integer(), nullable=False),
        sa.Column("run_hours_per_day", sa.Float(), nullable=True),
        sa.Column("answer_cpu_request_millicores", sa.BigInteger(), nullable=False),
        sa.Column("answer_memory_limit_bytes", sa.BigInteger(), nullable=False),
        sa.Column("in_force_cpu_request_millicores", sa.Float(), nullable=True),
        sa.Column("in_force_memory_limit_bytes", sa.BigInteger(), nullable=True),
        sa.Column("saved_memory_gib_hours_per_day", sa.Float(), nullable=True),
        sa.Column("saved_cpu_core_hours_per_day", sa.Float(), nullable=True),
        sa.Column("refreshed_at", sa.DateTime(), nullable=False),
        sa.Column("fresh_until", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_summaries_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_summaries")),
    )
    op.create_index("ix_job_summaries_stale", "job_summaries", ["refreshed_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_summaries_stale", table_name="job_summaries")
    op.drop_table("job_summaries")
    with op.batch_alter_table("run_containers", schema=None) as batch_op:
        batch_op.drop_column("cpu_request_millicores")
