"""Sizing answers kept in process, rendered once, and invalidated when what they were computed
from changes.

One structure serves two purposes:

- *fresh* answers: a hit is served without touching the database. An answer stops being fresh
  when a run of its job is committed or pruned, when any override is written, when an override it
  applied expires, or (only where no change feed reaches every worker) after a short TTL;
- *last served* answers: when the database fails, the build still gets what the job got last
  time (``degraded``), fresh or not.

Correct under concurrency: a computation takes a ``Ticket`` before it reads the database and may
only store a fresh answer if nothing invalidated its job (or everything) in the meantime, so an
answer read from a snapshot older than a change is never kept as fresh.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import orjson

from service.keys import ScopeKey
from service.sizing import formats
from service.sizing.answer import Answer
from service.sizing.fit import TemplateCpu
from service.sizing.formats import Mapping
from service.sizing.params import SizingParams

#: answers are cached per parameter set
CacheKey = SizingParams


#: renderings kept per entry (a format with its ``containers=`` and ``template_cpu_limit=``): a runner
#: asks for one; the bounds keep a client that varies them from growing an entry (a ``containers=`` of
#: 64 names renders about 18 KB and is a key of about 12 KB)
RENDERINGS_KEPT = 4
RENDERING_BYTES_KEPT = 16 * 1024  #: the renderings' bodies and their keys' text, per entry
#: parameter sets kept per job (``runs``, ``buffer``, ``cpu_percentile``): the least recently stored goes
#: first; a runner asks for one or two, and a client cycling through them would otherwise fill memory
ENTRIES_PER_JOB = 8


class Entry:
    """One cached answer, kept as its JSON (``body``, the answer's ``as_dict``) and the renderings asked
    for, not as the answer's objects: a full collection of the heap walks every object it tracks while
    every request waits, and an answer's tree is about 20 of them (docs/performance.md, section 7). The
    answer is read back from its JSON where one is needed (a format's first rendering, a degraded answer)."""

    __slots__ = ("_rendered_bytes", "_renderings", "body", "epoch", "fresh_until", "override_scope", "phase", "version")

    def __init__(self, answer: Answer, body: bytes, fresh_until: float) -> None:
        self.body = body  #: the answer rendered as JSON, once
        #: wall-clock seconds after which the entry is no longer fresh (``inf``: until invalidated)
        self.fresh_until = fresh_until
        self.phase: str = answer.meta.phase
        self.override_scope: str = answer.meta.override_scope
        self.epoch = 0  #: the cache's global epoch when computed (set by ``put``)
        self.version = 0  #: the job slot's version when computed (set by ``put``)
        self._renderings: dict[tuple[str, Mapping | None, TemplateCpu | None], tuple[str, bytes]] | None = None
        self._rendered_bytes = 0

    @property
    def answer(self) -> Answer:
        """The answer, read back from its JSON (a new object each time)."""
        return Answer.from_dict(orjson.loads(self.body))

    def rendered(
        self, output: str, mapping: Mapping | None, limits: TemplateCpu | None, answer: Answer | None = None
    ) -> tuple[str, bytes]:
        """``formats.render``'s (content type, body) of the answer, rendered once per format and
        parameters (a YAML format took 0.3-1 ms a request); ``answer``: the entry's answer where the
        caller holds it (a miss), else it is read back from the JSON."""
        key = (output, mapping, limits)
        renderings = self._renderings
        done = None if renderings is None else renderings.get(key)
        if done is None:
            done = formats.render(output, self.answer if answer is None else answer, mapping, limits)
            size = len(done[1]) + (0 if mapping is None and limits is None else len(repr(key)))
            if (renderings is None or len(renderings) < RENDERINGS_KEPT) and (
                self._rendered_bytes + size <= RENDERING_BYTES_KEPT
            ):
                if renderings is None:
                    renderings = self._renderings = {}
                renderings[key] = done
                self._rendered_bytes += size
        return done


@dataclass(slots=True)
class _Slot:
    version: int = 0
    entries: dict[CacheKey, Entry] = field(default_factory=dict)
    last: Entry | None = None  #: the entry served most recently, whatever its parameters


@dataclass(frozen=True, slots=True)
class Ticket:
    slot: _Slot
    version: int
    epoch: int


class AnswerCache:
    """Bounded by job: the least recently served job is evicted first."""

    def __init__(self, capacity: int, *, ttl_seconds: float | None = None) -> None:
        self.capacity = capacity
        #: a bound on freshness when other workers' writes cannot be heard (None: no bound)
        self.ttl_seconds = ttl_seconds
        #: False while writes elsewhere may go unheard (the change feed is down): nothing is fresh
        self.trusted = True
        #: names this cache in change notifications (see ``changes``)
        self.origin = uuid.uuid4().hex
        self._epoch = 0
        self._slots: OrderedDict[ScopeKey, _Slot] = OrderedDict()

    def __len__(self) -> int:
        return len(self._slots)

    # ------------------------------------------------------------------ reading

    def fresh(self, key: ScopeKey, params: CacheKey) -> Entry | None:
        """The answer for ``key`` with ``params`` if it is still fresh."""
        slot = self._slots.get(key)
        if slot is None or not self.trusted:
            return None
        entry = slot.entries.get(params)
        if entry is None or entry.epoch != self._epoch or entry.version != slot.version:
            return None
        if entry.fresh_until < time.time():
            return None
        self._slots.move_to_end(key)
        slot.last = entry
        return entry

    def last_served(self, key: ScopeKey, params: CacheKey) -> Entry | None:
        """For degraded answers: the entry for these parameters, else the job's last one, fresh or not."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        return slot.entries.get(params) or slot.last

    # ------------------------------------------------------------------ writing

    def ticket(self, key: ScopeKey) -> Ticket:
        """Taken before reading the database for ``key``."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
            self._evict()
        return Ticket(slot=slot, version=slot.version, epoch=self._epoch)

    def put(self, key: ScopeKey, params: CacheKey, ticket: Ticket, entry: Entry) -> None:
        """Store an answer computed under ``ticket``; it counts as fresh only if nothing was
        invalidated since the ticket was taken (else it is kept for degraded mode only)."""
        if self.capacity <= 0:
            return
        unchanged = (
            self.trusted
            and self._slots.get(key) is ticket.slot
            and ticket.version == ticket.slot.version
            and ticket.epoch == self._epoch
        )
        entry.epoch = self._epoch
        entry.version = ticket.version if unchanged else -1
        if self.ttl_seconds is not None:
            entry.fresh_until = min(entry.fresh_until, time.time() + self.ttl_seconds)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        entries = slot.entries
        entries.pop(params, None)  # stored again: the most recent
        entries[params] = entry
        while len(entries) > ENTRIES_PER_JOB:
            del entries[next(iter(entries))]
        slot.last = entry
        self._slots.move_to_end(key)
        self._evict()

    def invalidate(self, key: ScopeKey) -> None:
        """What ``key``'s answers were computed from has changed."""
        slot = self._slots.get(key)
        if slot is not None:
            slot.version += 1

    def invalidate_all(self) -> None:
        self._epoch += 1

    def _evict(self) -> None:
        while len(self._slots) > max(self.capacity, 0):
            self._slots.popitem(last=False)
