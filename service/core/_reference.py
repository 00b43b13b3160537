"""Pure-Python reference of the sizing maths: the source of truth.

``_sizing.pyx`` implements the same functions in compiled code; the tests require both to give
identical answers (floats within 1e-9 relative). Rule ids refer to ``shared/spec/sizing.md``.

All memory arithmetic is done in integers (bytes, or hundredths of a byte where a percentage
buffer applies), so no binary float rounding can push a value over a MiB boundary (rule S12).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

MIB = 1 << 20
GIB = 1 << 30
#: Saturation point of the OOM backoff (rule S14): far above any real node, far below int64 overflow.
MAX_BYTES = 1 << 62
#: The OOM backoff doubles at most this many times (a factor of 1024), however long the streak:
#: past that the node ceiling binds anyway, and 2**k for a long streak overflows (rule S14).
MAX_BACKOFF_DOUBLINGS = 10

PHASE_UNKNOWN = 0
PHASE_LEARNING = 1
PHASE_CONFIDENT = 2

#: The quantiles of the six stats, in the order ``six_stats`` returns them after ``peak``.
QUANTILES = (0.99, 0.95, 0.75, 0.5)

DEFAULT_CPU_MILLICORES = 500  # rule S7
DEFAULT_MEMORY_BYTES = 4 * GIB  # rule S7
CPU_REQUEST_FLOOR = 10  # rule S10, millicores
MEMORY_REQUEST_FLOOR = 32 * MIB  # rule S10
CPU_LIMIT_STEP = 500  # rule S12, millicores
MEMORY_LIMIT_FLOOR_MIB = 128  # rule S12
LEARNING_FACTOR = 3  # rule S8


def _interpolate(lo: float, hi: float, frac: float) -> float:
    return lo + frac * (hi - lo)


def six_stats(
    samples: Sequence[float],
) -> tuple[float, float, float, float, float, float]:
    """Return ``(peak, p99, p95, p75, p50, avg)`` of the samples (rule I2).

    Percentiles interpolate linearly between closest ranks; ``avg`` sums in input order.
    """
    n = len(samples)
    if n == 0:
        raise ValueError("six_stats needs at least one sample")
    total = 0.0
    for v in samples:
        total += float(v)
    xs = sorted(float(v) for v in samples)
    out = [xs[-1]]
    for q in QUANTILES:
        h = (n - 1) * q
        f = math.floor(h)
        if f + 1 < n:
            out.append(_interpolate(xs[f], xs[f + 1], h - f))
        else:
            out.append(xs[f])
    out.append(total / n)
    return out[0], out[1], out[2], out[3], out[4], out[5]


def memory_buffer_percent(observed_bytes: int) -> int:
    """The memory staircase buffer of rule S9, in percent."""
    if observed_bytes < GIB:
        return 20
    if observed_bytes <= 4 * GIB:
        return 10
    return 5


def ceil_tolerant(x: float) -> int:
    """Round up to an integer, but treat a value within 1e-9 relative of an integer as that integer.

    ``800 * 1.2`` is 960.0000000000001 in binary floating point; the exact value is 960 (rule S12).
    """
    r = math.floor(x + 0.5)
    if abs(x - r) <= 1e-9 * max(1.0, abs(x)):
        return r
    return math.ceil(x)


def cpu_limit_for(request_millicores: int) -> int:
    """Rule S12: round up to a multiple of 500m, at least 500m."""
    steps = -(-request_millicores // CPU_LIMIT_STEP)
    return max(CPU_LIMIT_STEP, steps * CPU_LIMIT_STEP)


def memory_limit_for(request_bytes: int) -> int:
    """Rule S12: the next power of two in MiB at or above the request, at least 128Mi."""
    mib = -(-request_bytes // MIB)
    pow2 = MEMORY_LIMIT_FLOOR_MIB
    while pow2 < mib:
        pow2 *= 2
    return pow2 * MIB


def size_container(
    phase: int,
    cpu_observed: float,
    memory_observed: int,
    pod_peak: int,
    buffer_pct: int,
    consecutive: int,
    streak_limit: int,
    ceiling: int,
    guaranteed: bool,
    backoff_ceiling: int = -1,
) -> tuple[int, int, int, int, bool]:
    """The per-container arithmetic of rules S7-S16, before overrides.

    ``cpu_observed`` is the highest peak (learning) or the highest chosen stat (confident), in
    millicores; ``memory_observed`` the highest memory peak in bytes; ``pod_peak`` the highest pod
    memory in bytes or -1 (rule S11); ``consecutive`` the OOM streak (S13) and ``streak_limit`` the
    limit reported by the streak's oldest run or -1 (S14); ``ceiling`` the node ceiling or -1 (S15);
    ``backoff_ceiling`` the most the backoff may raise a limit to when there is no node ceiling
    (-1: no such bound), never below the base it doubles.

    The backoff doubles at most ``MAX_BACKOFF_DOUBLINGS`` times. ``capped`` says the memory limit
    is below what S14 alone would give: the doublings were capped, the limit saturated, or a
    ceiling clipped it.

    Returns ``(cpu_request_m, cpu_limit_m, memory_request_bytes, memory_limit_bytes, capped)``.
    """
    if phase == PHASE_UNKNOWN:
        cpu_request = DEFAULT_CPU_MILLICORES
        cpu_limit = DEFAULT_CPU_MILLICORES
        memory_request = DEFAULT_MEMORY_BYTES
        memory_limit = DEFAULT_MEMORY_BYTES
    else:
        if phase == PHASE_LEARNING:
            cpu_exact = cpu_observed * LEARNING_FACTOR
            mem_hundredths = memory_observed * LEARNING_FACTOR * 100
        else:
            cpu_exact = cpu_observed * (100 + buffer_pct) / 100.0
            mem_hundredths = memory_observed * (100 + memory_buffer_percent(memory_observed))
        cpu_request = max(CPU_REQUEST_FLOOR, ceil_tolerant(cpu_exact))  # S10, S12
        mem_hundredths = max(mem_hundredths, MEMORY_REQUEST_FLOOR * 100)  # S10
        if phase == PHASE_CONFIDENT and pod_peak >= 0:  # S11
            mem_hundredths = min(mem_hundredths, pod_peak * (100 + memory_buffer_percent(pod_peak)))
        memory_request = -(-mem_hundredths // (100 * MIB)) * MIB  # S12: up to a whole MiB
        cpu_limit = cpu_limit_for(cpu_request)
        memory_limit = memory_limit_for(memory_request)
    capped = False
    if consecutive > 0:  # S14
        base = max(memory_limit, streak_limit)
        doublings = min(consecutive, MAX_BACKOFF_DOUBLINGS)
        capped = doublings < consecutive
        memory_limit = base
        for _ in range(doublings):
            if memory_limit > MAX_BYTES // 2:
                memory_limit = MAX_BYTES
                capped = True
                break
            memory_limit *= 2
        if ceiling < 0 and backoff_ceiling >= 0 and memory_limit > max(base, backoff_ceiling):
            memory_limit = max(base, backoff_ceiling)
            capped = True
    if 0 <= ceiling < memory_limit:  # S15
        memory_limit = ceiling
        capped = True
    if guaranteed:  # S16
        memory_request = memory_limit
    else:
        memory_request = min(memory_request, memory_limit)
    return cpu_request, cpu_limit, memory_request, memory_limit, capped


# --------------------------------------------------------------------------- stage composition
# Rules H2-H6 of ``shared/spec/stage.md``, for one resource at a time (CPU in millicores or memory
# in MiB: the two are computed independently). A stage arrives flattened in preorder: for each
# item its kind, its number of direct children (0 for steps) and, for steps, its limit (rule H1,
# resolved by the caller). The stage itself is an implicit sequence of the top-level items.

STEP = 0
BACKGROUND = 1
PARALLEL = 2
GROUP = 3
#: A looped step or group (rules H8-H10): its children are the copies, its value the maxConcurrency.
LOOP = 4
#: A step without a container (an approval, a shell script on the delegate; rule H11).
NON_CI = 5


def _loop_request(copies: list[int], plain: list[int], requests: list[int], concurrency: int) -> int:
    """Rule H9: the copies sorted by their request, largest first (equal ones the later copy first,
    as the source's comparator, which never answers "equal", leaves them), and the first
    ``min(concurrency, len(copies))`` of them added up."""
    ranked = sorted(copies, key=lambda c: (plain[c], c), reverse=True)
    return sum(requests[c] for c in ranked[:concurrency])


def compose_stage(
    kinds: Sequence[int],
    counts: Sequence[int],
    values: Sequence[int],
    addon: int,
    step_request: int,
    conservative: bool,
    init: int = 0,
    harness: bool = False,
    no_extra: bool = False,
) -> tuple[list[int], list[int], int, int, int, int, int]:
    """Requests and final limits of every item of a stage, and the stage's totals.

    Returns ``(requests, limits, stage, container, with_background, pod_request, pod_limit)``:
    per item its request (H2: a step its limit, a background or non-CI step 0, a parallel block the
    sum of its children, a group their max; H9: a loop the top ``min(maxConcurrency, n)`` of its
    copies) and its final limit (H5/H10: for a step the limit handed back to it, for a background
    step its own value, for a non-CI step 0, for a block the room it hands down); ``stage`` the max
    over the top-level items; ``container`` the stage container's request = limit (H3);
    ``with_background`` the container plus every background container (H4); ``pod_request`` the
    pod's scheduling request and ``pod_limit`` its sum of limits (H6), each at least ``init``, the
    largest init container (H13).

    ``harness`` counts the members of a parallel block as the source does (H10: a block or group
    counts when it holds a step that is not a background step); ``no_extra`` hands nothing back
    (H12: every step's limit is its own).

    Raises ``ValueError`` when the arrays do not describe a tree.
    """
    n = len(kinds)
    if len(counts) != n or len(values) != n:
        raise ValueError("kinds, counts and values differ in length")
    requests = [0] * n
    plain = [0] * n  # H10: the request of each copy standing alone; a loop: its largest copy
    psum = [0] * n  # as ``plain``, but a loop: the sum of its copies (what a parallel block adds up)
    eligible = [False] * n  # H10 (harness): holds a step that is not a background step
    sections = [0] * n  # how many members of a parallel block this item is and counts as (H5/H10)
    foreground = [0] * n  # a parallel block: its counted members
    done: list[int] = []  # roots of finished subtrees, the first child on top
    for i in range(n - 1, -1, -1):
        kind, count = kinds[i], counts[i]
        if kind in (STEP, BACKGROUND, NON_CI):
            if count != 0 or values[i] < 0:
                raise ValueError(f"item {i}: a step has no children and a non-negative value")
            requests[i] = plain[i] = psum[i] = values[i] if kind == STEP else 0
            eligible[i] = kind != BACKGROUND
        elif kind in (PARALLEL, GROUP, LOOP):
            if count < 1 or count > len(done):
                raise ValueError(f"item {i}: a block needs 1 to {len(done)} children, not {count}")
            children = [done.pop() for _ in range(count)]
            if kind == LOOP:
                if values[i] < 1:
                    raise ValueError(f"item {i}: a loop runs at least 1 copy at once, not {values[i]}")
                if any(kinds[c] not in (STEP, BACKGROUND, NON_CI, GROUP) for c in children):
                    raise ValueError(f"item {i}: a loop copies steps or groups only")
                requests[i] = _loop_request(children, plain, requests, values[i])
                plain[i] = max(plain[c] for c in children)
                psum[i] = sum(plain[c] for c in children)
                sections[i] = sum(sections[c] for c in children)
            elif kind == PARALLEL:
                requests[i] = sum(requests[c] for c in children)
                plain[i] = psum[i] = sum(psum[c] for c in children)
                foreground[i] = sum(sections[c] for c in children)
            else:
                requests[i] = max(requests[c] for c in children)
                plain[i] = psum[i] = max(plain[c] for c in children)
            eligible[i] = any(eligible[c] for c in children)
        else:
            raise ValueError(f"item {i}: unknown kind {kind}")
        if kind != LOOP:
            sections[i] = int(eligible[i]) if harness else int(kind != BACKGROUND)
        done.append(i)
    stage = max((requests[i] for i in done), default=0)
    limits = [0] * n
    share = [0] * n  # a parallel block: what it hands each counted member
    # preorder walk: the open blocks and how many of their children are still to come
    open_blocks: list[int] = []
    left: list[int] = []
    for i in range(n):
        parent = open_blocks[-1] if open_blocks else -1
        copy = parent >= 0 and kinds[parent] == LOOP
        context = open_blocks[-2] if copy and len(open_blocks) > 1 else (-1 if copy else parent)
        in_parallel = context >= 0 and kinds[context] == PARALLEL
        room = stage if context < 0 else limits[context]  # the room of the enclosing sequence
        kind = kinds[i]
        if kind == BACKGROUND:
            limits[i] = values[i]
        elif kind == NON_CI:
            limits[i] = 0
        elif kind == STEP:
            if no_extra or copy:
                limits[i] = values[i]
            elif in_parallel:
                limits[i] = values[i] + share[context]
            else:
                limits[i] = values[i] + max(0, room - values[i])
        elif kind == LOOP:
            limits[i] = share[context] if in_parallel else room
        else:  # a group or a parallel block: the room it hands down
            limits[i] = psum[i] + share[context] if in_parallel else room
            if kind == PARALLEL and foreground[i] > 0:
                share[i] = max(0, limits[i] - psum[i]) // foreground[i]
        if parent >= 0:
            left[-1] -= 1
        if counts[i] > 0:
            open_blocks.append(i)
            left.append(counts[i])
        while left and left[-1] == 0:
            open_blocks.pop()
            left.pop()
    container = addon if conservative else stage + addon
    background = sum(values[i] for i in range(n) if kinds[i] == BACKGROUND)
    steps = [i for i in range(n) if kinds[i] == STEP]
    pod_request = max(init, container + step_request * len(steps) + background)
    pod_limit = max(init, container + sum(limits[i] for i in steps) + background)
    return requests, limits, stage, container, container + background, pod_request, pod_limit


# --------------------------------------------------------------------------- node scoring
# Rules P7-P10 and PK1-PK6 of ``docs/placement.md``: Kubernetes scoring of every node for one pod.
# Pods already on the nodes arrive as parallel arrays (one entry per pod, ``pod_node`` its node's
# index); CPU in millicores, memory in bytes. A pod's ``req`` is its request as the Kubernetes
# fit filter counts it, ``nz`` the non-zero request NodeResourcesFit scores with (a container
# without a request counts 100m/200Mi), ``lim`` the sum of its containers' limits and ``miss`` how
# many of its containers have no limit (each counts as a default: the node's allocatable unless
# the scorer names a value). Extended resources (``example.com/gpu``) arrive as ``E`` more columns:
# ``ext_alloc`` n*E node allocatable, ``ext_req`` p*E requests of the pods already placed, and the
# new pod's E requests after its first 8 values.

LEAST_ALLOCATED = 0
MOST_ALLOCATED = 1
LIMIT_AWARE = 2
SMALLEST_NODE = 3
LARGEST_NODE = 4
REQUESTED_TO_CAPACITY_RATIO = 5
BALANCED_ALLOCATION = 6  # Kubernetes <= 1.35: the balance with the pod (PK3)
BALANCED_ALLOCATION_CHANGE = 7  # Kubernetes >= 1.36 (PR 135573): the change in balance (PK4)
MAX_NODE_SCORE = 100


def _fit_score(kind: int, requested: int, capacity: int) -> int:
    if capacity <= 0:
        return 0
    if kind == LEAST_ALLOCATED:
        return 0 if requested > capacity else (capacity - requested) * MAX_NODE_SCORE // capacity
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def _trunc_div(a: int, b: int) -> int:
    """Go's integer division: truncates toward zero (Python's ``//`` floors)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _shape_score(shape: Sequence[int], p: int) -> int:
    """``helper.BuildBrokenLinearFunction`` over the flat ``(u0, s0, u1, s1, ...)`` points (PK1)."""
    k = len(shape) // 2
    for i in range(k):
        if p <= shape[2 * i]:
            if i == 0:
                return shape[1]
            u0, s0, u1, s1 = shape[2 * i - 2], shape[2 * i - 1], shape[2 * i], shape[2 * i + 1]
            return s0 + _trunc_div((s1 - s0) * (p - u0), u1 - u0)
    return shape[2 * k - 1] if k else 0


def _balance(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """``balancedResourceScorer`` of Kubernetes <= 1.35: ``int((1 - std) * 100)`` over the
    fractions ``min(requested / allocatable, 1)`` of the resources with allocatable > 0 (PK3)."""
    fractions: list[float] = []
    total = 0.0
    for req, cap in zip(requested, allocatable, strict=True):
        if cap == 0:
            continue
        fraction = float(req) / float(cap)
        if fraction > 1:
            fraction = 1.0
        total += fraction
        fractions.append(fraction)
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = total / len(fractions)
        acc = 0.0
        for f in fractions:
            acc = acc + (f - mean) * (f - mean)
        std = math.sqrt(acc / len(fractions))
    return int((1 - std) * float(MAX_NODE_SCORE))


def _resource_score(
    kind: int,
    requested: Sequence[int],
    allocated: Sequence[int],
    allocatable: Sequence[int],
    weights: Sequence[int],
    shape: Sequence[int],
) -> int:
    """One node's score by a ``resourceAllocationScorer`` (PK1-PK5): ``allocatable`` is 0 for a
    resource the scorer skips (not listed, allocatable 0, or an extended resource the pod does not
    request), ``requested`` includes the pod, ``allocated`` does not."""
    if kind == BALANCED_ALLOCATION:
        return _balance(requested, allocatable)
    if kind == BALANCED_ALLOCATION_CHANGE:
        with_pod = _balance(requested, allocatable)
        without = _balance(allocated, allocatable)
        return MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2
    acc = wsum = 0
    for req, cap, w in zip(requested, allocatable, weights, strict=True):
        if cap == 0:
            continue
        if kind == REQUESTED_TO_CAPACITY_RATIO:
            value = _shape_score(shape, 100 if req >= cap else (req * 100 // cap if req > 0 else 0))
            if value <= 0:
                continue
        else:
            value = _fit_score(kind, req, cap)
        acc += value * w
        wsum += w
    if wsum == 0:
        return 0
    if kind == REQUESTED_TO_CAPACITY_RATIO:
        return (2 * acc + wsum) // (2 * wsum)  # math.Round of the mean, all terms >= 0
    return acc // wsum


def score_nodes(
    alloc_cpu: Sequence[int],
    alloc_mem: Sequence[int],
    pod_node: Sequence[int],
    req_cpu: Sequence[int],
    req_mem: Sequence[int],
    nz_cpu: Sequence[int],
    nz_mem: Sequence[int],
    lim_cpu: Sequence[int],
    lim_mem: Sequence[int],
    miss_cpu: Sequence[int],
    miss_mem: Sequence[int],
    pod: Sequence[int],
    scorers: Sequence[Sequence[Any]],
    ext_alloc: Sequence[int] = (),
    ext_req: Sequence[int] = (),
) -> tuple[list[bool], list[list[float]], list[list[int]], list[int]]:
    """Fit and score every node for a pod.

    ``pod`` is the new pod's ``(req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu,
    miss_mem, ext_0 .. ext_E-1)``, its limit already ``max(sum of containers, largest init
    container) + overhead``. ``scorers`` are ``(kind, weight, cpu_weight, memory_weight,
    missing_cpu, missing_memory)``, optionally followed by the E extended-resource weights and the
    flat shape ``(u0, s0, u1, s1, ...)`` (scores 0..100) of ``requested-to-capacity-ratio``; a
    missing default < 0 means the node's allocatable; a resource weight <= 0 means the resource
    is not scored.

    Returns ``(fits, raw, scores, totals)``: per node whether the pod's requests fit (P10's
    filter); per scorer the raw value and the 0..100 score of every node (0 for nodes that do not
    fit, which take no part in the min-max normalisation of P8/P9); and per node the weighted total.
    """
    n = len(alloc_cpu)
    if len(alloc_mem) != n:
        raise ValueError("alloc_cpu and alloc_mem differ in length")
    p = len(pod_node)
    for column in (req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem):
        if len(column) != p:
            raise ValueError("the pod columns differ in length")
    e = len(pod) - 8
    if e < 0 or len(ext_alloc) != n * e or len(ext_req) != p * e:
        raise ValueError("the extended-resource columns differ in length")
    used_req = [[0] * n, [0] * n]
    used_nz = [[0] * n, [0] * n]
    used_lim = [[0] * n, [0] * n]
    used_miss = [[0] * n, [0] * n]
    used_ext = [0] * (n * e)
    for i in range(p):
        node = pod_node[i]
        if not 0 <= node < n:
            raise ValueError(f"pod {i}: node index {node} out of range")
        used_req[0][node] += req_cpu[i]
        used_req[1][node] += req_mem[i]
        used_nz[0][node] += nz_cpu[i]
        used_nz[1][node] += nz_mem[i]
        used_lim[0][node] += lim_cpu[i]
        used_lim[1][node] += lim_mem[i]
        used_miss[0][node] += miss_cpu[i]
        used_miss[1][node] += miss_mem[i]
        for x in range(e):
            used_ext[node * e + x] += ext_req[i * e + x]
    alloc = (alloc_cpu, alloc_mem)
    pod_ext = [pod[8 + x] for x in range(e)]
    fits = [
        all(used_req[r][j] + pod[r] <= alloc[r][j] for r in (0, 1))
        and all(pod_ext[x] <= 0 or used_ext[j * e + x] + pod_ext[x] <= ext_alloc[j * e + x] for x in range(e))
        for j in range(n)
    ]
    raws: list[list[float]] = []
    scores: list[list[int]] = []
    totals = [0] * n
    for spec in scorers:
        kind, weight, w_cpu, w_mem, missing_cpu, missing_mem = (int(v) for v in spec[:6])
        ext_weights = [int(v) for v in spec[6]] if len(spec) > 6 else [0] * e
        shape = [int(v) for v in spec[7]] if len(spec) > 7 else []
        if len(ext_weights) != e:
            raise ValueError("a scorer's extended-resource weights differ in length from the pod's")
        weights = (w_cpu, w_mem)
        missing = (missing_cpu, missing_mem)
        raw = [0.0] * n
        score = [0] * n
        if kind in (LEAST_ALLOCATED, MOST_ALLOCATED, REQUESTED_TO_CAPACITY_RATIO):
            if kind == REQUESTED_TO_CAPACITY_RATIO and not shape:
                raise ValueError("requested-to-capacity-ratio needs a shape")
            all_weights = [*weights, *ext_weights]
            for j in range(n):
                if not fits[j]:
                    continue
                requested = [used_nz[0][j] + pod[2], used_nz[1][j] + pod[3]]
                requested += [used_ext[j * e + x] + pod_ext[x] for x in range(e)]
                caps = [alloc[0][j], alloc[1][j], *(ext_alloc[j * e + x] for x in range(e))]
                caps = [0 if all_weights[r] <= 0 or (r >= 2 and pod_ext[r - 2] == 0) else caps[r] for r in range(2 + e)]
                score[j] = _resource_score(kind, requested, requested, caps, all_weights, shape)
                raw[j] = float(score[j])
        elif kind in (BALANCED_ALLOCATION, BALANCED_ALLOCATION_CHANGE):
            listed = [w > 0 for w in (*weights, *ext_weights)]
            pod_req = [pod[0], pod[1], *pod_ext]
            if any(listed[r] and pod_req[r] != 0 for r in range(2 + e)):  # a best-effort pod is skipped
                for j in range(n):
                    if not fits[j]:
                        continue
                    allocated = [used_req[0][j], used_req[1][j], *(used_ext[j * e + x] for x in range(e))]
                    requested = [allocated[r] + pod_req[r] for r in range(2 + e)]
                    caps = [alloc[0][j], alloc[1][j], *(ext_alloc[j * e + x] for x in range(e))]
                    caps = [0 if not listed[r] or (r >= 2 and pod_req[r] == 0) else caps[r] for r in range(2 + e)]
                    score[j] = _resource_score(kind, requested, allocated, caps, [1] * (2 + e), shape)
                    raw[j] = float(score[j])
        elif kind == LIMIT_AWARE or kind == SMALLEST_NODE or kind == LARGEST_NODE:
            for j in range(n):
                if not fits[j]:
                    continue
                value = 0.0
                for r in (0, 1):
                    if weights[r] <= 0:
                        continue
                    cap = alloc[r][j]
                    if kind == LIMIT_AWARE:
                        default = cap if missing[r] < 0 else missing[r]
                        limit = used_lim[r][j] + pod[4 + r] + (used_miss[r][j] + pod[6 + r]) * default
                        value += weights[r] * ((cap - limit) * 100.0 / cap if cap > 0 else 0.0)
                    elif kind == SMALLEST_NODE:
                        value -= weights[r] * float(cap)
                    else:
                        value += weights[r] * float(cap)
                raw[j] = value
            feasible = [raw[j] for j in range(n) if fits[j]]
            if feasible:
                low, high = min(feasible), max(feasible)
                if high > low:
                    for j in range(n):
                        if fits[j]:
                            score[j] = int((raw[j] - low) * MAX_NODE_SCORE / (high - low))
        else:
            raise ValueError(f"unknown scorer kind {kind}")
        for j in range(n):
            totals[j] += weight * score[j]
        raws.append(raw)
        scores.append(score)
    return fits, raws, scores, totals


# --------------------------------------------------------------------------- the policy, per run
# One home for the sizing policy: ``size_run`` sizes one container for run ``i`` of its job from
# the runs before it, given as per-run columns oldest first (``i == n`` sizes the next run). The
# live answer calls it with ``i == n``; the backtest walk calls it before every run.

POLICY_CI_SIZER = 0  # rules S4-S16 with the given parameters, then the pins
POLICY_FIXED = 1  # 500m / 4Gi, request = limit
POLICY_KRR = 2  # approximation: CPU request p95 of the window's p95s, no CPU limit; memory max + 15%
POLICY_VPA = 3  # approximation: p90 of the window's peaks + 15% for CPU and memory, limit = request
POLICY_RECORDED = 4  # the memory limit each run reported (request = limit); no CPU figures
POLICY_EFFICIENT = 5  # rules E1-E13 (docs/sizing.md), then the pins
POLICY_GROWTH = 6  # rule G8: E1-E13 with the memory limit at a typical peak (growth covers the rest), then the pins

#: ``clean`` column: the run is clean (rule S2); OOM-suspect only by S1's 95 % clause (no container
#: was killed); otherwise (a container was killed or reported OOM). Booleans read as CLEAN / KILLED.
RUN_KILLED = 0
RUN_CLEAN = 1
RUN_NEAR_LIMIT = 2
#: ``oom`` column, per container: not suspect; OOM-suspect by S1's 95 % clause only; killed
#: (``oom_killed``, ``oom_kill_events > 0``, or a peak above the limit).
OOM_NONE = 0
OOM_NEAR_LIMIT = 1
OOM_KILLED = 2

#: rule E3: the confident margin over the highest peak, in percent (over E2's 30 samples: the longer the
#: window, the tighter its highest bounds the next peak, and the less margin is needed above it; docs/sizing.md)
EFFICIENT_MARGIN_PCT = 3
EFFICIENT_LEARNING_MARGIN_PCT = 20
#: rule E3: the margin with a single sample, when nothing is known of how the job's peaks vary
EFFICIENT_FIRST_SAMPLE_MARGIN_PCT = 50
#: rule E13: E3's learning margin holds until a container has this many analysed samples. With 3-6 samples, 3 %
#: over the highest leaves the next peak above the limit in 7-12 % of the traces' jobs, no less than the learning
#: phase's own risk (6.7 % at 20 % with two samples); with 7, 3.5 % (docs/sizing.md)
EFFICIENT_STEADY_SAMPLES = 7
#: rule E11: a confident job whose runs reserve little (its memory need x its runs' mean duration, in MiB-seconds)
#: gets E3's learning margin below EFFICIENT_CHEAP_MIB_SECONDS, and its first-sample margin below
#: EFFICIENT_CHEAPEST_MIB_SECONDS: where the headroom costs less than the kills it saves, a kill priced at the
#: traces' mean run reservation (66 GiB-s), the kills saved from the traces' confident jumps (docs/sizing.md)
EFFICIENT_CHEAP_MIB_SECONDS = 2466
EFFICIENT_CHEAPEST_MIB_SECONDS = 192
#: rule E12: the CPU request leaves out the window's highest chosen stats while the runs they come from make up
#: less than this share of the window's run time, in percent (the default p95's own 5 %: the share of a run's
#: time the chosen stat leaves above the request, applied across the window's runs by their durations)
EFFICIENT_CPU_TIME_PCT = 5
#: rule G8: the growth policy's confident memory need is this quantile of the analysed peaks, in quarters (p75)
GROWTH_QUANTILE_QUARTERS = 3
#: rule E2: the efficient policy analyses at least this many samples, whatever ``runs`` says (the next of
#: exchangeable peaks exceeds the highest of n with chance 1/(n+1): 3.2 % with 30)
EFFICIENT_MIN_WINDOW = 30
#: rule E6: the first-run prior is used once this many of the org's jobs have a sample (one job's
#: peak is too little to go on: jobs differ more from each other than a job's runs do)
PRIOR_MIN_JOBS = 2
#: rule E6: the prior's margin over the org's highest peak while two of its jobs have a sample (1.5x);
#: from three on E3's confident margin
PRIOR_TWO_JOBS_MARGIN_PCT = 50

SIZED_FIELDS = (
    "phase",
    "cpu_request",
    "cpu_limit",
    "memory_request",
    "memory_limit",
    "cpu_request_source",
    "cpu_limit_source",
    "memory_request_source",
    "memory_limit_source",
    "cpu_observed",
    "memory_observed",
    "consecutive",
    "backoff_factor",
    "capped",
)


class Sized(NamedTuple):
    """One container's recommendation for one run (``size_run``).

    ``phase`` is PHASE_* (S4; the efficient policy counts its samples, E1), or -1 when the
    container has no recommendation (it is in none of the analysed runs): then every value is -1.
    Values are millicores and bytes, -1 where a policy sets none (KRR-like: no CPU limit). Sources
    are O3 ranks: 0 the algorithm, 1 org, 2 repo, 3 workflow, 4 job. ``cpu_observed`` (-1.0) and
    ``memory_observed`` (-1) are "none" outside the learning and confident phases.
    """

    phase: int
    cpu_request: int
    cpu_limit: int
    memory_request: int
    memory_limit: int
    cpu_request_source: int
    cpu_limit_source: int
    memory_request_source: int
    memory_limit_source: int
    cpu_observed: float
    memory_observed: int
    consecutive: int
    backoff_factor: int
    capped: bool


_NONE = Sized(-1, -1, -1, -1, -1, 0, 0, 0, 0, -1.0, -1, 0, 1, False)


def _window_quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    h = (len(xs) - 1) * q
    lo = int(h)
    return xs[lo] if lo + 1 >= len(xs) else _interpolate(xs[lo], xs[lo + 1], h - lo)


def _resolve(values: list[int], pins: Sequence[int], guaranteed: bool) -> list[int]:
    """Rules O2-O3 on ``values`` (cpu request, cpu limit, memory request, memory limit) in place;
    returns the four source ranks."""
    ranks = [0, 0, 0, 0]
    for f in range(4):
        if pins[4 + f] > 0:
            values[f] = pins[f]
            ranks[f] = pins[4 + f]
    for req, lim in ((0, 1), (2, 3)):  # a request above its limit: the more specific source wins
        if values[req] > values[lim]:
            if ranks[req] > ranks[lim]:
                values[lim], ranks[lim] = values[req], ranks[req]
            else:
                values[req], ranks[req] = values[lim], ranks[lim]
    if guaranteed and ranks[2] == 0:
        values[2] = values[3]  # O3: an unpinned request follows the final limit
    return ranks


def _backoff(limit: int, k: int, streak_limit: int, ceiling: int, backoff_ceiling: int, floor: int) -> tuple[int, bool]:
    """Rule S14 (and E5's floor): ``max(limit, streak_limit, floor)`` doubled k times, at most
    MAX_BACKOFF_DOUBLINGS, saturating, bounded by ``backoff_ceiling`` when there is no node ceiling."""
    base = max(limit, streak_limit)
    doublings = min(k, MAX_BACKOFF_DOUBLINGS)
    capped = doublings < k
    out = base
    for _ in range(doublings):
        if out > MAX_BYTES // 2:
            out = MAX_BYTES
            capped = True
            break
        out *= 2
    out = max(out, floor)
    if ceiling < 0 and backoff_ceiling >= 0 and out > max(base, backoff_ceiling):
        out = max(base, backoff_ceiling)
        capped = True
    return out, capped


def _with_margin(peak: int, margin_pct: int) -> int:
    """Rules E3 and E8: ``peak`` plus ``margin_pct`` percent, up to a whole MiB, at least 32Mi."""
    return max(MEMORY_REQUEST_FLOOR, -(-peak * (100 + margin_pct) // (100 * MIB)) * MIB)


def _efficient(
    analysed: list[int],
    present: Sequence[int],
    cpu_stat: Sequence[float],
    mem_peak: Sequence[int],
    pod_peak: Sequence[int],
    samples: int,
    k: int,
    streak_limit: int,
    ceiling: int,
    buffer_pct: int,
    guaranteed: bool,
    backoff_ceiling: int,
    prior: int,
    growth: bool = False,
    killed: int = -1,
    seconds: Sequence[float] | None = None,
) -> tuple[int, int, int, int, float, int, bool]:
    """Rules E3-E13 for one container: ``(cpu_req, cpu_lim, mem_req, mem_lim, cpu_observed,
    mem_observed, capped)``; ``analysed`` the window's samples (E2), the container present in each.
    ``growth``: rule G8, the confident memory need at the analysed peaks' p75 instead of their highest (and no E13,
    which is about the highest bounding the next peak).
    ``killed``: rule E10, the highest limit a run of the window was killed at (-1: none), read when no
    kill streak is running (``k == 0``). ``seconds``: rule E11, each run's duration (negative: unknown)."""
    if samples == 0:
        cpu_request = cpu_limit = DEFAULT_CPU_MILLICORES  # E7: CPU as S7
        limit = DEFAULT_MEMORY_BYTES if prior < 0 else prior  # E6
        request = limit
        cpu_observed, mem_observed = -1.0, -1
    else:
        cpu_observed = max(cpu_stat[j] for j in analysed)
        mem_observed = max(mem_peak[j] for j in analysed)
        cpu_held = _cpu_by_time(analysed, cpu_stat, seconds, cpu_observed)  # E12
        cpu_request = max(CPU_REQUEST_FLOOR, ceil_tolerant(cpu_held))  # E7: no buffer on the request
        cpu_limit = cpu_limit_for(ceil_tolerant(cpu_observed * (100 + buffer_pct) / 100.0))  # E7, from the highest
        need = _quarter_quantile([mem_peak[j] for j in analysed]) if growth and samples > 2 else mem_observed  # G8
        pod = max(pod_peak[j] for j in analysed)
        if pod < need:
            need = pod  # E4: never above the pod's own peak
        if k == 0 and killed > need:
            need = killed  # E10: a run killed at a limit needed more than it; E5 speaks while the streak runs
        request = max(MEMORY_REQUEST_FLOOR, -(-need // MIB) * MIB)  # E8: a whole MiB, >= 32Mi
        if samples == 1:
            margin = EFFICIENT_FIRST_SAMPLE_MARGIN_PCT
        else:
            margin = EFFICIENT_LEARNING_MARGIN_PCT if samples == 2 else EFFICIENT_MARGIN_PCT
            if samples > 2 and not growth and len(analysed) < EFFICIENT_STEADY_SAMPLES:
                margin = EFFICIENT_LEARNING_MARGIN_PCT  # E13: too few samples for 3 % to bound the next peak
            if samples > 2 and k == 0 and seconds is not None:
                margin = _cheap_margin(need, analysed, seconds, margin)  # E11
        limit = _with_margin(need, margin)  # E3, E8
    capped = False
    if k > 0:  # E5: S14's doubling, the first-run prior's kill included; two kills in a row get at least the default
        floor = DEFAULT_MEMORY_BYTES if k >= 2 else 0
        limit, capped = _backoff(limit, k, streak_limit, ceiling, backoff_ceiling, floor)
    if 0 <= ceiling < limit:  # S15
        limit = ceiling
        capped = True
    request = limit if guaranteed else min(request, limit)  # E9: S16 as the seed
    return cpu_request, cpu_limit, request, limit, cpu_observed, mem_observed, capped


def _cpu_by_time(
    analysed: list[int], cpu_stat: Sequence[float], seconds: Sequence[float] | None, highest: float
) -> float:
    """Rule E12: the CPU stat the request holds. A request is held for a run's whole duration, so the window's
    runs are weighed by their durations: the highest chosen stat once the runs with the highest stats are left
    out, highest first (ties: newest first), while together they make up less than EFFICIENT_CPU_TIME_PCT % of
    the window's run time. ``highest`` (E7's) when a run's duration is unknown."""
    if seconds is None:
        return highest
    total = 0.0
    for j in analysed:
        if seconds[j] < 0.0:
            return highest
        total += seconds[j]
    left = 0.0
    for j in sorted(analysed, key=lambda j: (-cpu_stat[j], -j)):
        if (left + seconds[j]) * 100.0 < EFFICIENT_CPU_TIME_PCT * total:
            left += seconds[j]
            continue
        return cpu_stat[j]
    return highest


def _cheap_margin(need: int, analysed: list[int], seconds: Sequence[float], margin: int) -> int:
    """Rule E11: the confident margin of a job whose runs reserve little. Its reservation is ``need`` x the
    mean duration of the analysed runs that report one (none: ``margin``, E3's), compared in MiB-seconds."""
    total = 0.0
    known = 0
    for j in analysed:
        if seconds[j] >= 0.0:
            total += seconds[j]
            known += 1
    if known == 0:
        return margin
    cost = float(need) * total  # need x mean duration x known, in byte-seconds
    if cost < float(EFFICIENT_CHEAPEST_MIB_SECONDS * MIB * known):
        return EFFICIENT_FIRST_SAMPLE_MARGIN_PCT
    if cost < float(EFFICIENT_CHEAP_MIB_SECONDS * MIB * known):
        return EFFICIENT_LEARNING_MARGIN_PCT
    return margin


def _quarter_quantile(values: list[int]) -> int:
    """Rule G8: the GROWTH_QUANTILE_QUARTERS/4 quantile of ``values`` with I2's interpolation, in
    integers (rounded up to a whole byte), so both cores agree to the byte."""
    xs = sorted(values)
    h4 = (len(xs) - 1) * GROWTH_QUANTILE_QUARTERS  # four times I2's h
    lo = h4 // 4
    if lo + 1 >= len(xs):
        return xs[lo]
    return xs[lo] + -(-(h4 - 4 * lo) * (xs[lo + 1] - xs[lo]) // 4)


def _newest_samples(i: int, clean: Sequence[int], efficient: bool, runs: int) -> tuple[list[int], int]:
    """The newest ``runs`` samples before run ``i`` (efficient: at least EFFICIENT_MIN_WINDOW, E2),
    newest first, and how many samples there are, counted up to 3 (enough for the phase, S4).
    A sample is a clean run (S2, S5); for the efficient policy a run without a kill (E1)."""
    window = max(runs, EFFICIENT_MIN_WINDOW) if efficient else runs
    newest: list[int] = []
    samples = 0
    j = i - 1
    while j >= 0 and (len(newest) < window or samples < 3):
        if clean[j] == RUN_CLEAN or (efficient and clean[j] == RUN_NEAR_LIMIT):
            if len(newest) < window:
                newest.append(j)
            samples += 1
        j -= 1
    return newest, samples


def analysed_runs(i: int, clean: Sequence[int], policy: int, runs: int) -> list[int]:
    """The runs before run ``i`` that a policy sizes from, newest first (S5; E1-E2): a caller
    lists the containers of these runs in the answer (S6) in their order."""
    if not 0 <= i <= len(clean):
        raise ValueError(f"run index {i} outside 0..{len(clean)}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    return _newest_samples(i, clean, policy in (POLICY_EFFICIENT, POLICY_GROWTH), runs)[0]


def size_run(
    i: int,
    clean: Sequence[int],
    present: Sequence[int],
    cpu_stat: Sequence[float],
    cpu_peak: Sequence[float],
    cpu_p95: Sequence[float],
    mem_peak: Sequence[int],
    mem_limit: Sequence[int],
    oom: Sequence[int],
    pod_peak: Sequence[int],
    ceiling: int,
    policy: int,
    runs: int,
    buffer_pct: int,
    guaranteed: bool,
    pins: Sequence[int],
    backoff_ceiling: int = -1,
    prior: int = -1,
    seconds: Sequence[float] | None = None,
) -> Sized:
    """The recommendation for one container before run ``i`` (0 <= i <= n), from runs ``0..i-1``.

    Columns, one entry per run of the job, oldest first: ``clean`` (RUN_*: rule S2, with kills
    told apart from S1's 95 % clause), ``present`` (the container ran in it), ``cpu_stat`` (the
    chosen stat, S5), ``cpu_peak``, ``cpu_p95`` (millicores), ``mem_peak``, ``mem_limit`` (bytes,
    -1 unknown), ``oom`` (OOM_*), ``pod_peak`` (S11: the reported pod peak, else the sum of the
    containers' peaks). ``ceiling`` the node ceiling or -1 (S15); ``backoff_ceiling`` as
    ``size_container``; ``pins`` the overrides' ``(cpu_request, cpu_limit, memory_request,
    memory_limit)`` then each one's scope rank (1 org .. 4 job; 0 = not pinned); ``prior`` the
    org's first-run prior (``prior_read``) or -1, read by the efficient policy only; ``seconds`` each
    run's duration in seconds (negative: unknown; None: none known), read by the efficient policy (E11).
    """
    n = len(clean)
    for column in (present, cpu_stat, cpu_peak, cpu_p95, mem_peak, mem_limit, oom, pod_peak):
        if len(column) != n:
            raise ValueError("the columns differ in length")
    if seconds is not None and len(seconds) != n:
        raise ValueError("the columns differ in length")
    if not 0 <= i <= n:
        raise ValueError(f"run index {i} outside 0..{n}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if len(pins) != 8:
        raise ValueError("pins holds four values and four ranks")
    if policy == POLICY_RECORDED:
        if i == n or not present[i]:
            return _NONE
        return Sized(PHASE_UNKNOWN, -1, -1, mem_limit[i], mem_limit[i], 0, 0, 0, 0, -1.0, -1, 0, 1, False)
    if policy == POLICY_FIXED:
        d_cpu, d_mem = DEFAULT_CPU_MILLICORES, DEFAULT_MEMORY_BYTES
        return Sized(PHASE_UNKNOWN, d_cpu, d_cpu, d_mem, d_mem, 0, 0, 0, 0, -1.0, -1, 0, 1, False)
    if policy not in (POLICY_CI_SIZER, POLICY_KRR, POLICY_VPA, POLICY_EFFICIENT, POLICY_GROWTH):
        raise ValueError(f"unknown policy {policy}")
    efficient = policy in (POLICY_EFFICIENT, POLICY_GROWTH)  # G8: the growth policy is efficient's but for E3
    newest, samples = _newest_samples(i, clean, efficient, runs)
    phase = PHASE_UNKNOWN if samples == 0 else PHASE_LEARNING if samples <= 2 else PHASE_CONFIDENT
    analysed = [j for j in newest if present[j]]
    if policy == POLICY_KRR or policy == POLICY_VPA:
        if not analysed:
            d_cpu, d_mem = DEFAULT_CPU_MILLICORES, DEFAULT_MEMORY_BYTES
            return Sized(phase, d_cpu, d_cpu, d_mem, d_mem, 0, 0, 0, 0, -1.0, -1, 0, 1, False)
        if policy == POLICY_KRR:
            cpu = max(ceil_tolerant(_window_quantile([cpu_p95[j] for j in analysed], 0.95)), 1)
            mem = -(-max(mem_peak[j] for j in analysed) * 115 // 100)
            return Sized(phase, cpu, -1, mem, mem, 0, 0, 0, 0, -1.0, -1, 0, 1, False)
        cpu = max(ceil_tolerant(_window_quantile([cpu_peak[j] for j in analysed], 0.9) * 1.15), 1)
        mem = ceil_tolerant(_window_quantile([float(mem_peak[j]) for j in analysed], 0.9) * 1.15)
        return Sized(phase, cpu, cpu, mem, mem, 0, 0, 0, 0, -1.0, -1, 0, 1, False)
    if phase != PHASE_UNKNOWN and not analysed:
        return _NONE  # the container is in none of the analysed runs: no recommendation for it
    # S13 (E5): the streak of the container's OOM-suspect (efficient: killed) runs, newest first,
    # over the window: every run from the oldest analysed sample on, or every run when none
    start = newest[-1] if newest else 0
    k = 0
    streak_limit = -1
    for j in range(i - 1, start - 1, -1):
        if not present[j]:
            continue
        if oom[j] == OOM_NONE or (efficient and oom[j] != OOM_KILLED):
            break
        k += 1
        streak_limit = mem_limit[j]
    if efficient:
        killed = -1  # E10: the highest limit a run was killed at, over the same runs as the streak
        for j in range(start, i):
            if present[j] and oom[j] == OOM_KILLED:
                killed = max(killed, mem_limit[j], mem_peak[j])
        c_req, c_lim, m_req, m_lim, cpu_observed, mem_observed, capped = _efficient(
            analysed, present, cpu_stat, mem_peak, pod_peak, samples, k, streak_limit, ceiling, buffer_pct,
            guaranteed, backoff_ceiling, prior, policy == POLICY_GROWTH, killed, seconds,
        )  # fmt: skip
    else:
        if phase == PHASE_UNKNOWN:
            cpu_observed, mem_observed, pod = -1.0, -1, -1
        else:
            stat = cpu_peak if phase == PHASE_LEARNING else cpu_stat
            cpu_observed = max(stat[j] for j in analysed)
            mem_observed = max(mem_peak[j] for j in analysed)
            pod = max(pod_peak[j] for j in newest) if phase == PHASE_CONFIDENT else -1
        c_req, c_lim, m_req, m_lim, capped = size_container(
            phase, max(cpu_observed, 0.0), max(mem_observed, 0), pod, buffer_pct, k, streak_limit, ceiling,
            guaranteed, backoff_ceiling,
        )  # fmt: skip
    values = [c_req, c_lim, m_req, m_lim]
    ranks = _resolve(values, pins, guaranteed)
    return Sized(
        phase, values[0], values[1], values[2], values[3], ranks[0], ranks[1], ranks[2], ranks[3],
        cpu_observed, mem_observed, k, 1 << min(k, MAX_BACKOFF_DOUBLINGS), capped,
    )  # fmt: skip


# --------------------------------------------------------------------------- the first-run prior
# Rule E6: a fleet statistic per org, updated with every ingested run, so that a new job's first
# run is sized from what the org's jobs have needed so far, never from the future. The state is
# two integers, stored as they are: ``(jobs, peak)``, how many of the org's jobs have a sample (a
# run without a kill, E1) and the highest container memory peak among all those samples.

PRIOR_EMPTY = (0, -1)


def prior_update(state: Sequence[int], peak: int, first_sample: bool) -> tuple[int, int]:
    """The state after one ingested sample (a run without a kill, E1; killed runs leave the state
    as it is): ``peak`` the run's highest container memory peak, ``first_sample`` true when it is
    its job's first sample."""
    if len(state) != 2:
        raise ValueError("a prior state holds two integers")
    if peak < 0:
        raise ValueError("a memory peak is never negative")
    jobs, top = state[0], state[1]
    return jobs + (1 if first_sample else 0), max(top, peak)


def prior_read(state: Sequence[int]) -> int:
    """Rule E6: the memory limit for a new job's first run, or -1 (the unknown-phase default):
    the highest peak among the org's samples plus 50 % while two of its jobs have a sample, E3's
    3 % from three on, to a whole MiB, never above the default; none while fewer than
    PRIOR_MIN_JOBS (2) of its jobs have a sample."""
    if len(state) != 2:
        raise ValueError("a prior state holds two integers")
    jobs, top = state[0], state[1]
    if jobs < PRIOR_MIN_JOBS or top < 0:
        return -1
    margin = PRIOR_TWO_JOBS_MARGIN_PCT if jobs == 2 else EFFICIENT_MARGIN_PCT
    return min(DEFAULT_MEMORY_BYTES, _with_margin(top, margin))


# --------------------------------------------------------------------------- growth (issue 40)
# Rules G2-G5 of docs/sizing.md: how far, from when and by how much a running build's memory limit may
# be raised in place before the kernel kills it (the answer's ``grow`` block). The caller decides G1
# (a pinned memory value never grows) and gives G2's bound (the node ceiling, else the backoff bound,
# then the runner ceiling).

#: rule G3: the most a run may grow to is this many times the larger of its limit and the window's peak,
#: and at least the default a job never seen is given (S7's 4Gi, which E5 gives after two kills)
GROW_FACTOR = 2
#: rule G4: the threshold is just above the window's peak relative to the limit, within these percents
GROW_THRESHOLD_MIN = 90
GROW_THRESHOLD_MAX = 95
#: rule G5: each growth is at least this share of the limit (a quarter), and at least GROW_MIN_BYTES
GROW_STEP_DIVISOR = 4
GROW_MIN_BYTES = 64 * MIB
#: ``size_grow`` when the container must not grow (rule G1: its maximum would not exceed its limit)
NO_GROW = (-1, 0, 0)


def window_peak(
    i: int, clean: Sequence[int], present: Sequence[int], mem_peak: Sequence[int], policy: int, runs: int
) -> int:
    """Rule G3's P: the highest memory peak the container reported before run ``i`` over the runs S13's
    streak is counted over (from the oldest analysed sample on, every run: killed, near-limit and grown
    runs included; every run before ``i`` when there is no sample), or -1 when it reported none."""
    if not 0 <= i <= len(clean):
        raise ValueError(f"run index {i} outside 0..{len(clean)}")
    if len(present) != len(clean) or len(mem_peak) != len(clean):
        raise ValueError("the columns differ in length")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    newest = _newest_samples(i, clean, policy in (POLICY_EFFICIENT, POLICY_GROWTH), runs)[0]
    start = newest[-1] if newest else 0
    top = -1
    for j in range(start, i):
        if present[j] and mem_peak[j] > top:
            top = mem_peak[j]
    return top


def size_grow(limit: int, peak: int, bound: int) -> tuple[int, int, int]:
    """Rules G3-G5 for one container: ``(max_bytes, threshold_percent, step_bytes)``, or ``NO_GROW``.

    ``limit`` the answer's memory limit (bytes; -1: no recommendation), ``peak`` G3's P (``window_peak``;
    -1: none), ``bound`` G2's bound (-1: none).

    - G3: max = min(bound, max(GROW_FACTOR x max(limit, peak) up to a whole MiB, 4Gi)); no growth
      unless max > limit.
    - G4: threshold = floor(100 x peak / limit) + 1, within 90..95: a run that uses what the window's
      runs used does not grow, and the guard keeps at least 5 % of the limit to react in.
    - G5: step = max(limit / 4 up to a whole MiB, 64Mi), at most max - limit.
    """
    if limit <= 0:
        return NO_GROW
    top = limit if limit > peak else peak
    if top > MAX_BYTES // GROW_FACTOR:
        raw = MAX_BYTES
    else:
        raw = max(-(-top * GROW_FACTOR // MIB) * MIB, DEFAULT_MEMORY_BYTES)
    most = raw if bound < 0 or raw < bound else bound
    if most <= limit:
        return NO_GROW
    threshold = min(GROW_THRESHOLD_MAX, max(GROW_THRESHOLD_MIN, 100 * max(peak, 0) // limit + 1))
    step = max(-(-limit // (GROW_STEP_DIVISOR * MIB)) * MIB, GROW_MIN_BYTES)
    step = min(step, most - limit)
    return most, threshold, step


# --------------------------------------------------------------------------- backtest
# Walk one container's history in time order: before each run, the recommendation a policy would
# have made from the runs before it (``size_run``); then score it against what the run used.

BACKTEST_FIELDS = (
    "scored",
    "oom_risk",
    "cpu_scored",
    "throttled",
    "cpu_waste",
    "memory_waste",
    "cpu_request",
    "memory_request",
)


def backtest_walk(
    clean: Sequence[int],
    present: Sequence[int],
    cpu_stat: Sequence[float],
    cpu_peak: Sequence[float],
    cpu_p95: Sequence[float],
    cpu_avg: Sequence[float],
    mem_peak: Sequence[int],
    mem_limit: Sequence[int],
    oom: Sequence[int],
    pod_peak: Sequence[int],
    ceiling: Sequence[int],
    duration: Sequence[float],
    policy: int,
    runs: int,
    buffer_pct: int,
    guaranteed: bool,
    pins: Sequence[int],
    backoff_ceiling: int = -1,
    prior: Sequence[int] | None = None,
    seconds: Sequence[float] | None = None,
) -> tuple[int, int, int, int, float, float, float, float]:
    """Totals over the runs where the container is present, in ``BACKTEST_FIELDS`` order:
    runs scored; runs whose memory peak exceeded the limit, or reached it in an OOM-suspect run
    (OOM risk); runs with a CPU limit, and
    those whose p95 exceeded it (throttle exposure); waste ``max(0, request - use) x duration``
    (CPU: millicore-seconds against the mean use; memory: byte-seconds against the peak); and the
    requests x duration (millicore-seconds, byte-seconds), to put the waste in proportion.

    Each run's recommendation is ``size_run`` before it. ``ceiling`` is the node ceiling in force
    before each run, or -1; ``prior`` the org's first-run prior before each run (E6), or None; ``seconds``
    each run's duration as the live answer reads it (E11; negative: unknown), or None (``duration`` scores).
    """
    n = len(clean)
    columns = (present, cpu_stat, cpu_peak, cpu_p95, cpu_avg, mem_peak, mem_limit, oom, pod_peak, ceiling, duration)
    if any(len(c) != n for c in columns) or any(c is not None and len(c) != n for c in (prior, seconds)):
        raise ValueError("the columns differ in length")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    scored = oom_risk = cpu_scored = throttled = 0
    cpu_waste = mem_waste = cpu_req_total = mem_req_total = 0.0
    for i in range(n):
        if not present[i]:
            continue
        s = size_run(
            i, clean, present, cpu_stat, cpu_peak, cpu_p95, mem_peak, mem_limit, oom, pod_peak, ceiling[i],
            policy, runs, buffer_pct, guaranteed, pins, backoff_ceiling, -1 if prior is None else prior[i], seconds,
        )  # fmt: skip
        if s.memory_limit >= 0:
            scored += 1
            # an OOM-suspect run's true need was at least its peak: a limit at the peak is a risk too
            oom_risk += mem_peak[i] > s.memory_limit or (oom[i] != 0 and mem_peak[i] >= s.memory_limit)
            mem_waste += max(0, s.memory_request - mem_peak[i]) * duration[i]
            mem_req_total += s.memory_request * duration[i]
        if s.cpu_request >= 0:
            cpu_waste += max(0.0, s.cpu_request - cpu_avg[i]) * duration[i]
            cpu_req_total += s.cpu_request * duration[i]
        if s.cpu_limit >= 0:
            cpu_scored += 1
            throttled += cpu_p95[i] > s.cpu_limit
    return scored, oom_risk, cpu_scored, throttled, cpu_waste, mem_waste, cpu_req_total, mem_req_total
