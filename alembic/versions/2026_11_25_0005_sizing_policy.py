"""The efficient sizing policy (issue 25): a per-scope opt-in on overrides, and each org's first-run prior.

``overrides.sizing_policy``: ``seed`` or ``efficient`` at that scope, NULL to inherit from the
scope above (and at last from ``CI_SIZER_SIZING_POLICY``).

``fleet_priors``: rule E6's state per org, the two integers the core's ``prior_update`` keeps
(``PRIOR_EMPTY = (0, -1)``): ``sampled_jobs``, how many of the org's jobs have a sample (a run
without a kill, E1), and ``peak_bytes``, the highest container memory peak among those samples
(-1: none yet). Updated with every ingested run, so it survives a restart.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sizing_policy", sa.String(length=16), nullable=True))
    op.create_table(
        "fleet_priors",
        sa.Column("org", sa.String(length=200), nullable=False),
        sa.Column("sampled_jobs", sa.BigInteger(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("org", name=op.f("pk_fleet_priors")),
    )


def downgrade() -> None:
    op.drop_table("fleet_priors")
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.drop_column("sizing_policy")
