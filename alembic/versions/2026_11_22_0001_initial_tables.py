"""Initial tables: jobs, runs, run_containers, overrides.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 17:58:22.808977
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('org', sa.String(length=200), nullable=False),
    sa.Column('repo', sa.String(length=200), nullable=False),
    sa.Column('workflow', sa.String(length=200), nullable=False),
    sa.Column('job', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('org', 'repo', 'workflow', 'job', name='uq_jobs_key')
    )
    op.create_table('overrides',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('org', sa.String(length=200), nullable=False),
    sa.Column('repo', sa.String(length=200), nullable=False),
    sa.Column('workflow', sa.String(length=200), nullable=False),
    sa.Column('job', sa.String(length=200), nullable=False),
    sa.Column('cpu_request_millicores', sa.BigInteger(), nullable=True),
    sa.Column('cpu_limit_millicores', sa.BigInteger(), nullable=True),
    sa.Column('memory_request_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_limit_bytes', sa.BigInteger(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('expires_at', sa.DateTime(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_overrides')),
    sa.UniqueConstraint('org', 'repo', 'workflow', 'job', name='uq_overrides_scope')
    )
    op.create_table('runs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=False),
    sa.Column('ingested_at', sa.DateTime(), nullable=False),
    sa.Column('node_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('pod_memory_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('clean', sa.Boolean(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_runs_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('job_id', 'run_id', name='uq_runs_job_run_id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_job_clean_history', ['job_id', 'clean', 'finished_at', 'id'], unique=False)
        batch_op.create_index('ix_runs_job_history', ['job_id', 'finished_at', 'id'], unique=False)

    op.create_table('run_containers',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('run_pk', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('cpu_peak', sa.Float(), nullable=False),
    sa.Column('cpu_p99', sa.Float(), nullable=False),
    sa.Column('cpu_p95', sa.Float(), nullable=False),
    sa.Column('cpu_p75', sa.Float(), nullable=False),
    sa.Column('cpu_p50', sa.Float(), nullable=False),
    sa.Column('cpu_avg', sa.Float(), nullable=False),
    sa.Column('memory_peak_bytes', sa.BigInteger(), nullable=False),
    sa.Column('memory_limit_bytes', sa.BigInteger(), nullable=True),
    sa.Column('oom_killed', sa.Boolean(), nullable=True),
    sa.Column('oom_kill_events', sa.BigInteger(), nullable=True),
    sa.Column('oom_suspect', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['run_pk'], ['runs.id'], name=op.f('fk_run_containers_run_pk_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_run_containers')),
    sa.UniqueConstraint('run_pk', 'name', name='uq_run_containers_run_name')
    )


def downgrade() -> None:
    op.drop_table('run_containers')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_job_history')
        batch_op.drop_index('ix_runs_job_clean_history')

    op.drop_table('runs')
    op.drop_table('overrides')
    op.drop_table('jobs')
