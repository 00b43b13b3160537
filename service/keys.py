"""The scope key every resource shares: an org, then optionally repo, workflow and job (rule O1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["org", "repo", "workflow", "job"]
SCOPES: tuple[Scope, ...] = ("org", "repo", "workflow", "job")


@dataclass(frozen=True)
class ScopeKey:
    """org, then optionally repo, workflow and job; '' marks a level below the scope."""

    org: str
    repo: str = ""
    workflow: str = ""
    job: str = ""

    @property
    def scope(self) -> Scope:
        if self.job:
            return "job"
        if self.workflow:
            return "workflow"
        if self.repo:
            return "repo"
        return "org"
