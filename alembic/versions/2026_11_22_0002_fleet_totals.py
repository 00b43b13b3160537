"""Fleet totals on jobs: the latest recommendation's requests and observed use.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fleet_cpu_request_millicores", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("fleet_cpu_observed_millicores", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("fleet_memory_request_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("fleet_memory_observed_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("fleet_updated_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("fleet_updated_at")
        batch_op.drop_column("fleet_memory_observed_bytes")
        batch_op.drop_column("fleet_memory_request_bytes")
        batch_op.drop_column("fleet_cpu_observed_millicores")
        batch_op.drop_column("fleet_cpu_request_millicores")
