"""Growth events (issue 40): ``run_growths``, one row per attempt of the growth guard to raise a running
container's memory limit in place (grown, deferred, infeasible, too_late, error), stored with its run.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "run_growths",
        sa.Column("id", PK, autoincrement=True, nullable=False),
        sa.Column("run_pk", PK, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("from_bytes", sa.BigInteger(), nullable=False),
        sa.Column("to_bytes", sa.BigInteger(), nullable=False),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_run_growths_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_growths")),
        sa.UniqueConstraint("run_pk", "position", "seq", name="uq_run_growths_run_pk"),
    )


def downgrade() -> None:
    op.drop_table("run_growths")
