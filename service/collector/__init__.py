"""``ci-sizer collect``: measure a build and post the run (see ``service.collector.sources``)."""

from service.collector.sources import (
    CgroupV2,
    Identity,
    cgroup_source,
    flush,
    identity_from_env,
    locate,
    own_cgroups,
    parse_mountinfo,
    parse_proc_cgroup,
    run_collect,
    spool,
)

__all__ = [
    "CgroupV2",
    "Identity",
    "cgroup_source",
    "flush",
    "identity_from_env",
    "locate",
    "own_cgroups",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "run_collect",
    "spool",
]
