# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled sizing maths: the same functions as ``_reference.py``, over C arrays.

``six_stats`` sums and takes the extremes in one pass, then finds the percentile ranks without
sorting: a histogram of value buckets tells which few buckets hold the wanted ranks, only their
samples are kept, and quickselect finds the ranks inside them. Small or non-finite inputs select
over a copy of everything instead (quickselect, with a sort fallback past a depth bound).
"""

from array import array

from libc.math cimport ceil, fabs, floor, isfinite, sqrt
from libc.stdlib cimport calloc, free, malloc, qsort
from libc.string cimport memset

cdef long long MIB = 1 << 20
cdef long long GIB = 1 << 30
cdef long long MAX_BYTES = (<long long>1) << 62
cdef int _MAX_BACKOFF_DOUBLINGS = 10
MAX_BACKOFF_DOUBLINGS = _MAX_BACKOFF_DOUBLINGS

PHASE_UNKNOWN = 0
PHASE_LEARNING = 1
PHASE_CONFIDENT = 2

cdef double[4] _QUANTILES = [0.99, 0.95, 0.75, 0.5]


cdef int _cmp_double(const void* a, const void* b) noexcept nogil:
    cdef double x = (<const double*>a)[0]
    cdef double y = (<const double*>b)[0]
    return (x > y) - (x < y)


cdef inline void _swap(double* x, Py_ssize_t i, Py_ssize_t j) noexcept nogil:
    cdef double t = x[i]
    x[i] = x[j]
    x[j] = t


cdef void _select(double* x, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t k) noexcept nogil:
    """Reorder x[lo..hi] so that x[k] is the element of rank k and everything left of it is <= it."""
    cdef Py_ssize_t i, j, mid
    cdef double pivot
    cdef int depth = 0
    cdef Py_ssize_t size = hi - lo + 1
    cdef int limit = 8
    while size > 1:
        size >>= 1
        limit += 2
    while hi > lo:
        if depth > limit:
            qsort(&x[lo], hi - lo + 1, sizeof(double), _cmp_double)
            return
        depth += 1
        mid = lo + (hi - lo) // 2
        # median of three into x[mid]
        if x[mid] < x[lo]:
            _swap(x, mid, lo)
        if x[hi] < x[lo]:
            _swap(x, hi, lo)
        if x[hi] < x[mid]:
            _swap(x, hi, mid)
        pivot = x[mid]
        i = lo
        j = hi
        while i <= j:
            while x[i] < pivot:
                i += 1
            while x[j] > pivot:
                j -= 1
            if i <= j:
                _swap(x, i, j)
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return


cdef inline Py_ssize_t _bucket(double v, double lo, double scale, Py_ssize_t nb) noexcept nogil:
    # rounding is monotonic, so v <= w gives _bucket(v) <= _bucket(w): buckets keep the order
    cdef double b = (v - lo) * scale
    if b >= nb:
        return nb - 1
    return <Py_ssize_t>b


cdef double _rank_by_select(double* x, Py_ssize_t n, Py_ssize_t k) noexcept nogil:
    _select(x, 0, n - 1, k)
    return x[k]


cdef int _quantiles_by_select(const double[::1] view, Py_ssize_t n, double* out) noexcept nogil:
    """The four quantiles by quickselect over a copy, narrowing from the highest quantile down."""
    cdef double* x = <double*>malloc(n * sizeof(double))
    if x == NULL:
        return -1
    cdef Py_ssize_t i, f, j
    cdef Py_ssize_t prev_k = n
    cdef double prev_next = 0.0
    cdef double h, lo_v, hi_v
    cdef int qi
    for i in range(n):
        x[i] = view[i]
    for qi in range(4):
        h = (n - 1) * _QUANTILES[qi]
        f = <Py_ssize_t>floor(h)
        if f == prev_k:
            lo_v = x[f]
            hi_v = prev_next
        else:
            _select(x, 0, prev_k - 1, f)
            lo_v = x[f]
            hi_v = lo_v
            if f + 1 < n:
                # the element of rank f+1 is the smallest right of f (up to prev_k)
                hi_v = x[f + 1]
                j = prev_k if prev_k < n else n - 1
                for i in range(f + 2, j + 1):
                    if x[i] < hi_v:
                        hi_v = x[i]
        if f + 1 < n:
            out[qi] = lo_v + (h - f) * (hi_v - lo_v)
        else:
            out[qi] = lo_v
        prev_k = f
        prev_next = hi_v
    free(x)
    return 0


cdef int _quantiles_by_buckets(
    const double[::1] view, Py_ssize_t n, double lo, double peak, double* out
) noexcept nogil:
    """The four quantiles by a bucket histogram: count samples into value buckets, keep only the
    samples of the (at most eight) buckets that hold a wanted rank, and select within those.
    Three passes over the samples and small selections; returns 1 when the value range cannot be
    bucketed (the caller then selects over everything)."""
    cdef Py_ssize_t nb = n // 4
    if nb > 16384:
        nb = 16384
    cdef double scale = nb / (peak - lo)
    if not isfinite(scale) or not isfinite(peak - lo):
        return 1
    cdef Py_ssize_t* start = <Py_ssize_t*>calloc(nb + 1, sizeof(Py_ssize_t))
    cdef signed char* slot = <signed char*>malloc(nb)
    cdef double* kept = NULL
    if start == NULL or slot == NULL:
        free(start)
        free(slot)
        return -1
    cdef Py_ssize_t i, b, f, r, lo_b, hi_b, mid, total_kept
    cdef Py_ssize_t[8] ranks
    cdef Py_ssize_t[8] rank_bucket
    cdef Py_ssize_t[8] slot_bucket
    cdef Py_ssize_t[8] slot_offset
    cdef Py_ssize_t[8] slot_fill
    cdef int qi, s, nslots = 0, nranks = 0
    cdef double h, v0, v1
    cdef double[8] values
    for i in range(n):
        start[_bucket(view[i], lo, scale, nb) + 1] += 1
    for b in range(nb):
        start[b + 1] += start[b]
    memset(slot, -1, nb)
    for qi in range(4):
        f = <Py_ssize_t>floor((n - 1) * _QUANTILES[qi])
        ranks[nranks] = f
        ranks[nranks + 1] = f + 1 if f + 1 < n else f
        nranks += 2
    total_kept = 0
    for r in range(nranks):
        # the bucket b with start[b] <= rank < start[b + 1]
        lo_b = 0
        hi_b = nb - 1
        while lo_b < hi_b:
            mid = (lo_b + hi_b + 1) // 2
            if start[mid] <= ranks[r]:
                lo_b = mid
            else:
                hi_b = mid - 1
        rank_bucket[r] = lo_b
        if slot[lo_b] < 0:
            slot[lo_b] = nslots
            slot_bucket[nslots] = lo_b
            slot_offset[nslots] = total_kept
            slot_fill[nslots] = total_kept
            total_kept += start[lo_b + 1] - start[lo_b]
            nslots += 1
    kept = <double*>malloc(total_kept * sizeof(double))
    if kept == NULL:
        free(start)
        free(slot)
        return -1
    for i in range(n):
        s = slot[_bucket(view[i], lo, scale, nb)]
        if s >= 0:
            kept[slot_fill[s]] = view[i]
            slot_fill[s] += 1
    for r in range(nranks):
        b = rank_bucket[r]
        s = slot[b]
        values[r] = _rank_by_select(kept + slot_offset[s], start[b + 1] - start[b], ranks[r] - start[b])
    for qi in range(4):
        h = (n - 1) * _QUANTILES[qi]
        f = <Py_ssize_t>floor(h)
        v0 = values[2 * qi]
        v1 = values[2 * qi + 1]
        out[qi] = v0 + (h - f) * (v1 - v0) if f + 1 < n else v0
    free(kept)
    free(start)
    free(slot)
    return 0


def six_stats(samples):
    """Return ``(peak, p99, p95, p75, p50, avg)`` of the samples (rule I2)."""
    cdef const double[::1] view
    try:
        view = samples
    except (TypeError, ValueError):
        view = array("d", samples)
    cdef Py_ssize_t n = view.shape[0]
    if n == 0:
        raise ValueError("six_stats needs at least one sample")
    cdef double total = 0.0
    cdef double peak, lo, v
    cdef Py_ssize_t i
    cdef double[4] out
    cdef int rc = 1
    with nogil:
        peak = view[0]
        lo = view[0]
        for i in range(n):
            v = view[i]
            total += v
            if v > peak:
                peak = v
            if v < lo:
                lo = v
        # a NaN or an infinity (or a sum past the double range) makes the total non-finite: select
        if n >= 64 and peak > lo and isfinite(total):
            rc = _quantiles_by_buckets(view, n, lo, peak, out)
        if rc == 1:
            rc = _quantiles_by_select(view, n, out)
    if rc != 0:
        raise MemoryError()
    return (peak, out[0], out[1], out[2], out[3], total / n)


cpdef int memory_buffer_percent(long long observed_bytes):
    """The memory staircase buffer of rule S9, in percent."""
    if observed_bytes < GIB:
        return 20
    if observed_bytes <= 4 * GIB:
        return 10
    return 5


cpdef long long ceil_tolerant(double x):
    """Round up to an integer, treating a value within 1e-9 relative of an integer as that integer."""
    cdef double r = floor(x + 0.5)
    cdef double scale = fabs(x)
    if scale < 1.0:
        scale = 1.0
    if fabs(x - r) <= 1e-9 * scale:
        return <long long>r
    return <long long>ceil(x)


cpdef long long cpu_limit_for(long long request_millicores):
    """Rule S12: round up to a multiple of 500m, at least 500m."""
    cdef long long steps = (request_millicores + 499) // 500
    if steps < 1:
        steps = 1
    return steps * 500


cpdef long long memory_limit_for(long long request_bytes):
    """Rule S12: the next power of two in MiB at or above the request, at least 128Mi."""
    cdef long long mib = (request_bytes + MIB - 1) // MIB
    cdef long long pow2 = 128
    while pow2 < mib:
        pow2 *= 2
    return pow2 * MIB


cdef void _size(
    int phase,
    double cpu_observed,
    long long memory_observed,
    long long pod_peak,
    int buffer_pct,
    int consecutive,
    long long streak_limit,
    long long ceiling,
    bint guaranteed,
    long long backoff_ceiling,
    long long* out,
) noexcept:
    """The per-container arithmetic of rules S7-S16 into ``out``: cpu request, cpu limit,
    memory request, memory limit, capped."""
    cdef long long cpu_request, cpu_limit, memory_request, memory_limit, mem_h, pod_h, base, top
    cdef double cpu_exact
    cdef bint capped = False
    cdef int i, doublings
    if phase == 0:
        cpu_request = 500
        cpu_limit = 500
        memory_request = 4 * GIB
        memory_limit = 4 * GIB
    else:
        if phase == 1:
            cpu_exact = cpu_observed * 3
            mem_h = memory_observed * 300
        else:
            cpu_exact = cpu_observed * (100 + buffer_pct) / 100.0
            mem_h = memory_observed * (100 + memory_buffer_percent(memory_observed))
        cpu_request = ceil_tolerant(cpu_exact)
        if cpu_request < 10:
            cpu_request = 10
        if mem_h < 32 * MIB * 100:
            mem_h = 32 * MIB * 100
        if phase == 2 and pod_peak >= 0:
            pod_h = pod_peak * (100 + memory_buffer_percent(pod_peak))
            if pod_h < mem_h:
                mem_h = pod_h
        memory_request = ((mem_h + 100 * MIB - 1) // (100 * MIB)) * MIB
        cpu_limit = cpu_limit_for(cpu_request)
        memory_limit = memory_limit_for(memory_request)
    if consecutive > 0:
        base = memory_limit if memory_limit > streak_limit else streak_limit
        doublings = consecutive if consecutive < _MAX_BACKOFF_DOUBLINGS else _MAX_BACKOFF_DOUBLINGS
        capped = doublings < consecutive
        memory_limit = base
        for i in range(doublings):
            if memory_limit > MAX_BYTES // 2:
                memory_limit = MAX_BYTES
                capped = True
                break
            memory_limit *= 2
        if ceiling < 0 and backoff_ceiling >= 0:
            top = base if base > backoff_ceiling else backoff_ceiling
            if memory_limit > top:
                memory_limit = top
                capped = True
    if ceiling >= 0 and memory_limit > ceiling:
        memory_limit = ceiling
        capped = True
    if guaranteed:
        memory_request = memory_limit
    elif memory_request > memory_limit:
        memory_request = memory_limit
    out[0] = cpu_request
    out[1] = cpu_limit
    out[2] = memory_request
    out[3] = memory_limit
    out[4] = capped


def size_container(
    int phase,
    double cpu_observed,
    long long memory_observed,
    long long pod_peak,
    int buffer_pct,
    int consecutive,
    long long streak_limit,
    long long ceiling,
    bint guaranteed,
    long long backoff_ceiling=-1,
):
    """The per-container arithmetic of rules S7-S16, before overrides (see ``_reference``)."""
    cdef long long out[5]
    _size(
        phase, cpu_observed, memory_observed, pod_peak, buffer_pct, consecutive, streak_limit, ceiling, guaranteed,
        backoff_ceiling, out,
    )
    return out[0], out[1], out[2], out[3], bool(out[4])


# --------------------------------------------------------------------------- stage composition

STEP = 0
BACKGROUND = 1
PARALLEL = 2
GROUP = 3
LOOP = 4
NON_CI = 5


def compose_stage(
    kinds,
    counts,
    values,
    long long addon,
    long long step_request,
    bint conservative,
    long long init=0,
    bint harness=False,
    bint no_extra=False,
):
    """Rules H2-H6 and H8-H13 for one resource over a preorder-flattened stage (see ``_reference``)."""
    cdef Py_ssize_t n = len(kinds)
    if len(counts) != n or len(values) != n:
        raise ValueError("kinds, counts and values differ in length")
    cdef Py_ssize_t size = n if n > 0 else 1
    cdef long long* kind = <long long*>malloc(size * sizeof(long long))
    cdef long long* count = <long long*>malloc(size * sizeof(long long))
    cdef long long* value = <long long*>malloc(size * sizeof(long long))
    cdef long long* req = <long long*>malloc(size * sizeof(long long))
    cdef long long* plain = <long long*>malloc(size * sizeof(long long))
    cdef long long* psum = <long long*>malloc(size * sizeof(long long))
    cdef long long* elig = <long long*>malloc(size * sizeof(long long))
    cdef long long* sections = <long long*>malloc(size * sizeof(long long))
    cdef long long* lim = <long long*>malloc(size * sizeof(long long))
    cdef long long* fg = <long long*>malloc(size * sizeof(long long))
    cdef long long* share = <long long*>malloc(size * sizeof(long long))
    cdef Py_ssize_t* stack = <Py_ssize_t*>malloc(size * sizeof(Py_ssize_t))
    cdef Py_ssize_t* ranked = <Py_ssize_t*>malloc(size * sizeof(Py_ssize_t))
    cdef long long* left = <long long*>malloc(size * sizeof(long long))
    cdef Py_ssize_t i, j, k, c, r, top_n = 0, depth = 0, parent, context
    cdef long long total, top, ptotal, ptop, m, e, room, k_copies, stage = 0, container
    cdef long long background = 0, step_n = 0, step_sum = 0, pod_request, pod_limit
    cdef bint copy, in_parallel
    try:
        if (kind == NULL or count == NULL or value == NULL or req == NULL or plain == NULL or psum == NULL
                or elig == NULL or sections == NULL or lim == NULL or fg == NULL or share == NULL
                or stack == NULL or ranked == NULL or left == NULL):
            raise MemoryError()
        for i in range(n):
            kind[i] = kinds[i]
            count[i] = counts[i]
            value[i] = values[i]
            fg[i] = 0
            share[i] = 0
        for i in range(n - 1, -1, -1):
            c = count[i]
            if kind[i] == 0 or kind[i] == 1 or kind[i] == 5:
                if c != 0 or value[i] < 0:
                    raise ValueError(f"item {i}: a step has no children and a non-negative value")
                req[i] = value[i] if kind[i] == 0 else 0
                plain[i] = req[i]
                psum[i] = req[i]
                elig[i] = kind[i] != 1
            elif kind[i] == 2 or kind[i] == 3 or kind[i] == 4:
                if c < 1 or c > top_n:
                    raise ValueError(f"item {i}: a block needs 1 to {top_n} children, not {c}")
                if kind[i] == 4 and value[i] < 1:
                    raise ValueError(f"item {i}: a loop runs at least 1 copy at once, not {value[i]}")
                total = 0
                top = 0
                ptotal = 0
                ptop = 0
                m = 0
                e = 0
                for j in range(c):
                    top_n -= 1
                    k = stack[top_n]
                    if kind[i] == 4 and not (kind[k] == 0 or kind[k] == 1 or kind[k] == 5 or kind[k] == 3):
                        raise ValueError(f"item {i}: a loop copies steps or groups only")
                    ranked[j] = k
                    total += req[k]
                    if req[k] > top:
                        top = req[k]
                    ptotal += psum[k] if kind[i] == 2 else plain[k]
                    if plain[k] > ptop:
                        ptop = plain[k]
                    m += sections[k]
                    if elig[k]:
                        e = 1
                if kind[i] == 4:
                    # H9: largest plain request first, equal ones the later copy first; insertion sort
                    for j in range(1, c):
                        k = ranked[j]
                        r = j - 1
                        while r >= 0 and (plain[ranked[r]] < plain[k]
                                          or (plain[ranked[r]] == plain[k] and ranked[r] < k)):
                            ranked[r + 1] = ranked[r]
                            r -= 1
                        ranked[r + 1] = k
                    k_copies = value[i] if value[i] < c else c
                    total = 0
                    for j in range(k_copies):
                        total += req[ranked[j]]
                    req[i] = total
                    plain[i] = ptop
                    psum[i] = ptotal
                    sections[i] = m
                elif kind[i] == 2:
                    req[i] = total
                    plain[i] = ptotal
                    psum[i] = ptotal
                    fg[i] = m
                else:
                    req[i] = top
                    plain[i] = ptop
                    psum[i] = ptop
                elig[i] = e
            else:
                raise ValueError(f"item {i}: unknown kind {kind[i]}")
            if kind[i] != 4:
                sections[i] = elig[i] if harness else kind[i] != 1
            stack[top_n] = i
            top_n += 1
        for j in range(top_n):
            if req[stack[j]] > stage:
                stage = req[stack[j]]
        # preorder walk; ``stack`` now holds the open blocks, ``left`` their children still to come
        for i in range(n):
            parent = stack[depth - 1] if depth > 0 else -1
            copy = parent >= 0 and kind[parent] == 4
            if copy:
                context = stack[depth - 2] if depth > 1 else -1
            else:
                context = parent
            in_parallel = context >= 0 and kind[context] == 2
            room = stage if context < 0 else lim[context]
            if kind[i] == 1:
                lim[i] = value[i]
                background += value[i]
            elif kind[i] == 5:
                lim[i] = 0
            elif kind[i] == 0:
                if no_extra or copy:
                    lim[i] = value[i]
                elif in_parallel:
                    lim[i] = value[i] + share[context]
                else:
                    lim[i] = room if room > value[i] else value[i]
                step_n += 1
                step_sum += lim[i]
            elif kind[i] == 4:
                lim[i] = share[context] if in_parallel else room
            else:
                lim[i] = psum[i] + share[context] if in_parallel else room
                if kind[i] == 2 and fg[i] > 0:
                    m = lim[i] - psum[i]
                    share[i] = (m if m > 0 else 0) // fg[i]
            if parent >= 0:
                left[depth - 1] -= 1
            if count[i] > 0:
                stack[depth] = i
                left[depth] = count[i]
                depth += 1
            while depth > 0 and left[depth - 1] == 0:
                depth -= 1
        container = addon if conservative else stage + addon
        pod_request = container + step_request * step_n + background
        pod_limit = container + step_sum + background
        return (
            [req[i] for i in range(n)],
            [lim[i] for i in range(n)],
            stage,
            container,
            container + background,
            pod_request if pod_request > init else init,
            pod_limit if pod_limit > init else init,
        )
    finally:
        free(kind)
        free(count)
        free(value)
        free(req)
        free(plain)
        free(psum)
        free(elig)
        free(sections)
        free(lim)
        free(fg)
        free(share)
        free(stack)
        free(ranked)
        free(left)


# --------------------------------------------------------------------------- node scoring

LEAST_ALLOCATED = 0
MOST_ALLOCATED = 1
LIMIT_AWARE = 2
SMALLEST_NODE = 3
LARGEST_NODE = 4
REQUESTED_TO_CAPACITY_RATIO = 5
BALANCED_ALLOCATION = 6
BALANCED_ALLOCATION_CHANGE = 7


cdef object _int64(object column):
    """A buffer of C long longs: the column itself when it is one (array('q'), numpy int64), else a copy."""
    if type(column) is list:  # the live answer's columns: no buffer to look for (a failed look costs 1.2 us)
        return array("q", column)
    try:
        view = memoryview(column)
        if view.format == "q" and view.ndim == 1 and view.c_contiguous:
            return column
    except TypeError:
        pass
    return array("q", column)


cdef inline long long _fit_score(long long kind, long long requested, long long capacity) noexcept nogil:
    if capacity <= 0:
        return 0
    if kind == 0:
        if requested > capacity:
            return 0
        return (capacity - requested) * 100 // capacity
    if requested > capacity:
        requested = capacity
    return requested * 100 // capacity


cdef long long _shape_score(const long long* shape, Py_ssize_t k, long long p) noexcept nogil:
    """``helper.BuildBrokenLinearFunction``; C division truncates toward zero, as Go's does."""
    cdef Py_ssize_t i
    for i in range(k):
        if p <= shape[2 * i]:
            if i == 0:
                return shape[1]
            return shape[2 * i - 1] + (shape[2 * i + 1] - shape[2 * i - 1]) * (p - shape[2 * i - 2]) // (
                shape[2 * i] - shape[2 * i - 2]
            )
    if k == 0:
        return 0
    return shape[2 * k - 1]


cdef long long _balance(const long long* requested, const long long* allocatable, Py_ssize_t r, double* fractions) noexcept nogil:
    cdef Py_ssize_t i, m = 0
    cdef double total = 0.0, fraction, std = 0.0, mean, acc
    for i in range(r):
        if allocatable[i] == 0:
            continue
        fraction = <double>requested[i] / <double>allocatable[i]
        if fraction > 1:
            fraction = 1.0
        total += fraction
        fractions[m] = fraction
        m += 1
    if m == 2:
        std = fabs((fractions[0] - fractions[1]) / 2)
    elif m > 2:
        mean = total / <double>m
        acc = 0.0
        for i in range(m):
            acc = acc + (fractions[i] - mean) * (fractions[i] - mean)
        std = sqrt(acc / <double>m)
    return <long long>((1 - std) * 100.0)


cdef long long _resource_score(
    long long kind, const long long* requested, const long long* allocated, const long long* allocatable,
    const long long* weights, Py_ssize_t r, const long long* shape, Py_ssize_t k, double* fractions,
) noexcept nogil:
    cdef long long acc = 0, wsum = 0, value, with_pod, without
    cdef Py_ssize_t i
    if kind == 6:
        return _balance(requested, allocatable, r, fractions)
    if kind == 7:
        with_pod = _balance(requested, allocatable, r, fractions)
        without = _balance(allocated, allocatable, r, fractions)
        return 50 + (50 + with_pod - without) // 2
    for i in range(r):
        if allocatable[i] == 0:
            continue
        if kind == 5:
            if requested[i] >= allocatable[i]:
                value = _shape_score(shape, k, 100)
            elif requested[i] > 0:
                value = _shape_score(shape, k, requested[i] * 100 // allocatable[i])
            else:
                value = _shape_score(shape, k, 0)
            if value <= 0:
                continue
        else:
            value = _fit_score(kind, requested[i], allocatable[i])
        acc += value * weights[i]
        wsum += weights[i]
    if wsum == 0:
        return 0
    if kind == 5:
        return (2 * acc + wsum) // (2 * wsum)
    return acc // wsum


def score_nodes(
    alloc_cpu, alloc_mem, pod_node, req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem,
    pod, scorers, ext_alloc=(), ext_req=(),
):
    """Fit and score every node for a pod (rules P7-P10, PK1-PK5; see ``_reference``)."""
    cdef const long long[::1] a_cpu = _int64(alloc_cpu)
    cdef const long long[::1] a_mem = _int64(alloc_mem)
    cdef Py_ssize_t n = a_cpu.shape[0]
    if a_mem.shape[0] != n:
        raise ValueError("alloc_cpu and alloc_mem differ in length")
    cdef const long long[::1] p_node = _int64(pod_node)
    cdef Py_ssize_t p = p_node.shape[0]
    cols = [_int64(c) for c in (req_cpu, req_mem, nz_cpu, nz_mem, lim_cpu, lim_mem, miss_cpu, miss_mem)]
    for c in cols:
        if len(c) != p:
            raise ValueError("the pod columns differ in length")
    cdef Py_ssize_t e = len(pod) - 8
    if e < 0 or len(ext_alloc) != n * e or len(ext_req) != p * e:
        raise ValueError("the extended-resource columns differ in length")
    cdef const long long[::1] r_cpu = cols[0]
    cdef const long long[::1] r_mem = cols[1]
    cdef const long long[::1] z_cpu = cols[2]
    cdef const long long[::1] z_mem = cols[3]
    cdef const long long[::1] l_cpu = cols[4]
    cdef const long long[::1] l_mem = cols[5]
    cdef const long long[::1] m_cpu = cols[6]
    cdef const long long[::1] m_mem = cols[7]
    ext_alloc_buf = _int64(ext_alloc) if e > 0 else array("q", [0])
    ext_req_buf = _int64(ext_req) if e > 0 and p > 0 else array("q", [0])
    cdef const long long[::1] x_alloc = ext_alloc_buf
    cdef const long long[::1] x_req = ext_req_buf
    q_buf = array("q", [int(v) for v in pod])
    cdef const long long[::1] q = q_buf
    cdef Py_ssize_t i, j, r, x
    cdef Py_ssize_t nr = 2 + e
    # per node: 0-1 requests, 2-3 non-zero requests, 4-5 limits, 6-7 containers without a limit
    used = array("q", bytes(8 * 8 * (n if n > 0 else 1)))
    cdef long long[::1] u = used
    used_ext_buf = array("q", bytes(8 * (n * e if n * e > 0 else 1)))
    cdef long long[::1] ux = used_ext_buf
    cdef long long node
    for i in range(p):
        node = p_node[i]
        if node < 0 or node >= n:
            raise ValueError(f"pod {i}: node index {node} out of range")
        u[node * 8 + 0] += r_cpu[i]
        u[node * 8 + 1] += r_mem[i]
        u[node * 8 + 2] += z_cpu[i]
        u[node * 8 + 3] += z_mem[i]
        u[node * 8 + 4] += l_cpu[i]
        u[node * 8 + 5] += l_mem[i]
        u[node * 8 + 6] += m_cpu[i]
        u[node * 8 + 7] += m_mem[i]
        for x in range(e):
            ux[node * e + x] += x_req[i * e + x]
    fits_buf = array("b", bytes(n))
    cdef signed char[::1] fits = fits_buf
    for j in range(n):
        fits[j] = u[j * 8] + q[0] <= a_cpu[j] and u[j * 8 + 1] + q[1] <= a_mem[j]
        for x in range(e):
            if q[8 + x] > 0 and ux[j * e + x] + q[8 + x] > x_alloc[j * e + x]:
                fits[j] = 0
    totals_buf = array("q", bytes(8 * n))
    cdef long long[::1] totals = totals_buf
    # scratch per node: requested, allocated, allocatable, weights (nr each) and fractions
    scratch_buf = array("q", bytes(8 * 4 * nr))
    cdef long long[::1] sc = scratch_buf
    fractions_buf = array("d", bytes(8 * nr))
    cdef double[::1] fr = fractions_buf
    raws = []
    scores = []
    cdef long long kind, weight, w0, w1, miss0, miss1, cap, default, limit
    cdef double value, low, high
    cdef bint seen, any_request
    cdef double[::1] raw
    cdef long long[::1] score
    cdef const long long[::1] wx
    cdef const long long[::1] shp
    cdef Py_ssize_t k
    for scorer in scorers:
        kind, weight, w0, w1, miss0, miss1 = scorer[:6]
        wx_buf = array("q", [int(v) for v in scorer[6]]) if len(scorer) > 6 else array("q", bytes(8 * e))
        if len(wx_buf) != e:
            raise ValueError("a scorer's extended-resource weights differ in length from the pod's")
        wx_buf.append(0)  # never empty
        wx = wx_buf
        shape_buf = array("q", [int(v) for v in scorer[7]]) if len(scorer) > 7 else array("q")
        k = len(shape_buf) // 2
        shape_buf.append(0)
        shp = shape_buf
        raw_buf = array("d", bytes(8 * n))
        score_buf = array("q", bytes(8 * n))
        raw = raw_buf
        score = score_buf
        if kind == 0 or kind == 1 or kind == 5:
            if kind == 5 and k == 0:
                raise ValueError("requested-to-capacity-ratio needs a shape")
            sc[3 * nr + 0] = w0
            sc[3 * nr + 1] = w1
            for x in range(e):
                sc[3 * nr + 2 + x] = wx[x]
            for j in range(n):
                if not fits[j]:
                    continue
                sc[0] = u[j * 8 + 2] + q[2]
                sc[1] = u[j * 8 + 3] + q[3]
                sc[2 * nr + 0] = a_cpu[j] if w0 > 0 else 0
                sc[2 * nr + 1] = a_mem[j] if w1 > 0 else 0
                for x in range(e):
                    sc[2 + x] = ux[j * e + x] + q[8 + x]
                    sc[2 * nr + 2 + x] = x_alloc[j * e + x] if wx[x] > 0 and q[8 + x] != 0 else 0
                score[j] = _resource_score(
                    kind, &sc[0], &sc[0], &sc[2 * nr], &sc[3 * nr], nr, &shp[0], k, &fr[0]
                )
                raw[j] = <double>score[j]
        elif kind == 6 or kind == 7:
            any_request = (w0 > 0 and q[0] != 0) or (w1 > 0 and q[1] != 0)
            for x in range(e):
                if wx[x] > 0 and q[8 + x] != 0:
                    any_request = True
            if any_request:
                for j in range(n):
                    if not fits[j]:
                        continue
                    sc[nr + 0] = u[j * 8 + 0]
                    sc[nr + 1] = u[j * 8 + 1]
                    sc[0] = u[j * 8 + 0] + q[0]
                    sc[1] = u[j * 8 + 1] + q[1]
                    sc[2 * nr + 0] = a_cpu[j] if w0 > 0 else 0
                    sc[2 * nr + 1] = a_mem[j] if w1 > 0 else 0
                    for x in range(e):
                        sc[nr + 2 + x] = ux[j * e + x]
                        sc[2 + x] = ux[j * e + x] + q[8 + x]
                        sc[2 * nr + 2 + x] = x_alloc[j * e + x] if wx[x] > 0 and q[8 + x] != 0 else 0
                    score[j] = _resource_score(
                        kind, &sc[0], &sc[nr], &sc[2 * nr], &sc[3 * nr], nr, &shp[0], k, &fr[0]
                    )
                    raw[j] = <double>score[j]
        elif kind == 2 or kind == 3 or kind == 4:
            seen = False
            low = 0.0
            high = 0.0
            for j in range(n):
                if not fits[j]:
                    continue
                value = 0.0
                for r in range(2):
                    if (w0 if r == 0 else w1) <= 0:
                        continue
                    cap = a_cpu[j] if r == 0 else a_mem[j]
                    if kind == 2:
                        default = (miss0 if r == 0 else miss1)
                        if default < 0:
                            default = cap
                        limit = u[j * 8 + 4 + r] + q[4 + r] + (u[j * 8 + 6 + r] + q[6 + r]) * default
                        value += <double>(w0 if r == 0 else w1) * (((cap - limit) * 100.0 / cap) if cap > 0 else 0.0)
                    elif kind == 3:
                        value -= <double>(w0 if r == 0 else w1) * <double>cap
                    else:
                        value += <double>(w0 if r == 0 else w1) * <double>cap
                raw[j] = value
                if not seen or value < low:
                    low = value
                if not seen or value > high:
                    high = value
                seen = True
            if seen and high > low:
                for j in range(n):
                    if fits[j]:
                        score[j] = <long long>((raw[j] - low) * 100 / (high - low))
        else:
            raise ValueError(f"unknown scorer kind {kind}")
        for j in range(n):
            totals[j] += weight * score[j]
        raws.append(raw_buf.tolist())
        scores.append(score_buf.tolist())
    return [bool(f) for f in fits_buf], raws, scores, totals_buf.tolist()


# --------------------------------------------------------------------------- the policy, per run

from ._reference import Sized

POLICY_CI_SIZER = 0
POLICY_FIXED = 1
POLICY_KRR = 2
POLICY_VPA = 3
POLICY_RECORDED = 4
POLICY_EFFICIENT = 5
POLICY_GROWTH = 6
RUN_KILLED = 0
RUN_CLEAN = 1
RUN_NEAR_LIMIT = 2
OOM_NONE = 0
OOM_NEAR_LIMIT = 1
OOM_KILLED = 2
cdef long long _EFFICIENT_MARGIN_PCT = 3
cdef long long _EFFICIENT_LEARNING_MARGIN_PCT = 20
cdef long long _EFFICIENT_FIRST_SAMPLE_MARGIN_PCT = 50
cdef Py_ssize_t _EFFICIENT_STEADY_SAMPLES = 7
cdef Py_ssize_t _EFFICIENT_MIN_WINDOW = 30
cdef long long _EFFICIENT_CHEAP_MIB_SECONDS = 2466
cdef long long _EFFICIENT_CHEAPEST_MIB_SECONDS = 192
cdef long long _PRIOR_MIN_JOBS = 2
cdef long long _EFFICIENT_CPU_TIME_PCT = 5
cdef long long _PRIOR_TWO_JOBS_MARGIN_PCT = 50
cdef long long _GROWTH_QUANTILE_QUARTERS = 3
GROWTH_QUANTILE_QUARTERS = _GROWTH_QUANTILE_QUARTERS
EFFICIENT_MARGIN_PCT = _EFFICIENT_MARGIN_PCT
EFFICIENT_LEARNING_MARGIN_PCT = _EFFICIENT_LEARNING_MARGIN_PCT
EFFICIENT_FIRST_SAMPLE_MARGIN_PCT = _EFFICIENT_FIRST_SAMPLE_MARGIN_PCT
EFFICIENT_STEADY_SAMPLES = _EFFICIENT_STEADY_SAMPLES
EFFICIENT_MIN_WINDOW = _EFFICIENT_MIN_WINDOW
EFFICIENT_CHEAP_MIB_SECONDS = _EFFICIENT_CHEAP_MIB_SECONDS
EFFICIENT_CHEAPEST_MIB_SECONDS = _EFFICIENT_CHEAPEST_MIB_SECONDS
PRIOR_MIN_JOBS = _PRIOR_MIN_JOBS
EFFICIENT_CPU_TIME_PCT = _EFFICIENT_CPU_TIME_PCT
PRIOR_TWO_JOBS_MARGIN_PCT = _PRIOR_TWO_JOBS_MARGIN_PCT
PRIOR_EMPTY = (0, -1)
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


cdef struct _Cols:
    Py_ssize_t n
    const long long* clean
    const long long* present
    const double* stat
    const double* peak
    const double* p95
    const long long* mem
    const long long* lim
    const long long* oom
    const long long* pod
    const double* sec  # E11: each run's duration (negative: unknown); NULL: none known


cdef struct _Out:
    long long phase
    long long v[4]
    long long rank[4]
    double cpu_observed
    long long mem_observed
    long long k
    long long factor
    bint capped


cdef int _cmp_longlong(const void* a, const void* b) noexcept nogil:
    cdef long long x = (<const long long*>a)[0]
    cdef long long y = (<const long long*>b)[0]
    return (x > y) - (x < y)


cdef long long _quarter_quantile(long long* xs, Py_ssize_t n) noexcept nogil:
    """Rule G8: the GROWTH_QUANTILE_QUARTERS/4 quantile of ``xs[0..n-1]`` (sorted in place), in integers
    (see ``_reference._quarter_quantile``)."""
    qsort(xs, n, sizeof(long long), _cmp_longlong)
    cdef long long h4 = (n - 1) * _GROWTH_QUANTILE_QUARTERS
    cdef Py_ssize_t lo = <Py_ssize_t>(h4 // 4)
    if lo + 1 >= n:
        return xs[lo]
    return xs[lo] + ((h4 - 4 * lo) * (xs[lo + 1] - xs[lo]) + 3) // 4


cdef double _sorted_quantile(double* xs, Py_ssize_t n, double q) noexcept nogil:
    qsort(xs, n, sizeof(double), _cmp_double)
    cdef double h = (n - 1) * q
    cdef Py_ssize_t lo = <Py_ssize_t>h
    if lo + 1 >= n:
        return xs[lo]
    return xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


cdef object _double_col(object column):
    if type(column) is list:  # as _int64
        return array("d", column)
    try:
        view = memoryview(column)
        if view.format == "d" and view.ndim == 1 and view.c_contiguous:
            return column
    except TypeError:
        pass
    return array("d", column)


cdef inline long long _with_margin(long long peak, long long pct) noexcept nogil:
    """Rules E3 and E8: ``peak`` plus ``pct`` percent, up to a whole MiB, at least 32Mi."""
    cdef long long v = (peak * (100 + pct) + 100 * MIB - 1) // (100 * MIB) * MIB
    return v if v > 32 * MIB else 32 * MIB


cdef long long _backoff(
    long long limit, long long k, long long streak_limit, long long ceiling, long long backoff_ceiling,
    long long floor_, bint* capped,
) noexcept nogil:
    """Rule S14 with E5's floor (see ``_reference._backoff``)."""
    cdef long long base = limit if limit > streak_limit else streak_limit
    cdef long long doublings = k if k < _MAX_BACKOFF_DOUBLINGS else _MAX_BACKOFF_DOUBLINGS
    cdef long long out = base, top, d
    capped[0] = doublings < k
    for d in range(doublings):
        if out > MAX_BYTES // 2:
            out = MAX_BYTES
            capped[0] = True
            break
        out *= 2
    if out < floor_:
        out = floor_
    if ceiling < 0 and backoff_ceiling >= 0:
        top = base if base > backoff_ceiling else backoff_ceiling
        if out > top:
            out = top
            capped[0] = True
    return out


cdef inline void _fixed(_Out* out, long long phase, long long cpu_req, long long cpu_lim, long long mem) noexcept nogil:
    out.phase = phase
    out.v[0] = cpu_req
    out.v[1] = cpu_lim
    out.v[2] = mem
    out.v[3] = mem
    out.rank[0] = out.rank[1] = out.rank[2] = out.rank[3] = 0
    out.cpu_observed = -1.0
    out.mem_observed = -1
    out.k = 0
    out.factor = 1
    out.capped = False


cdef long long _cheap_margin(
    long long need, const _Cols* c, const long long* newest, Py_ssize_t count, long long margin
) noexcept:
    """Rule E11 (``_reference._cheap_margin``): the confident margin of a job whose runs reserve little."""
    cdef double total = 0.0, cost
    cdef long long known = 0
    cdef Py_ssize_t a, j
    if c.sec == NULL:
        return margin
    for a in range(count):
        j = <Py_ssize_t>newest[a]
        if c.present[j] and c.sec[j] >= 0.0:
            total += c.sec[j]
            known += 1
    if known == 0:
        return margin
    cost = <double>need * total
    if cost < <double>(_EFFICIENT_CHEAPEST_MIB_SECONDS * MIB * known):
        return _EFFICIENT_FIRST_SAMPLE_MARGIN_PCT
    if cost < <double>(_EFFICIENT_CHEAP_MIB_SECONDS * MIB * known):
        return _EFFICIENT_LEARNING_MARGIN_PCT
    return margin


cdef double _cpu_by_time(const _Cols* c, const long long* newest, Py_ssize_t count, double highest) noexcept:
    """Rule E12 (``_reference._cpu_by_time``): the CPU stat the request holds, the window's runs weighed by their
    durations; the runs are taken highest stat first (ties: newest first) by selection, no buffer needed."""
    cdef double total = 0.0, left = 0.0, best = 0.0, prev_v = 0.0, v
    cdef Py_ssize_t a, j, pick, prev_j = -1
    cdef bint first = True
    if c.sec == NULL:
        return highest
    for a in range(count):
        j = <Py_ssize_t>newest[a]
        if c.present[j]:
            if c.sec[j] < 0.0:
                return highest
            total += c.sec[j]
    while True:
        pick = -1
        for a in range(count):
            j = <Py_ssize_t>newest[a]
            if not c.present[j]:
                continue
            v = c.stat[j]
            if not first and not (v < prev_v or (v == prev_v and j < prev_j)):
                continue  # taken already: the order is (stat descending, index descending)
            if pick < 0 or v > best or (v == best and j > pick):
                pick = j
                best = v
        if pick < 0:
            return highest
        if (left + c.sec[pick]) * 100.0 < <double>_EFFICIENT_CPU_TIME_PCT * total:
            left += c.sec[pick]
            prev_v = best
            prev_j = pick
            first = False
            continue
        return best


cdef inline Py_ssize_t _e2_window(Py_ssize_t runs, bint efficient) noexcept nogil:
    """Rule E2: the newest ``runs`` samples, efficient at least ``_EFFICIENT_MIN_WINDOW``."""
    return runs if not efficient or runs >= _EFFICIENT_MIN_WINDOW else _EFFICIENT_MIN_WINDOW


cdef void _size_run(
    Py_ssize_t i, const _Cols* c, long long ceiling, int policy, Py_ssize_t runs, int buffer_pct, bint guaranteed,
    const long long* pins, long long backoff_ceiling, long long prior, long long* newest, double* win, _Out* out,
) noexcept:
    """``_reference.size_run`` over C arrays; ``newest`` and ``win`` hold at least
    ``max(runs, EFFICIENT_MIN_WINDOW)`` entries (``newest`` twice that: G8's peaks after the indices)."""
    cdef bint efficient = policy == 5 or policy == 6
    cdef Py_ssize_t window = _e2_window(runs, efficient)
    cdef Py_ssize_t m = 0, count = 0, a, j, start, analysed
    cdef long long samples = 0, phase, k, streak_limit, mem_observed, pod, need, request, limit, tmp, floor_, killed
    cdef long long cpu_request, cpu_limit
    cdef double cpu_observed, w
    cdef bint capped = False
    cdef long long sized[5]
    cdef int r, l
    j = i - 1
    while j >= 0 and (count < window or samples < 3):
        if c.clean[j] == 1 or (efficient and c.clean[j] == 2):
            if count < window:
                newest[count] = <long long>j
                count += 1
            samples += 1
        j -= 1
    phase = 0 if samples == 0 else (1 if samples <= 2 else 2)
    m = 0  # the analysed runs: the newest that hold the container
    for a in range(count):
        if c.present[<Py_ssize_t>newest[a]]:
            m += 1
    analysed = m
    if policy == 2 or policy == 3:
        if m == 0:
            _fixed(out, phase, 500, 500, 4 * GIB)
            return
        m = 0
        for a in range(count):
            j = <Py_ssize_t>newest[a]
            if c.present[j]:
                win[m] = c.p95[j] if policy == 2 else c.peak[j]
                m += 1
        if policy == 2:
            cpu_request = ceil_tolerant(_sorted_quantile(win, m, 0.95))
            if cpu_request < 1:
                cpu_request = 1
            tmp = 0
            for a in range(count):
                j = <Py_ssize_t>newest[a]
                if c.present[j] and c.mem[j] > tmp:
                    tmp = c.mem[j]
            _fixed(out, phase, cpu_request, -1, (tmp * 115 + 99) // 100)
        else:
            cpu_request = ceil_tolerant(_sorted_quantile(win, m, 0.9) * 1.15)
            if cpu_request < 1:
                cpu_request = 1
            m = 0
            for a in range(count):
                j = <Py_ssize_t>newest[a]
                if c.present[j]:
                    win[m] = <double>c.mem[j]
                    m += 1
            _fixed(out, phase, cpu_request, cpu_request, ceil_tolerant(_sorted_quantile(win, m, 0.9) * 1.15))
        return
    if phase != 0 and m == 0:
        _fixed(out, -1, -1, -1, -1)  # the container is in none of the analysed runs
        return
    start = <Py_ssize_t>newest[count - 1] if count > 0 else 0
    k = 0
    streak_limit = -1
    j = i - 1
    while j >= start:
        if c.present[j]:
            if c.oom[j] == 0 or (efficient and c.oom[j] != 2):
                break
            k += 1
            streak_limit = c.lim[j]
        j -= 1
    cpu_observed = -1.0
    mem_observed = -1
    pod = -1
    for a in range(count):
        j = <Py_ssize_t>newest[a]
        if phase == 2 and not efficient and (pod < 0 or c.pod[j] > pod):
            pod = c.pod[j]
        if not c.present[j] or phase == 0:
            continue
        if efficient and (pod < 0 or c.pod[j] > pod):
            pod = c.pod[j]
        w = c.peak[j] if (phase == 1 and not efficient) else c.stat[j]
        if cpu_observed < 0.0 or w > cpu_observed:
            cpu_observed = w
        if mem_observed < 0 or c.mem[j] > mem_observed:
            mem_observed = c.mem[j]
    if efficient:
        if samples == 0:
            cpu_request = 500
            cpu_limit = 500
            limit = 4 * GIB if prior < 0 else prior
            request = limit
        else:
            cpu_request = ceil_tolerant(_cpu_by_time(c, newest, count, cpu_observed))  # E12
            if cpu_request < 10:
                cpu_request = 10
            cpu_limit = cpu_limit_for(ceil_tolerant(cpu_observed * (100 + buffer_pct) / 100.0))  # E7: the highest
            need = mem_observed
            if policy == 6 and samples > 2:  # G8: the analysed peaks' p75, sorted after the indices
                m = 0
                for a in range(count):
                    j = <Py_ssize_t>newest[a]
                    if c.present[j]:
                        newest[count + m] = c.mem[j]
                        m += 1
                need = _quarter_quantile(&newest[count], m)
            if pod < need:
                need = pod
            if k == 0:  # E10: the highest limit a run was killed at, over the same runs as the streak
                killed = -1
                for j in range(start, i):
                    if c.present[j] and c.oom[j] == 2:
                        if c.lim[j] > killed:
                            killed = c.lim[j]
                        if c.mem[j] > killed:
                            killed = c.mem[j]
                if killed > need:
                    need = killed
            request = (need + MIB - 1) // MIB * MIB
            if request < 32 * MIB:
                request = 32 * MIB
            if samples == 1:
                limit = _with_margin(need, _EFFICIENT_FIRST_SAMPLE_MARGIN_PCT)
            elif samples == 2:
                limit = _with_margin(need, _EFFICIENT_LEARNING_MARGIN_PCT)
            else:
                # E13: with fewer than EFFICIENT_STEADY_SAMPLES samples, 3 % over the highest is too little to bound
                # the next peak (not G8's, which aims at a typical peak)
                tmp = _EFFICIENT_MARGIN_PCT
                if policy != 6 and analysed < _EFFICIENT_STEADY_SAMPLES:
                    tmp = _EFFICIENT_LEARNING_MARGIN_PCT
                if k == 0:  # E11: where the runs reserve little, the headroom costs less than the kills it saves
                    tmp = _cheap_margin(need, c, newest, count, tmp)
                limit = _with_margin(need, tmp)
        if k > 0:
            floor_ = 4 * GIB if k >= 2 else 0  # E5: two kills in a row get at least the default
            limit = _backoff(limit, k, streak_limit, ceiling, backoff_ceiling, floor_, &capped)
        if ceiling >= 0 and limit > ceiling:
            limit = ceiling
            capped = True
        if guaranteed or request > limit:
            request = limit
        sized[0] = cpu_request
        sized[1] = cpu_limit
        sized[2] = request
        sized[3] = limit
        sized[4] = capped
    else:
        _size(
            <int>phase, cpu_observed if cpu_observed > 0.0 else 0.0, mem_observed if mem_observed > 0 else 0, pod,
            buffer_pct, <int>k, streak_limit, ceiling, guaranteed, backoff_ceiling, sized,
        )
    out.phase = phase
    for r in range(4):
        out.v[r] = sized[r]
        out.rank[r] = 0
        if pins[4 + r] > 0:
            out.v[r] = pins[r]
            out.rank[r] = pins[4 + r]
    for r in (0, 2):
        l = r + 1
        if out.v[r] > out.v[l]:
            if out.rank[r] > out.rank[l]:
                out.v[l] = out.v[r]
                out.rank[l] = out.rank[r]
            else:
                out.v[r] = out.v[l]
                out.rank[r] = out.rank[l]
    if guaranteed and out.rank[2] == 0:
        out.v[2] = out.v[3]
    out.cpu_observed = cpu_observed
    out.mem_observed = mem_observed
    out.k = k
    out.factor = (<long long>1) << (k if k < _MAX_BACKOFF_DOUBLINGS else _MAX_BACKOFF_DOUBLINGS)
    out.capped = sized[4] != 0


cdef inline const long long* _lptr(const long long[::1] view) noexcept:
    return &view[0] if view.shape[0] > 0 else NULL


cdef inline const double* _dptr(const double[::1] view) noexcept:
    return &view[0] if view.shape[0] > 0 else NULL


cdef inline _Cols _columns(
    const long long[::1] clean, const long long[::1] present, const double[::1] stat, const double[::1] peak,
    const double[::1] p95, const long long[::1] mem, const long long[::1] lim, const long long[::1] oom,
    const long long[::1] pod, const double[::1] sec, bint has_sec,
) noexcept:
    """Pointers into one container's columns (the caller keeps the views alive and checked their lengths)."""
    cdef _Cols cols
    cols.n = clean.shape[0]
    cols.clean = _lptr(clean)
    cols.present = _lptr(present)
    cols.stat = _dptr(stat)
    cols.peak = _dptr(peak)
    cols.p95 = _dptr(p95)
    cols.mem = _lptr(mem)
    cols.lim = _lptr(lim)
    cols.oom = _lptr(oom)
    cols.pod = _lptr(pod)
    cols.sec = _dptr(sec) if has_sec else NULL
    return cols


cdef object _sized(const _Out* out):
    return Sized(
        out.phase, out.v[0], out.v[1], out.v[2], out.v[3], out.rank[0], out.rank[1], out.rank[2], out.rank[3],
        out.cpu_observed, out.mem_observed, out.k, out.factor, bool(out.capped),
    )


def size_run(
    Py_ssize_t i, clean, present, cpu_stat, cpu_peak, cpu_p95, mem_peak, mem_limit, oom, pod_peak,
    long long ceiling, int policy, int runs, int buffer_pct, bint guaranteed, pins,
    long long backoff_ceiling=-1, long long prior=-1, seconds=None,
):
    """The recommendation for one container before run ``i`` (see ``_reference.size_run``)."""
    cdef const long long[::1] c_clean = _int64(clean)
    cdef Py_ssize_t n = c_clean.shape[0]
    cdef const long long[::1] c_present = _int64(present)
    cdef const double[::1] c_stat = _double_col(cpu_stat)
    cdef const double[::1] c_peak = _double_col(cpu_peak)
    cdef const double[::1] c_p95 = _double_col(cpu_p95)
    cdef const long long[::1] c_mem = _int64(mem_peak)
    cdef const long long[::1] c_lim = _int64(mem_limit)
    cdef const long long[::1] c_oom = _int64(oom)
    cdef const long long[::1] c_pod = _int64(pod_peak)
    cdef bint has_sec = seconds is not None
    cdef const double[::1] c_sec = _double_col(seconds if has_sec else ())
    if (c_present.shape[0] != n or c_stat.shape[0] != n or c_peak.shape[0] != n or c_p95.shape[0] != n
            or c_mem.shape[0] != n or c_lim.shape[0] != n or c_oom.shape[0] != n or c_pod.shape[0] != n):
        raise ValueError("the columns differ in length")
    if has_sec and c_sec.shape[0] != n:
        raise ValueError("the columns differ in length")
    if not 0 <= i <= n:
        raise ValueError(f"run index {i} outside 0..{n}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if len(pins) != 8:
        raise ValueError("pins holds four values and four ranks")
    cdef _Out out
    if policy == 4:
        if i == n or not c_present[i]:
            _fixed(&out, -1, -1, -1, -1)
        else:
            _fixed(&out, 0, -1, -1, c_lim[i])
        return _sized(&out)
    if policy == 1:
        _fixed(&out, 0, 500, 500, 4 * GIB)
        return _sized(&out)
    if policy not in (0, 2, 3, 5, 6):
        raise ValueError(f"unknown policy {policy}")
    cdef long long pin[8]
    for f in range(8):
        pin[f] = pins[f]
    cdef Py_ssize_t size = runs if runs > _EFFICIENT_MIN_WINDOW else _EFFICIENT_MIN_WINDOW
    newest_buf = array("q", bytes(16 * size))
    win_buf = array("d", bytes(8 * size))
    cdef long long[::1] newest = newest_buf
    cdef double[::1] win = win_buf
    cdef _Cols cols = _columns(c_clean, c_present, c_stat, c_peak, c_p95, c_mem, c_lim, c_oom, c_pod, c_sec, has_sec)
    _size_run(
        i, &cols, ceiling, policy, runs, buffer_pct, guaranteed, pin, backoff_ceiling, prior,
        &newest[0], &win[0], &out,
    )
    return _sized(&out)


def analysed_runs(Py_ssize_t i, clean, int policy, int runs):
    """The runs before run ``i`` that a policy sizes from, newest first (see ``_reference``)."""
    cdef const long long[::1] c_clean = _int64(clean)
    cdef Py_ssize_t n = c_clean.shape[0]
    if not 0 <= i <= n:
        raise ValueError(f"run index {i} outside 0..{n}")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    cdef bint efficient = policy == 5 or policy == 6
    cdef Py_ssize_t window = _e2_window(runs, efficient)
    out = []
    cdef Py_ssize_t j = i - 1
    while j >= 0 and len(out) < window:
        if c_clean[j] == 1 or (efficient and c_clean[j] == 2):
            out.append(j)
        j -= 1
    return out


# --------------------------------------------------------------------------- the first-run prior


def prior_update(state, long long peak, bint first_sample):
    """The state after one ingested sample (see ``_reference.prior_update``)."""
    if len(state) != 2:
        raise ValueError("a prior state holds two integers")
    if peak < 0:
        raise ValueError("a memory peak is never negative")
    cdef long long jobs = state[0], top = state[1]
    return jobs + (1 if first_sample else 0), (peak if peak > top else top)


def prior_read(state):
    """Rule E6: the memory limit for a new job's first run, or -1 (see ``_reference.prior_read``)."""
    if len(state) != 2:
        raise ValueError("a prior state holds two integers")
    cdef long long jobs = state[0], top = state[1], limit, margin
    if jobs < _PRIOR_MIN_JOBS or top < 0:
        return -1
    margin = _PRIOR_TWO_JOBS_MARGIN_PCT if jobs == 2 else _EFFICIENT_MARGIN_PCT
    limit = _with_margin(top, margin)
    return limit if limit < 4 * GIB else 4 * GIB


# --------------------------------------------------------------------------- growth (issue 40)

GROW_FACTOR = 2
GROW_THRESHOLD_MIN = 90
GROW_THRESHOLD_MAX = 95
GROW_STEP_DIVISOR = 4
GROW_MIN_BYTES = 64 * MIB
NO_GROW = (-1, 0, 0)


def window_peak(Py_ssize_t i, clean, present, mem_peak, int policy, int runs):
    """Rule G3's P before run ``i`` (see ``_reference.window_peak``)."""
    cdef const long long[::1] c_clean = _int64(clean)
    cdef const long long[::1] c_present = _int64(present)
    cdef const long long[::1] c_mem = _int64(mem_peak)
    cdef Py_ssize_t n = c_clean.shape[0]
    if not 0 <= i <= n:
        raise ValueError(f"run index {i} outside 0..{n}")
    if c_present.shape[0] != n or c_mem.shape[0] != n:
        raise ValueError("the columns differ in length")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    cdef bint efficient = policy == 5 or policy == 6
    cdef Py_ssize_t window = _e2_window(runs, efficient)
    cdef Py_ssize_t j = i - 1, count = 0, start = 0
    cdef long long samples = 0, top = -1
    while j >= 0 and (count < window or samples < 3):  # the analysed samples, as _size_run finds them
        if c_clean[j] == 1 or (efficient and c_clean[j] == 2):
            if count < window:
                start = j
                count += 1
            samples += 1
        j -= 1
    for j in range(start, i):
        if c_present[j] and c_mem[j] > top:
            top = c_mem[j]
    return top


def size_grow(long long limit, long long peak, long long bound):
    """Rules G3-G5 for one container (see ``_reference.size_grow``)."""
    if limit <= 0:
        return NO_GROW
    cdef long long top = limit if limit > peak else peak
    cdef long long raw, most, threshold, step
    if top > MAX_BYTES // 2:
        raw = MAX_BYTES
    else:
        raw = (top * 2 + MIB - 1) // MIB * MIB
        if raw < 4 * GIB:
            raw = 4 * GIB
    most = raw if (bound < 0 or raw < bound) else bound
    if most <= limit:
        return NO_GROW
    if peak >= limit:
        threshold = 95
    else:  # floor(100 x peak / limit) + 1 in Python integers: 100 x peak may not fit 64 bits
        threshold = (100 * <object>(peak if peak > 0 else 0)) // limit + 1
        if threshold < 90:
            threshold = 90
        if threshold > 95:
            threshold = 95
    step = (limit + 4 * MIB - 1) // (4 * MIB) * MIB
    if step < 64 * MIB:
        step = 64 * MIB
    if step > most - limit:
        step = most - limit
    return most, threshold, step


# --------------------------------------------------------------------------- backtest

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
    clean, present, cpu_stat, cpu_peak, cpu_p95, cpu_avg, mem_peak, mem_limit, oom, pod_peak, ceiling, duration,
    int policy, int runs, int buffer_pct, bint guaranteed, pins, long long backoff_ceiling=-1, prior=None,
    seconds=None,
):
    """One container's history walked in time order, ``size_run`` before each run (see
    ``_reference.backtest_walk``)."""
    cdef const long long[::1] c_clean = _int64(clean)
    cdef Py_ssize_t n = c_clean.shape[0]
    cdef const long long[::1] c_present = _int64(present)
    cdef const double[::1] c_stat = _double_col(cpu_stat)
    cdef const double[::1] c_peak = _double_col(cpu_peak)
    cdef const double[::1] c_p95 = _double_col(cpu_p95)
    cdef const double[::1] c_avg = _double_col(cpu_avg)
    cdef const long long[::1] c_mem = _int64(mem_peak)
    cdef const long long[::1] c_lim = _int64(mem_limit)
    cdef const long long[::1] c_oom = _int64(oom)
    cdef const long long[::1] c_pod = _int64(pod_peak)
    cdef const long long[::1] c_ceil = _int64(ceiling)
    cdef const double[::1] c_dur = _double_col(duration)
    cdef const long long[::1] c_prior = _int64(prior if prior is not None else array("q", bytes(8 * n)))
    cdef bint has_sec = seconds is not None
    cdef const double[::1] c_sec = _double_col(seconds if has_sec else ())
    if has_sec and c_sec.shape[0] != n:
        raise ValueError("the columns differ in length")
    if (c_present.shape[0] != n or c_stat.shape[0] != n or c_peak.shape[0] != n or c_p95.shape[0] != n
            or c_avg.shape[0] != n or c_mem.shape[0] != n or c_lim.shape[0] != n or c_oom.shape[0] != n
            or c_pod.shape[0] != n or c_ceil.shape[0] != n or c_dur.shape[0] != n or c_prior.shape[0] != n):
        raise ValueError("the columns differ in length")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    if policy not in (0, 1, 2, 3, 4, 5, 6):
        raise ValueError(f"unknown policy {policy}")
    cdef bint has_prior = prior is not None
    cdef long long pin[8]
    for f in range(8):
        pin[f] = pins[f]
    cdef Py_ssize_t size = runs if runs > _EFFICIENT_MIN_WINDOW else _EFFICIENT_MIN_WINDOW
    newest_buf = array("q", bytes(16 * size))
    win_buf = array("d", bytes(8 * size))
    cdef long long[::1] newest = newest_buf
    cdef double[::1] win = win_buf
    cdef _Cols cols = _columns(c_clean, c_present, c_stat, c_peak, c_p95, c_mem, c_lim, c_oom, c_pod, c_sec, has_sec)
    cdef _Out out
    cdef Py_ssize_t i
    cdef long long scored = 0, oom_risk = 0, cpu_scored = 0, throttled = 0
    cdef double cpu_waste = 0.0, mem_waste = 0.0, cpu_req_total = 0.0, mem_req_total = 0.0
    for i in range(n):
        if not c_present[i]:
            continue
        if policy == 4:
            _fixed(&out, 0, -1, -1, c_lim[i])
        elif policy == 1:
            _fixed(&out, 0, 500, 500, 4 * GIB)
        else:
            _size_run(
                i, &cols, c_ceil[i], policy, runs, buffer_pct, guaranteed, pin, backoff_ceiling,
                c_prior[i] if has_prior else -1, &newest[0], &win[0], &out,
            )
        if out.v[3] >= 0:
            scored += 1
            if c_mem[i] > out.v[3] or (c_oom[i] != 0 and c_mem[i] >= out.v[3]):
                oom_risk += 1
            if out.v[2] > c_mem[i]:
                mem_waste += <double>(out.v[2] - c_mem[i]) * c_dur[i]
            mem_req_total += <double>out.v[2] * c_dur[i]
        if out.v[0] >= 0:
            if out.v[0] - c_avg[i] > 0.0:
                cpu_waste += (out.v[0] - c_avg[i]) * c_dur[i]
            cpu_req_total += <double>out.v[0] * c_dur[i]
        if out.v[1] >= 0:
            cpu_scored += 1
            if c_p95[i] > out.v[1]:
                throttled += 1
    return scored, oom_risk, cpu_scored, throttled, cpu_waste, mem_waste, cpu_req_total, mem_req_total
