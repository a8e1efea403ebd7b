/* The kernel's inner loops, compiled: sorting, consolidating, counting, proposing, validating.
 *
 * Every function takes numpy arrays through the buffer protocol (int64 columns, uint8 flags;
 * no numpy C API, so the module builds against Python's headers alone), checks what it was
 * handed, then runs its loop with the GIL released: threads of the driver run them at once.
 *
 * A layer is rows of longs sorted lexicographically, consolidated (no zero diff), given as its
 * columns (each contiguous), its diffs, and optionally a directory of its first column
 * (`dir[k - low]` is the first row whose first column is at least k; `dir[span]` is n): a key
 * range is found by the directory or a binary search on the first column, then by binary
 * searches on the next columns within it. A probe that repeats the last key reuses its range,
 * and a value searched after a smaller one in the same range gallops forward from it. A loop
 * over a layer mapped from a file whose pages are not in memory first asks the OS for every
 * page its probes will read, all at once ("reading ahead from disk").
 *
 * Multiplicities are int64. Sums over layers (and runs of equal rows) are made exactly in 128
 * bits and a sum leaving int64 is reported by its row (the caller raises, naming it); products
 * flag the rows whose exact product leaves int64 (__builtin_mul_overflow) and carry on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

typedef int64_t i64;
typedef uint64_t u64;
typedef __int128 i128;

#define MAXW 32   /* columns of a layer or a prefix */
#define MAXL 64   /* layers of an extender (an index's levels, recent batches, the delta) */
#define MAXX 16   /* extenders of a step */
#define MAXF 32   /* filters of a step */

#ifndef WCOJ_SOURCE_HASH
#define WCOJ_SOURCE_HASH "unknown"
#endif

/* -- buffers ------------------------------------------------------------------------------ */

typedef struct {
    Py_buffer *views; /* grown as arrays are taken */
    int count, cap;
} Held;

static void release(Held *h) {
    for (int i = 0; i < h->count; i++) PyBuffer_Release(&h->views[i]);
    free(h->views);
    h->views = NULL;
    h->count = h->cap = 0;
}

/* A contiguous buffer of `itemsize`-byte items (of at least `need` items unless need < 0); an
 * itemsize of 0 takes items of 4 or 8 bytes, and the size found is left in `*len`'s place
 * given by `size` (when not NULL). */
static void *take_sized(Held *h, PyObject *obj, Py_ssize_t itemsize, int writable,
                        Py_ssize_t need, Py_ssize_t *len, int *size, const char *what) {
    if (h->count == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        Py_buffer *grown = realloc(h->views, sizeof(Py_buffer) * (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return NULL;
        }
        h->views = grown;
        h->cap = cap;
    }
    Py_buffer *v = &h->views[h->count];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) return NULL;
    h->count++;
    int fits = itemsize ? v->itemsize == itemsize : v->itemsize == 4 || v->itemsize == 8;
    if (!fits || v->ndim > 1) {
        PyErr_Format(PyExc_TypeError, "%s: expected a 1-d array of %zd-byte items", what,
                     itemsize ? itemsize : 8);
        return NULL;
    }
    if (size) *size = (int)v->itemsize;
    Py_ssize_t n = v->len / v->itemsize;
    if (need >= 0 && n < need) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items, at least %zd needed", what, n, need);
        return NULL;
    }
    if (len) *len = n;
    return v->buf;
}

static void *take(Held *h, PyObject *obj, Py_ssize_t itemsize, int writable, Py_ssize_t need,
                  Py_ssize_t *len, const char *what) {
    return take_sized(h, obj, itemsize, writable, need, len, NULL, what);
}

static int as_index(PyObject *seq, Py_ssize_t i, Py_ssize_t *out) {
    PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
    Py_ssize_t v = PyLong_AsSsize_t(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* -- layers ------------------------------------------------------------------------------- */

/* A column: int64 values, or `narrow` ones (uint32 in a segment's column whose values all lie
 * in [0, 2^32) and in a directory; int32 in a diff column). */
typedef struct {
    const void *p;
    int narrow;
} Col;

static inline i64 col_at(Col c, Py_ssize_t i) {
    return c.narrow ? (i64)((const uint32_t *)c.p)[i] : ((const i64 *)c.p)[i];
}
static inline const void *col_addr(Col c, Py_ssize_t i) {
    return (const char *)c.p + (c.narrow ? 4 : 8) * i;
}
static inline Col col_from(Col c, Py_ssize_t i) { return (Col){col_addr(c, i), c.narrow}; }
static inline size_t col_bytes(Col c, Py_ssize_t n) { return (size_t)n * (c.narrow ? 4u : 8u); }

/* A layer mapped from a segment file is checked as it is read: the file is blocks of
 * 2^shift bytes, each with its CRC-32 (`sums`, themselves checked when the file was opened);
 * a block is checked when a search first touches it in the process (`seen`, shared by every
 * call on the layer: 0 not yet, 1 as written, 2 damaged). A search that meets a damaged block
 * finds nothing there; the caller sees the 2 and raises (`wcoj_core.store.segments`): no
 * answer is made from bytes that are not the ones written. */
typedef struct {
    const uint8_t *base; /* the mapping (NULL: an unchecked layer, in memory) */
    Py_ssize_t size;     /* the bytes the blocks cover */
    const uint32_t *sums;
    uint8_t *seen; /* one byte a block, then one more: 2 once any block is found damaged */
    Py_ssize_t blocks;
    int shift;
} Guard;

/* Whether the bytes [p, p + len) of the layer's file are as written (see `Guard`); bytes
 * that are not the file's (an array made in memory from checked ones) are. */
static int checked(const Guard *g, const void *p, size_t len) {
    if (!g->base || !len) return 1;
    Py_ssize_t off = (const uint8_t *)p - g->base, end = off + (Py_ssize_t)len;
    if (off < 0 || end > g->size) return 1;
    for (Py_ssize_t b = off >> g->shift; b <= (end - 1) >> g->shift; b++) {
        uint8_t s = __atomic_load_n(&g->seen[b], __ATOMIC_RELAXED);
        if (s == 1) continue;
        if (s == 0) {
            Py_ssize_t at = b << g->shift, most = (Py_ssize_t)1 << g->shift;
            uInt n = (uInt)(g->size - at < most ? g->size - at : most);
            s = crc32(0L, g->base + at, n) == g->sums[b] ? 1 : 2;
            __atomic_store_n(&g->seen[b], s, __ATOMIC_RELAXED);
            if (s == 2) __atomic_store_n(&g->seen[g->blocks], 2, __ATOMIC_RELAXED);
        }
        if (s != 1) return 0;
    }
    return 1;
}

typedef struct {
    Py_ssize_t n;
    int width;
    Col cols[MAXW]; /* cols[0].p NULL: the directory stands for the first column */
    Col diff;       /* p NULL: none stored (a unit layer's) */
    Col dir;        /* first-column directory (p NULL: none) */
    i64 dir_low;
    Py_ssize_t dir_span;
    int unit;
    Guard g;
    /* the last key searched and its range (per call, per user) */
    i64 memo_key[MAXW];
    int memo_p;
    Py_ssize_t memo_lo, memo_hi;
} Layer;

/* The diff of row `at`: 1 in a layer whose diffs are all 1 (a set's), read without touching
 * its diffs (a row found in a large layer is a cache miss; its diff would be a second). */
static inline i64 diff_at(const Layer *L, Py_ssize_t at) {
    if (L->unit) return 1;
    return L->diff.narrow ? (i64)((const int32_t *)L->diff.p)[at] : ((const i64 *)L->diff.p)[at];
}

/* Whether rows [a, b) of columns from..width-1 and the diffs are as written (see `Guard`). */
static int rows_checked(const Layer *L, int from, Py_ssize_t a, Py_ssize_t b) {
    if (!L->g.base || a >= b) return 1;
    for (int j = from; j < L->width; j++)
        if (L->cols[j].p && !checked(&L->g, col_addr(L->cols[j], a), col_bytes(L->cols[j], b - a)))
            return 0;
    return L->unit || checked(&L->g, col_addr(L->diff, a), col_bytes(L->diff, b - a));
}

/* A column (or a directory: unsigned) of a spec into c (None: none, p NULL). */
static int take_col(Held *h, PyObject *obj, Py_ssize_t need, Col *c, const char *what) {
    c->p = NULL;
    c->narrow = 0;
    if (obj == Py_None) return 0;
    int size = 8;
    c->p = take_sized(h, obj, 0, 0, need, NULL, &size, what);
    c->narrow = size == 4;
    return c->p ? 0 : -1;
}

/* A guard from (the mapping's bytes, block sums, seen, shift[, the file's path]), or none
 * from None. */
static int parse_guard(Held *h, PyObject *guard, Guard *g) {
    *g = (Guard){0};
    if (guard == Py_None) return 0;
    PyObject *base, *sums, *seen;
    Py_ssize_t nb;
    PyObject *path = NULL;
    if (!PyArg_ParseTuple(guard, "OOOi|O", &base, &sums, &seen, &g->shift, &path)) return -1;
    if (g->shift < 6 || g->shift > 30) {
        PyErr_SetString(PyExc_ValueError, "a guard's blocks of 2^shift bytes: shift in [6, 30]");
        return -1;
    }
    g->base = take(h, base, 1, 0, -1, &g->size, "mapping");
    g->sums = g->base ? take(h, sums, 4, 0, -1, &nb, "block sums") : NULL;
    g->seen = g->sums ? take(h, seen, 1, 1, nb + 1, NULL, "seen") : NULL;
    if (!g->seen) return -1;
    g->blocks = nb;
    if (g->size > (nb << g->shift)) g->size = nb << g->shift;
    return 0;
}

/* checked(guard, offset, length) -> whether those bytes of a mapped segment are as written,
 * each block checked against its sum when first touched (see `Guard`). */
static PyObject *py_checked(PyObject *self, PyObject *args) {
    PyObject *guard_o;
    Py_ssize_t off, len;
    if (!PyArg_ParseTuple(args, "Onn", &guard_o, &off, &len)) return NULL;
    Held h = {.count = 0};
    Guard g;
    if (parse_guard(&h, guard_o, &g) < 0) { release(&h); return NULL; }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = off >= 0 && len >= 0 && checked(&g, g.base + off, (size_t)len);
    Py_END_ALLOW_THREADS
    release(&h);
    return PyBool_FromLong(ok);
}

/* A layer from its spec: (columns (the first None when the directory stands for it), diff or
 * None, rows, unit, directory or None, directory's low key, guard or None: (the mapping's
 * bytes, block sums, seen, shift)). */
static int parse_layer(Held *h, PyObject *spec, Layer *L) {
    PyObject *cols, *diff, *dir, *guard;
    int unit;
    long long low;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(spec, "OOnpOLO", &cols, &diff, &n, &unit, &dir, &low, &guard)) return -1;
    PyObject *fast = PySequence_Fast(cols, "a layer's columns");
    if (!fast) return -1;
    Py_ssize_t w = PySequence_Fast_GET_SIZE(fast);
    if (w > MAXW) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "a layer of %zd columns (at most %d)", w, MAXW);
        return -1;
    }
    L->n = n;
    L->width = (int)w;
    L->unit = unit;
    int ok = take_col(h, diff, n, &L->diff, "diff") == 0 && take_col(h, dir, 1, &L->dir, "directory") == 0;
    for (Py_ssize_t j = 0; ok && j < w; j++)
        ok = take_col(h, PySequence_Fast_GET_ITEM(fast, j), n, &L->cols[j], "column") == 0;
    Py_DECREF(fast);
    if (!ok) return -1;
    if ((!L->diff.p && !unit) || (w && !L->cols[0].p && !L->dir.p)) {
        PyErr_SetString(PyExc_ValueError, "a layer without its diffs or its first column");
        return -1;
    }
    L->dir_low = (i64)low;
    L->dir_span = L->dir.p ? PyObject_Length(dir) - 1 : 0;
    L->memo_p = -1;
    return parse_guard(h, guard, &L->g);
}

static int parse_layers(Held *h, PyObject *specs, Layer *out, int *count) {
    PyObject *fast = PySequence_Fast(specs, "layers");
    if (!fast) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > MAXL) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%zd layers (at most %d)", k, MAXL);
        return -1;
    }
    int used = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (parse_layer(h, PySequence_Fast_GET_ITEM(fast, i), &out[used]) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        if (out[used].n > 0) used++; /* an empty layer holds nothing to search */
    }
    Py_DECREF(fast);
    *count = used;
    return 0;
}

/* First position in [a, b) whose value is >= v (or > v when `after`). Branch-free: the
 * half kept is chosen by a conditional move, not a jump, so a search whose path the branch
 * predictor cannot guess (most: a key's place is as good as random) pays no mispredicted
 * jump per level, only the loads. As `bsearch_col`, `gallop_col` gallops forward from `a`
 * (the answer is expected near it). One of each per column type. */
#define SEARCHES(T, S)                                                                          \
    static inline Py_ssize_t bsearch_##S(const T *c, Py_ssize_t a, Py_ssize_t b, i64 v,        \
                                         int after) {                                           \
        Py_ssize_t n = b - a;                                                                   \
        if (n <= 0) return a;                                                                   \
        const T *base = c + a;                                                                  \
        if (after) {                                                                            \
            while (n > 1) {                                                                     \
                Py_ssize_t half = n >> 1;                                                       \
                base = (i64)base[half] <= v ? base + half : base;                               \
                n -= half;                                                                      \
            }                                                                                   \
            return (base - c) + ((i64)*base <= v);                                              \
        }                                                                                       \
        while (n > 1) {                                                                         \
            Py_ssize_t half = n >> 1;                                                           \
            base = (i64)base[half] < v ? base + half : base;                                    \
            n -= half;                                                                          \
        }                                                                                       \
        return (base - c) + ((i64)*base < v);                                                   \
    }                                                                                           \
    static inline Py_ssize_t gallop_##S(const T *c, Py_ssize_t a, Py_ssize_t b, i64 v,         \
                                        int after) {                                            \
        Py_ssize_t step = 1, lo = a;                                                            \
        while (lo + step < b && ((i64)c[lo + step] < v || (after && (i64)c[lo + step] == v))) { \
            lo += step;                                                                         \
            step <<= 1;                                                                         \
        }                                                                                       \
        Py_ssize_t hi = lo + step < b ? lo + step + 1 : b;                                      \
        return bsearch_##S(c, lo, hi, v, after);                                                \
    }
SEARCHES(i64, 64)
SEARCHES(uint32_t, 32)

static inline Py_ssize_t bsearch_col(Col c, Py_ssize_t a, Py_ssize_t b, i64 v, int after) {
    return c.narrow ? bsearch_32(c.p, a, b, v, after) : bsearch_64(c.p, a, b, v, after);
}

static inline Py_ssize_t gallop_col(Col c, Py_ssize_t a, Py_ssize_t b, i64 v, int after) {
    return c.narrow ? gallop_32(c.p, a, b, v, after) : gallop_64(c.p, a, b, v, after);
}

/* The rows [a, b) of directory entry `off` (empty when it is not, or its block is damaged). */
static inline void dir_range(const Layer *L, u64 off, Py_ssize_t *a, Py_ssize_t *b) {
    *a = *b = 0;
    if (off >= (u64)L->dir_span || !checked(&L->g, col_addr(L->dir, (Py_ssize_t)off), col_bytes(L->dir, 2)))
        return;
    i64 x = col_at(L->dir, (Py_ssize_t)off), y = col_at(L->dir, (Py_ssize_t)off + 1);
    if (x < 0 || y > L->n || x > y) return; /* (a directory that is not one: nothing) */
    *a = x;
    *b = y;
}

/* The rows [lo, hi) whose first p columns equal key (p <= width); in a checked layer, every
 * byte of the columns searched and of the rows found checked first (see `Guard`). */
static void key_range(Layer *L, const i64 *key, int p, Py_ssize_t *lo, Py_ssize_t *hi) {
    if (L->memo_p == p) {
        int same = 1;
        for (int j = 0; j < p; j++)
            if (L->memo_key[j] != key[j]) { same = 0; break; }
        if (same) { *lo = L->memo_lo; *hi = L->memo_hi; return; }
    }
    Py_ssize_t a = 0, b = L->n;
    int j = 0;
    if (p > 0 && L->dir.p) {
        dir_range(L, (u64)key[0] - (u64)L->dir_low, &a, &b);
        j = 1;
    }
    for (; j < p && a < b; j++) {
        /* a key's rows are few next to the rows searched: its end gallops from its start */
        Col c = L->cols[j];
        if (!checked(&L->g, col_addr(c, a), col_bytes(c, b - a))) { a = b; break; }
        a = bsearch_col(c, a, b, key[j], 0);
        b = a < b && col_at(c, a) == key[j] ? gallop_col(c, a, b, key[j], 1) : a;
    }
    if (!rows_checked(L, p, a, b)) a = b = 0;
    memcpy(L->memo_key, key, sizeof(i64) * (size_t)p);
    L->memo_p = p;
    L->memo_lo = a;
    L->memo_hi = b;
    *lo = a;
    *hi = b;
}

/* Prefetching. A loop over probes (a lookup's rows, a count's prefixes) asks for the memory a
 * later probe's search will read, in two stages: `PF_FAR` probes ahead the directory entry of
 * its first key column, `PF_NEAR` ahead (that entry in cache by then) the key's first row in
 * the column searched next and in the diffs. Each probe of a large layer otherwise waits for
 * two or three misses one after the other; prefetched, the misses of several probes overlap.
 * Only layers with a directory are prefetched (a layer without one is small enough to stay in
 * cache, or is searched by a binary search whose path is not known ahead). A prefetch reads
 * nothing the answer uses (an address it is given that is not the layer's is never faulted). */
enum { PF_FAR = 16, PF_NEAR = 6 };

static inline void prefetch_dir(const Layer *L, i64 k) {
    if (!L->dir.p) return;
    u64 off = (u64)k - (u64)L->dir_low;
    if (off < (u64)L->dir_span) __builtin_prefetch(col_addr(L->dir, (Py_ssize_t)off));
}

/* The first rows of key k's range: in column `col` (none when < 0) up to `PF_LINES` cache
 * lines of them (a search within the range, or a walk along it, then finds them in cache),
 * and the first in the diffs (when `diff`). */
enum { PF_LINES = 4 };

static inline void prefetch_rows(const Layer *L, i64 k, int col, int diff) {
    if (!L->dir.p) return;
    u64 off = (u64)k - (u64)L->dir_low;
    if (off >= (u64)L->dir_span) return;
    Py_ssize_t at = col_at(L->dir, (Py_ssize_t)off), end = col_at(L->dir, (Py_ssize_t)off + 1);
    if (at >= end || at < 0 || end > L->n) return;
    if (col >= 0 && col < L->width && L->cols[col].p)
        for (int q = 0; q < PF_LINES && at + 8 * q < end; q++)
            __builtin_prefetch(col_addr(L->cols[col], at + 8 * q));
    if (diff && L->diff.p) __builtin_prefetch(col_addr(L->diff, at));
}

/* -- reading ahead from disk -------------------------------------------------------------- */

/* A layer mapped from a segment file whose pages are not in the page cache makes a search wait
 * for the disk: each page it reads is a major fault, one after the other, and the kernel reads
 * the device's whole read-ahead around each (8 MB on this machine's virtual disk: a cold
 * 1,000-change epoch of the 44 M-edge state read 1.4 GB) where the search needs one page. So
 * a loop over probes that finds itself cold first searches its probes *level by level*, all
 * at once (`ahead`): every probe's next page is advised (madvise WILLNEED: the kernel queues
 * the read of that page alone and returns; ~10 us a call here), then all are read, so the
 * reads of every probe's search overlap on the disk, and the pages of the key ranges found
 * (the column the loop walks next, the diffs it reads) are advised the same way. The loop then
 * runs as before, on pages in memory, and answers as before (nothing but advice is made).
 *
 * Only with WCOJ_READ_AHEAD=faults (the default) or always, not with never
 * (`wcoj_core.kernel.native`). When to read ahead (`Watch`): a process's first loop reads its first `AHEAD_SAMPLE` probes
 * ahead and goes on if that was worth it (its thread read at least 1 in `AHEAD_WORTH` of the
 * pages it advised; advising a page in memory costs ~1 us); a loop whose probes turn slow (the
 * clock, every `AHEAD_EVERY` probes) and whose thread's major faults grew reads the rest of its
 * probes ahead; once one has, the process's next loops read ahead from their start, until a
 * pass is not worth it (the pages are in memory). A warm loop pays a clock read every
 * `AHEAD_EVERY` probes and one `getrusage`. Layers of fewer than
 * `AHEAD_MIN_ROWS` rows are searched as they are (a fault or two reads them whole). */
enum {
    AHEAD_MIN_ROWS = 1 << 15,
    AHEAD_EVERY = 32,
    AHEAD_CHUNK = 1 << 16, /* probes a pass sorts and searches at once */
    AHEAD_WORTH = 16,      /* a pass that read fewer than 1 in this many pages it advised: warm */
    AHEAD_SAMPLE = 16,     /* the probes a process's first loop reads ahead to find out */
};
#define AHEAD_SLOW_NS 20000 /* a probe this slow on average may have faulted (in memory: ~1 us) */
#define AHEAD_RANGE_BYTES ((size_t)1 << 20)  /* a key range's pages advised when this or less */
#define AHEAD_PASS_BYTES ((size_t)256 << 20) /* and at most this much of ranges per pass */

/* AH_NEVER, AH_FAULTS (read ahead after a fault: the default, see `wcoj_core.kernel.native`),
 * AH_ALWAYS (every call) */
enum { AH_NEVER, AH_FAULTS, AH_ALWAYS };
static int ahead_mode = AH_FAULTS;
enum { AHEAD_OFF, AHEAD_ON, AHEAD_UNKNOWN };
static int ahead_on = AHEAD_UNKNOWN; /* AHEAD_ON: calls read ahead first (see `Watch`) */
static Py_ssize_t ahead_min_rows = AHEAD_MIN_ROWS; /* (smaller in tests) */
static long long ahead_passes, ahead_calls, ahead_ns; /* passes, their madvise calls and time */

#ifdef RUSAGE_THREAD
#define USAGE_OF RUSAGE_THREAD
#else
#define USAGE_OF RUSAGE_SELF /* (not Linux: the process's, a coarser watch) */
#endif

static long thread_usage(int faults) {
    struct rusage r;
    if (getrusage(USAGE_OF, &r) != 0) return 0;
    return faults ? r.ru_majflt : r.ru_inblock;
}

/* What a pass advised: the single pages advised lately (a direct-mapped table: a page many
 * probes' searches read, or one search reads at several levels, is advised once), the range
 * bytes and the calls made. */
enum { ADVISED_SLOTS = 1 << 12 };
typedef struct {
    uintptr_t advised[ADVISED_SLOTS];
    size_t range_bytes;
    long long calls;
} Advice;

static uintptr_t page_bytes = 4096; /* the page size (set when the module loads) */

static void advise(Advice *ad, const void *p, size_t len) {
    uintptr_t page = page_bytes, mask = ~(page - 1);
    uintptr_t a = (uintptr_t)p & mask, e = ((uintptr_t)p + (len ? len : 1) + page - 1) & mask;
    if (e - a == page) {
        uintptr_t *slot = &ad->advised[((a / page) * 0x9E3779B97F4A7C15ull) >> 52];
        if (*slot == a) return;
        *slot = a;
    }
    madvise((void *)a, e - a, MADV_WILLNEED);
    ad->calls++;
}

/* Advise a span of any length: the kernel reads at most the larger of the device's read-ahead
 * and its largest request per call (128 KB to a few MB). */
static void advise_span(Advice *ad, const void *p, size_t len) {
    const size_t piece = (size_t)128 << 10;
    for (size_t at = 0; at < len; at += piece)
        advise(ad, (const char *)p + at, len - at < piece ? len - at : piece);
}

/* A search for the first position in [a, a + n) whose value is >= v (> v when `after`), or,
 * while `step` > 0, a gallop from a within [a, b) (`gallop_col`'s first phase). */
typedef struct {
    Py_ssize_t a, n, b, step;
    i64 v;
    int after;
    uintptr_t page; /* the page it read last (read again: not advised again) */
} Seek;

/* The next position a seek reads (-1: none left), turning a gallop that has run out of room
 * into its binary search. */
static inline Py_ssize_t seek_next(Seek *x) {
    if (x->step > 0) {
        if (x->a + x->step < x->b) return x->a + x->step;
        x->n = x->b - x->a;
        x->step = 0;
    }
    return x->n > 1 ? x->a + (x->n >> 1) : -1;
}

/* Every seek in column c, as `bsearch_col` and `gallop_col` make them, one level at a time:
 * the pages a level reads advised for all seeks before any is read. Each seek's answer is
 * left in its `a`. */
static void seek_all(Col c, Seek *s, Py_ssize_t k, Advice *ad) {
    uintptr_t mask = ~(page_bytes - 1);
    for (Py_ssize_t q = 0; q < k; q++) {
        s[q].page = (uintptr_t)col_addr(c, s[q].a) & mask;
        if (s[q].n > 0 || s[q].step > 0) advise(ad, col_addr(c, s[q].a), 8);
    }
    for (;;) {
        int more = 0;
        for (Py_ssize_t q = 0; q < k; q++) {
            Seek *x = &s[q];
            Py_ssize_t at = seek_next(x);
            if (at < 0) continue;
            more = 1;
            uintptr_t page = (uintptr_t)col_addr(c, at) & mask;
            if (page == x->page) continue;
            x->page = page;
            advise(ad, col_addr(c, at), 8);
        }
        if (!more) break;
        for (Py_ssize_t q = 0; q < k; q++) {
            Seek *x = &s[q];
            if (x->step > 0) { /* seek_next left it galloping: a + step < b */
                i64 at = col_at(c, x->a + x->step);
                if (at < x->v || (x->after && at == x->v)) {
                    x->a += x->step;
                    x->step <<= 1;
                } else {
                    x->n = x->step + 1; /* gallop_col's search of [a, a + step] */
                    x->step = 0;
                }
                continue;
            }
            if (x->n <= 1) continue;
            Py_ssize_t half = x->n >> 1;
            i64 at = col_at(c, x->a + half);
            if (x->after ? at <= x->v : at < x->v) x->a += half;
            x->n -= half;
        }
    }
    for (Py_ssize_t q = 0; q < k; q++) {
        Seek *x = &s[q];
        if (x->n == 1) x->a += x->after ? col_at(c, x->a) <= x->v : col_at(c, x->a) < x->v;
        x->n = 0;
    }
}

/* What a pass reads ahead in one layer: the key of p prefix (or probe) columns at[0..p), then
 * what the loop reads of each key's range (bits of `what`). */
enum { AH_RANGE = 1, AH_DIFFS = 2, AH_DIFF0 = 4 };

typedef struct {
    const Layer *L;
    const Py_ssize_t *at;
    int p;
    int next; /* the column walked within a key's range (AH_RANGE) */
    int what;
} Want;

typedef struct {
    const i64 *const *cols;
    const Py_ssize_t *at;
    int p;
} KeyOf;

static int key_cmp(const void *x, const void *y, void *arg) {
    const KeyOf *k = arg;
    Py_ssize_t a = *(const Py_ssize_t *)x, b = *(const Py_ssize_t *)y;
    for (int j = 0; j < k->p; j++) {
        i64 u = k->cols[k->at[j]][a], w = k->cols[k->at[j]][b];
        if (u != w) return u < w ? -1 : 1;
    }
    return 0;
}

/* qsort's comparison by the key being sorted (qsort_r is not portable: glibc's and the BSDs'
 * differ in their arguments) */
static _Thread_local const KeyOf *sorting;
static int sorting_cmp(const void *x, const void *y) { return key_cmp(x, y, (void *)sorting); }

/* The key ranges [lo[q], hi[q]) in L of the k probe rows `rows` (sorted by key, each key
 * once), found by `seek_all` column after column (the first by L's directory when it has one);
 * s has room for 2k seeks. */
static void ahead_keys(const Layer *L, const KeyOf *key, const Py_ssize_t *rows, Py_ssize_t k,
                       Py_ssize_t *lo, Py_ssize_t *hi, Seek *s, Advice *ad) {
    for (Py_ssize_t q = 0; q < k; q++) {
        lo[q] = 0;
        hi[q] = L->n;
    }
    for (int j = 0; j < key->p; j++) {
        const i64 *probe = key->cols[key->at[j]];
        if (j == 0 && L->dir.p) {
            /* a directory mapped from its segment file is read ahead like a column: every
             * probe's entries advised first, then read (unchecked: what is read ahead is only
             * advice, each entry kept within the layer's rows) */
            for (Py_ssize_t q = 0; q < k; q++) {
                u64 off = (u64)probe[rows[q]] - (u64)L->dir_low;
                if (off < (u64)L->dir_span) advise(ad, col_addr(L->dir, (Py_ssize_t)off), col_bytes(L->dir, 2));
            }
            for (Py_ssize_t q = 0; q < k; q++) {
                u64 off = (u64)probe[rows[q]] - (u64)L->dir_low;
                lo[q] = hi[q] = 0;
                if (off >= (u64)L->dir_span) continue;
                i64 a = col_at(L->dir, (Py_ssize_t)off), b = col_at(L->dir, (Py_ssize_t)off + 1);
                if (a >= 0 && a <= b && b <= L->n) { lo[q] = a; hi[q] = b; }
            }
            continue;
        }
        /* as `key_range`: the key's first row by a binary search, its end galloping from it */
        Col c = L->cols[j];
        Py_ssize_t ns = 0;
        for (Py_ssize_t q = 0; q < k; q++)
            if (lo[q] < hi[q]) s[ns++] = (Seek){lo[q], hi[q] - lo[q], hi[q], 0, probe[rows[q]], 0};
        seek_all(c, s, ns, ad);
        ns = 0;
        for (Py_ssize_t q = 0; q < k; q++)
            if (lo[q] < hi[q]) {
                Py_ssize_t a = s[ns++].a;
                if (a < hi[q]) advise(ad, col_addr(c, a), 8); /* read next: may be the next page */
            }
        Seek *g = s + k; /* the gallops (s has room for 2k seeks) */
        ns = 0;
        for (Py_ssize_t q = 0; q < k; q++) {
            if (lo[q] >= hi[q]) {
                g[q] = (Seek){lo[q], 0, lo[q], 0, 0, 1};
                continue;
            }
            Py_ssize_t a = s[ns++].a;
            i64 v = probe[rows[q]];
            if (a < hi[q] && col_at(c, a) == v) g[q] = (Seek){a, 0, hi[q], 1, v, 1};
            else g[q] = (Seek){a, 0, a, 0, v, 1}; /* absent: the range is empty */
            lo[q] = a;
        }
        seek_all(c, g, k, ad);
        for (Py_ssize_t q = 0; q < k; q++)
            if (lo[q] < hi[q]) hi[q] = g[q].a;
    }
}

/* Read ahead what a loop over probe rows [i0, i1) (through `live` when given) will read of
 * each wanted layer (see the section's comment); returns whether it was worth it (this thread
 * read at least one page in `AHEAD_WORTH` of those it advised). A
 * layer probed by a large share of its rows has its columns advised whole instead (its pages
 * are most of what the searches read). */
static int ahead(const Want *wants, int nw, const i64 *const *cols, const i64 *live,
                 Py_ssize_t i0, Py_ssize_t i1) {
    Py_ssize_t m = i1 - i0;
    if (m <= 0) return 0;
    long before = thread_usage(0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Advice *ad = calloc(1, sizeof(Advice));
    Py_ssize_t most = m < AHEAD_CHUNK ? m : AHEAD_CHUNK;
    Py_ssize_t *rows = malloc(sizeof(Py_ssize_t) * (size_t)most);
    Py_ssize_t *lo = malloc(sizeof(Py_ssize_t) * (size_t)most);
    Py_ssize_t *hi = malloc(sizeof(Py_ssize_t) * (size_t)most);
    Seek *s = malloc(sizeof(Seek) * 2 * (size_t)most);
    int ok = ad && rows && lo && hi && s;
    int searched[MAXX * MAXL];
    for (int w = 0; ok && w < nw; w++) {
        const Layer *L = wants[w].L;
        searched[w] = L->n >= ahead_min_rows && wants[w].p >= 1 && wants[w].p <= L->width;
        if (!searched[w] || m * 4096 <= L->n) continue;
        /* probes many for the layer's size: its columns whole (and its directory) */
        searched[w] = 0;
        for (int j = 0; j < L->width; j++)
            if (L->cols[j].p) advise_span(ad, L->cols[j].p, col_bytes(L->cols[j], L->n));
        if (L->dir.p) advise_span(ad, L->dir.p, col_bytes(L->dir, L->dir_span + 1));
        if (!L->unit && wants[w].what & (AH_DIFFS | AH_DIFF0))
            advise_span(ad, L->diff.p, col_bytes(L->diff, L->n));
    }
    for (Py_ssize_t c0 = i0; ok && c0 < i1; c0 += most) {
        Py_ssize_t c1 = c0 + most < i1 ? c0 + most : i1;
        const Py_ssize_t *sorted_at = NULL; /* the key `rows` is sorted and unique by */
        int sorted_p = -1;
        Py_ssize_t k = 0;
        for (int w = 0; w < nw; w++) {
            const Want *x = &wants[w];
            const Layer *L = x->L;
            if (!searched[w]) continue;
            KeyOf key = {cols, x->at, x->p};
            if (sorted_p != x->p || memcmp(sorted_at, x->at, sizeof(Py_ssize_t) * (size_t)x->p)) {
                for (Py_ssize_t i = c0; i < c1; i++) rows[i - c0] = live ? live[i] : i;
                sorting = &key;
                qsort(rows, (size_t)(c1 - c0), sizeof(Py_ssize_t), sorting_cmp);
                k = 0;
                for (Py_ssize_t i = 0; i < c1 - c0; i++)
                    if (!k || key_cmp(&rows[k - 1], &rows[i], &key)) rows[k++] = rows[i];
                sorted_at = x->at;
                sorted_p = x->p;
            }
            ahead_keys(L, &key, rows, k, lo, hi, s, ad);
            for (Py_ssize_t q = 0; q < k; q++) {
                if (lo[q] >= hi[q]) continue;
                size_t bytes = sizeof(i64) * (size_t)(hi[q] - lo[q]);
                if (x->what & AH_DIFF0 && !L->unit) advise(ad, col_addr(L->diff, lo[q]), 8);
                if (bytes > AHEAD_RANGE_BYTES || ad->range_bytes + bytes > AHEAD_PASS_BYTES)
                    continue;
                if (x->what & AH_RANGE && x->next < L->width && L->cols[x->next].p) {
                    Col c = L->cols[x->next];
                    advise_span(ad, col_addr(c, lo[q]), col_bytes(c, hi[q] - lo[q]));
                    ad->range_bytes += bytes;
                }
                if (x->what & AH_DIFFS && !L->unit) {
                    advise_span(ad, col_addr(L->diff, lo[q]), col_bytes(L->diff, hi[q] - lo[q]));
                    ad->range_bytes += bytes;
                }
            }
        }
    }
    free(rows);
    free(lo);
    free(hi);
    free(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    __atomic_fetch_add(&ahead_ns, (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec),
                       __ATOMIC_RELAXED);
    __atomic_fetch_add(&ahead_passes, 1, __ATOMIC_RELAXED);
    long long calls = ad ? ad->calls : 0;
    __atomic_fetch_add(&ahead_calls, calls, __ATOMIC_RELAXED);
    free(ad);
    /* worth it: the pages read (the thread's reads are counted in 512-byte blocks) are not a
     * stray few among the pages advised */
    long long pages = (long long)(thread_usage(0) - before) * 512 / (long long)page_bytes;
    return pages > 0 && pages * AHEAD_WORTH >= calls;
}

/* Whether any wanted layer is large enough to read ahead. */
static int ahead_worth(const Want *wants, int nw) {
    for (int w = 0; w < nw; w++)
        if (wants[w].L->n >= ahead_min_rows && wants[w].p >= 1) return 1;
    return 0;
}

/* A loop's watch over its probes [i0, i1) (see the section's comment): `watch_begin` before
 * the first probe, `watch_at` before probe i. */
typedef struct {
    const Want *wants;
    int nw;
    const i64 *const *cols;
    const i64 *live;
    Py_ssize_t i0, i1;
    int armed;
    long faults;
    i64 since;          /* the clock at the last check */
    Py_ssize_t checked; /* the probe then */
} Watch;

static inline i64 now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (i64)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void watch_begin(Watch *wt) {
    wt->armed = 0;
    wt->faults = 0;
    if (!ahead_worth(wt->wants, wt->nw)) return;
    int mode = __atomic_load_n(&ahead_mode, __ATOMIC_RELAXED);
    if (mode == AH_NEVER) return;
    int on = mode == AH_ALWAYS ? AHEAD_ON : __atomic_load_n(&ahead_on, __ATOMIC_RELAXED);
    Py_ssize_t from = wt->i0;
    if (on == AHEAD_UNKNOWN) {
        from = wt->i0 + AHEAD_SAMPLE < wt->i1 ? wt->i0 + AHEAD_SAMPLE : wt->i1;
        on = ahead(wt->wants, wt->nw, wt->cols, wt->live, wt->i0, from) ? AHEAD_ON : AHEAD_OFF;
        __atomic_store_n(&ahead_on, on, __ATOMIC_RELAXED);
    }
    if (on == AHEAD_ON) {
        /* next to nothing read: the pages were in memory (the process is warm) */
        if (from < wt->i1 && !ahead(wt->wants, wt->nw, wt->cols, wt->live, from, wt->i1) &&
            mode == AH_FAULTS)
            __atomic_store_n(&ahead_on, AHEAD_OFF, __ATOMIC_RELAXED);
        return;
    }
    wt->armed = mode == AH_FAULTS;
    if (wt->armed) {
        wt->faults = thread_usage(1);
        wt->since = now_ns();
        wt->checked = wt->i0;
    }
}

static inline void watch_at(Watch *wt, Py_ssize_t i) {
    if (!wt->armed || (i - wt->i0) % AHEAD_EVERY != 1) return;
    /* the clock first (tens of nanoseconds): only probes slow on average can have faulted */
    i64 t = now_ns(), took = t - wt->since;
    int slow = took > AHEAD_SLOW_NS * (i - wt->checked);
    wt->since = t;
    wt->checked = i;
    if (!slow || thread_usage(1) == wt->faults) return;
    wt->armed = 0;
    __atomic_store_n(&ahead_on, AHEAD_ON, __ATOMIC_RELAXED);
    ahead(wt->wants, wt->nw, wt->cols, wt->live, i, wt->i1);
}

/* The probe columns (m rows each) into cols, at[j] = j: how many, or -1 with the error set
 * (more than `most`: `too_many`). */
static int probe_columns(Held *h, PyObject *probes_o, Py_ssize_t m, int most, const char *too_many,
                         const i64 **cols, Py_ssize_t *at) {
    PyObject *fast = PySequence_Fast(probes_o, "probe columns");
    if (!fast) return -1;
    int p = (int)PySequence_Fast_GET_SIZE(fast);
    int ok = p <= most && p <= MAXW;
    if (!ok) PyErr_SetString(PyExc_ValueError, too_many);
    for (int j = 0; ok && j < p; j++) {
        cols[j] = take(h, PySequence_Fast_GET_ITEM(fast, j), 8, 0, m, NULL, "probe column");
        at[j] = j;
        ok = cols[j] != NULL;
    }
    Py_DECREF(fast);
    return ok ? p : -1;
}

/* seek_ranges(layer, probe columns, m, lo out, hi out) -> madvise calls: the key ranges
 * `ahead` finds, level by level, for m probes in probe order (what `ranges` finds: a test). */
static PyObject *py_seek_ranges(PyObject *self, PyObject *args) {
    PyObject *layer_o, *probes_o, *lo_o, *hi_o;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "OOnOO", &layer_o, &probes_o, &m, &lo_o, &hi_o)) return NULL;
    Held h = {.count = 0};
    Layer L;
    if (parse_layer(&h, layer_o, &L) < 0) { release(&h); return NULL; }
    const i64 *cols[MAXW];
    Py_ssize_t at[MAXW];
    int p = probe_columns(&h, probes_o, m, L.width, "more probe columns than the layer has", cols, at);
    if (p < 0) { release(&h); return NULL; }
    int ok = 1;
    i64 *lo = ok ? take(&h, lo_o, 8, 1, m, NULL, "lo") : NULL;
    i64 *hi = lo ? take(&h, hi_o, 8, 1, m, NULL, "hi") : NULL;
    if (!hi) { release(&h); return NULL; }
    Py_ssize_t *rows = malloc(sizeof(Py_ssize_t) * (size_t)(m ? m : 1));
    Seek *s = malloc(sizeof(Seek) * 2 * (size_t)(m ? m : 1));
    Advice *ad = calloc(1, sizeof(Advice));
    if (!rows || !s || !ad) {
        free(rows);
        free(s);
        free(ad);
        release(&h);
        return PyErr_NoMemory();
    }
    KeyOf key = {cols, at, p};
    for (Py_ssize_t i = 0; i < m; i++) rows[i] = i;
    Py_BEGIN_ALLOW_THREADS
    ahead_keys(&L, &key, rows, m, (Py_ssize_t *)lo, (Py_ssize_t *)hi, s, ad);
    Py_END_ALLOW_THREADS
    long long calls = ad->calls;
    free(rows);
    free(s);
    free(ad);
    release(&h);
    return PyLong_FromLongLong(calls);
}

/* read_ahead(mode or -1, least rows or -1): the mode (0 never, 1 after a fault, 2 always),
 * whether the process reads ahead now, the passes made and the madvise calls they made; sets
 * the mode when >= 0 (and the fewest rows of a layer read ahead, when >= 0: tests). */
static PyObject *py_read_ahead(PyObject *self, PyObject *args) {
    int mode = -1;
    Py_ssize_t least = -1;
    if (!PyArg_ParseTuple(args, "|in", &mode, &least)) return NULL;
    if (mode > AH_ALWAYS) return PyErr_Format(PyExc_ValueError, "read-ahead mode %d (0, 1 or 2)", mode);
    if (mode >= 0) {
        __atomic_store_n(&ahead_mode, mode, __ATOMIC_RELAXED);
        __atomic_store_n(&ahead_on, AHEAD_UNKNOWN, __ATOMIC_RELAXED);
    }
    if (least >= 0) __atomic_store_n(&ahead_min_rows, least, __ATOMIC_RELAXED);
    return Py_BuildValue("iiLLd", __atomic_load_n(&ahead_mode, __ATOMIC_RELAXED),
                         __atomic_load_n(&ahead_on, __ATOMIC_RELAXED),
                         __atomic_load_n(&ahead_passes, __ATOMIC_RELAXED),
                         __atomic_load_n(&ahead_calls, __ATOMIC_RELAXED),
                         (double)__atomic_load_n(&ahead_ns, __ATOMIC_RELAXED) * 1e-9);
}

/* -- sorting and consolidating ------------------------------------------------------------ */

/* Stable LSD radix sort of uint64 keys: the sorted keys into `out` and the permutation into
 * `order` (or none). The digits cover the keys' highest set bit in as few passes of at most
 * 11 bits as they can (a 38-bit key: four passes of 10 bits; wider digits scatter to more places
 * than the caches hold, measured slower); a digit every key shares is skipped. With
 * `threads` > 1 each pass runs on that many threads, each counting and then moving its own
 * share of the keys to the places the counts of all give it (stable: a thread's keys go
 * after the same digit's keys of the threads before it). Returns -1 out of memory. */
enum { RBITS_MAX = 11, RADIX_MAX = 1 << RBITS_MAX, RTHREADS_MAX = 16 };

typedef struct {
    Py_ssize_t n;
    int threads, passes, bits;
    u64 *k[2];
    i64 *o[2];
    size_t *hist; /* threads x RADIX_MAX counts of the current pass */
    size_t *at;   /* threads x RADIX_MAX places the next key of each digit goes */
    pthread_barrier_t bar;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    int go;    /* the threads that started are known: the shares are set */
    int final; /* which buffer holds the result */
} RSort;

typedef struct {
    RSort *rs;
    int tid;
} RArg;

static void *radix_worker(void *varg) {
    RArg *arg = varg;
    RSort *rs = arg->rs;
    pthread_mutex_lock(&rs->lock);
    while (!rs->go) pthread_cond_wait(&rs->ready, &rs->lock);
    pthread_mutex_unlock(&rs->lock);
    int tid = arg->tid, T = rs->threads, radix = 1 << rs->bits;
    Py_ssize_t lo = rs->n * tid / T, hi = rs->n * (tid + 1) / T;
    size_t *mine = rs->hist + (size_t)tid * RADIX_MAX;
    size_t *at = rs->at + (size_t)tid * RADIX_MAX;
    int src = 0;
    for (int p = 0; p < rs->passes; p++) {
        int shift = p * rs->bits;
        u64 mask = (u64)radix - 1;
        const u64 *sk = rs->k[src];
        memset(mine, 0, sizeof(size_t) * (size_t)radix);
        for (Py_ssize_t i = lo; i < hi; i++) mine[(sk[i] >> shift) & mask]++;
        if (T > 1) pthread_barrier_wait(&rs->bar);
        /* this thread's first place for each digit; a digit every key has: nothing moves */
        size_t running = 0;
        int trivial = 0;
        for (int d = 0; d < radix; d++) {
            size_t total = 0, before = 0;
            for (int t = 0; t < T; t++) {
                size_t c = rs->hist[(size_t)t * RADIX_MAX + d];
                if (t < tid) before += c;
                total += c;
            }
            if (total == (size_t)rs->n) trivial = 1;
            at[d] = running + before;
            running += total;
        }
        if (T > 1) pthread_barrier_wait(&rs->bar); /* every count read before the next pass's */
        if (trivial) continue;
        u64 *dk = rs->k[1 - src];
        if (rs->o[0]) {
            const i64 *so = rs->o[src];
            i64 *dst_o = rs->o[1 - src];
            for (Py_ssize_t i = lo; i < hi; i++) {
                u64 k = sk[i];
                size_t to = at[(k >> shift) & mask]++;
                dk[to] = k;
                dst_o[to] = so[i];
            }
        } else {
            for (Py_ssize_t i = lo; i < hi; i++) {
                u64 k = sk[i];
                dk[at[(k >> shift) & mask]++] = k;
            }
        }
        if (T > 1) pthread_barrier_wait(&rs->bar); /* every key moved before the next pass */
        src = 1 - src;
    }
    if (tid == 0) rs->final = src;
    return NULL;
}

static int radix_argsort(const u64 *keys, Py_ssize_t n, u64 *out, i64 *order, int threads) {
    int sorted = 1;
    u64 seen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        u64 k = keys[i];
        seen |= k;
        if (i && keys[i - 1] > k) sorted = 0;
    }
    if (out != keys) memcpy(out, keys, sizeof(u64) * (size_t)n);
    if (order)
        for (Py_ssize_t i = 0; i < n; i++) order[i] = i;
    if (sorted) return 0;
    int used = 64 - __builtin_clzll(seen); /* seen != 0: the keys are not all equal */
    int passes = (used + RBITS_MAX - 1) / RBITS_MAX;
    if (threads < 1 || n < (1 << 16)) threads = 1;
    if (threads > RTHREADS_MAX) threads = RTHREADS_MAX;
    RSort rs = {.n = n, .threads = threads, .passes = passes,
                .bits = (used + passes - 1) / passes, .k = {out, NULL}, .o = {order, NULL}};
    rs.k[1] = malloc(sizeof(u64) * (size_t)n);
    rs.o[1] = order ? malloc(sizeof(i64) * (size_t)n) : NULL;
    rs.hist = malloc(sizeof(size_t) * RADIX_MAX * (size_t)threads);
    rs.at = malloc(sizeof(size_t) * RADIX_MAX * (size_t)threads);
    int rc = 0;
    if (!rs.k[1] || (order && !rs.o[1]) || !rs.hist || !rs.at) rc = -1;
    if (rc == 0) {
        RArg args[RTHREADS_MAX];
        pthread_t ids[RTHREADS_MAX];
        int started = 0;
        pthread_mutex_init(&rs.lock, NULL);
        pthread_cond_init(&rs.ready, NULL);
        for (int t = 0; t < threads; t++) args[t] = (RArg){.rs = &rs, .tid = t};
        for (int t = 1; t < threads && pthread_create(&ids[t], NULL, radix_worker, &args[t]) == 0; t++)
            started++;
        /* the shares among the threads that did start (this one and `started` more) */
        rs.threads = started + 1;
        if (rs.threads > 1) pthread_barrier_init(&rs.bar, NULL, (unsigned)rs.threads);
        pthread_mutex_lock(&rs.lock);
        rs.go = 1;
        pthread_cond_broadcast(&rs.ready);
        pthread_mutex_unlock(&rs.lock);
        radix_worker(&args[0]);
        for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
        if (rs.threads > 1) pthread_barrier_destroy(&rs.bar);
        pthread_mutex_destroy(&rs.lock);
        pthread_cond_destroy(&rs.ready);
    }
    if (rc == 0 && rs.final == 1) {
        memcpy(out, rs.k[1], sizeof(u64) * (size_t)n);
        if (order) memcpy(order, rs.o[1], sizeof(i64) * (size_t)n);
    }
    free(rs.k[1]);
    free(rs.o[1]);
    free(rs.hist);
    free(rs.at);
    return rc;
}

static PyObject *py_argsort(PyObject *self, PyObject *args) {
    PyObject *keys_o, *out_o, *order_o;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOO|i", &keys_o, &out_o, &order_o, &threads)) return NULL;
    Held h = {.count = 0};
    Py_ssize_t n;
    const u64 *keys = take(&h, keys_o, 8, 0, -1, &n, "keys");
    u64 *out = keys ? take(&h, out_o, 8, 1, n, NULL, "sorted keys") : NULL; /* may be keys */
    i64 *order = NULL;
    if (out && order_o != Py_None) order = take(&h, order_o, 8, 1, n, NULL, "order");
    if (!out || (order_o != Py_None && !order)) { release(&h); return NULL; }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = radix_argsort(keys, n, out, order, threads);
    Py_END_ALLOW_THREADS
    release(&h);
    if (rc < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* consolidate(sorted keys, diff, order or None, sums out): runs of equal keys summed
 * exactly, in place: each kept run's key moves to the front of `keys` and its sum into `sums`
 * (runs summing to 0 dropped). `diff` is read through `order` when given; a `diff` of one item
 * is every row's. Returns the number of runs kept, or -(run start + 1) of the first run whose
 * sum leaves int64 (the keys then as they were). */
static PyObject *py_consolidate(PyObject *self, PyObject *args) {
    PyObject *keys_o, *diff_o, *order_o, *sums_o;
    if (!PyArg_ParseTuple(args, "OOOO", &keys_o, &diff_o, &order_o, &sums_o)) return NULL;
    Held h = {.count = 0};
    Py_ssize_t n;
    u64 *keys = take(&h, keys_o, 8, 1, -1, &n, "keys");
    Py_ssize_t nd = 0;
    const i64 *diff = keys ? take(&h, diff_o, 8, 0, -1, &nd, "diff") : NULL;
    int same = diff && nd == 1 && n > 1; /* one diff for every row */
    if (diff && !same && nd < n) {
        PyErr_SetString(PyExc_ValueError, "diff: too short");
        diff = NULL;
    }
    const i64 *order = NULL;
    if (diff && order_o != Py_None && !same) order = take(&h, order_o, 8, 0, n, NULL, "order");
    if (diff && order_o != Py_None && !same && !order) { release(&h); return NULL; }
    i64 *sums = diff ? take(&h, sums_o, 8, 1, n, NULL, "sums") : NULL;
    if (!sums) { release(&h); return NULL; }
    Py_ssize_t kept = 0, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    /* a first pass finds an overflow before any key moves */
    for (Py_ssize_t i = 0, j; i < n && bad < 0; i = j) {
        i128 s = same ? diff[0] : order ? diff[order[i]] : diff[i];
        for (j = i + 1; j < n && keys[j] == keys[i]; j++) s += same ? diff[0] : order ? diff[order[j]] : diff[j];
        if (s > INT64_MAX || s < INT64_MIN) bad = i;
        else sums[i] = (i64)s; /* at the run's start: read again below */
    }
    if (bad < 0)
        for (Py_ssize_t i = 0, j; i < n; i = j) {
            u64 k = keys[i];
            for (j = i + 1; j < n && keys[j] == k; j++) {}
            i64 s = j == i + 1 ? (same ? diff[0] : order ? diff[order[i]] : diff[i]) : sums[i];
            if (s != 0) { keys[kept] = k; sums[kept] = s; kept++; }
        }
    Py_END_ALLOW_THREADS
    release(&h);
    return PyLong_FromSsize_t(bad >= 0 ? -(bad + 1) : kept);
}

/* Positions of `n` ascending sorted values' runs: dir[k - low] = first row with value >= k. */
static PyObject *py_directory(PyObject *self, PyObject *args) {
    PyObject *col_o, *dir_o;
    long long low;
    if (!PyArg_ParseTuple(args, "OOL", &col_o, &dir_o, &low)) return NULL;
    Held h = {.count = 0};
    Py_ssize_t n, span;
    const i64 *col = take(&h, col_o, 8, 0, -1, &n, "column");
    i64 *dir = col ? take(&h, dir_o, 8, 1, -1, &span, "directory") : NULL;
    if (!dir) { release(&h); return NULL; }
    span -= 1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k <= span; k++) {
        i64 key = (i64)((u64)low + (u64)k);
        while (at < n && col[at] < key) at++;
        dir[k] = at;
    }
    dir[span] = n;
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_NONE;
}

/* -- products ----------------------------------------------------------------------------- */

/* out = a * b elementwise; flags |= whether the exact product leaves int64. Returns whether
 * any row is flagged (before or now). */
static PyObject *py_multiply(PyObject *self, PyObject *args) {
    PyObject *a_o, *b_o, *out_o, *flags_o;
    if (!PyArg_ParseTuple(args, "OOOO", &a_o, &b_o, &out_o, &flags_o)) return NULL;
    Held h = {.count = 0};
    Py_ssize_t n;
    const i64 *a = take(&h, a_o, 8, 0, -1, &n, "a");
    const i64 *b = a ? take(&h, b_o, 8, 0, n, NULL, "b") : NULL;
    i64 *out = b ? take(&h, out_o, 8, 1, n, NULL, "product") : NULL;
    uint8_t *flags = out ? take(&h, flags_o, 1, 1, n, NULL, "flags") : NULL;
    if (!flags) { release(&h); return NULL; }
    int any = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        i64 r;
        if (__builtin_mul_overflow(a[i], b[i], &r)) flags[i] = 1;
        out[i] = r;
        any |= flags[i];
    }
    Py_END_ALLOW_THREADS
    release(&h);
    return PyBool_FromLong(any);
}

/* -- lookups ------------------------------------------------------------------------------ */

/* Gather a probe's key (p columns of row r) into key. */
static inline void gather_key(const i64 *const *cols, const Py_ssize_t *at, int p, Py_ssize_t r,
                              i64 *key) {
    for (int j = 0; j < p; j++) key[j] = cols[at[j]][r];
}

/* The diff of the whole row `key` (width columns) in L, 0 when absent. The range of its first
 * width-1 columns is memoized; its last column gallops from `*hint` when it moves forward. */
static inline i64 row_diff(Layer *L, const i64 *key, Py_ssize_t *hint, i64 *last) {
    int w = L->width;
    if (w == 0) return L->n && rows_checked(L, 0, 0, 1) ? diff_at(L, 0) : 0;
    if (w == 1 && L->dir.p) {
        /* a one-column layer holds each value once: its directory finds it in one step */
        Py_ssize_t at, end;
        dir_range(L, (u64)key[0] - (u64)L->dir_low, &at, &end);
        return at < end && rows_checked(L, 1, at, at + 1) ? diff_at(L, at) : 0;
    }
    Py_ssize_t lo, hi;
    int fresh = !(L->memo_p == w - 1);
    if (!fresh)
        for (int j = 0; j < w - 1; j++)
            if (L->memo_key[j] != key[j]) { fresh = 1; break; }
    key_range(L, key, w - 1, &lo, &hi);
    i64 v = key[w - 1];
    Py_ssize_t at;
    Col c = L->cols[w - 1];
    if (!fresh && *hint >= lo && *hint <= hi && v >= *last) at = gallop_col(c, *hint, hi, v, 0);
    else at = bsearch_col(c, lo, hi, v, 0);
    *hint = at;
    *last = v;
    return (at < hi && col_at(c, at) == v) ? diff_at(L, at) : 0;
}

/* out[i] = the exact sum over the layers of row i's diff (the probe columns are whole rows).
 * Returns -1, or the first row whose sum leaves int64. */
static PyObject *py_lookup(PyObject *self, PyObject *args) {
    PyObject *layers_o, *probes_o, *out_o;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "OOnO", &layers_o, &probes_o, &m, &out_o)) return NULL;
    Held h = {.count = 0};
    Layer L[MAXL];
    int nl;
    if (parse_layers(&h, layers_o, L, &nl) < 0) { release(&h); return NULL; }
    const i64 *cols[MAXW];
    Py_ssize_t at[MAXW];
    int p = probe_columns(&h, probes_o, m, MAXW, "too many probe columns", cols, at);
    if (p < 0) { release(&h); return NULL; }
    int ok = 1;
    for (int l = 0; ok && l < nl; l++)
        if (L[l].width != p) {
            PyErr_Format(PyExc_ValueError, "%d probe columns for a layer of %d", p, L[l].width);
            ok = 0;
        }
    i64 *out = ok ? take(&h, out_o, 8, 1, m, NULL, "out") : NULL;
    if (!out) { release(&h); return NULL; }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t hint[MAXL];
    i64 last[MAXL];
    i64 key[MAXW];
    Want wants[MAXL];
    for (int l = 0; l < nl; l++) {
        hint[l] = -1;
        last[l] = 0;
        wants[l] = (Want){&L[l], at, p, -1, AH_DIFF0};
    }
    Watch wt = {wants, nl, cols, NULL, 0, m};
    watch_begin(&wt);
    for (Py_ssize_t i = 0; i < m; i++) {
        watch_at(&wt, i);
        if (p > 0 && i + PF_FAR < m)
            for (int l = 0; l < nl; l++) prefetch_dir(&L[l], cols[0][i + PF_FAR]);
        if (p > 0 && i + PF_NEAR < m)
            for (int l = 0; l < nl; l++)
                prefetch_rows(&L[l], cols[0][i + PF_NEAR], p > 1 ? p - 1 : -1, 1);
        gather_key(cols, at, p, i, key);
        i128 s = 0;
        for (int l = 0; l < nl; l++) s += row_diff(&L[l], key, &hint[l], &last[l]);
        if (s > INT64_MAX || s < INT64_MIN) { bad = i; break; }
        out[i] = (i64)s;
    }
    Py_END_ALLOW_THREADS
    release(&h);
    return PyLong_FromSsize_t(bad);
}

/* lo/hi[i] = the rows of layer starting with probe i's p columns, narrowed to those whose
 * next column lies within [low[i], high[i]] when bounds are given. */
static PyObject *py_ranges(PyObject *self, PyObject *args) {
    PyObject *layer_o, *probes_o, *low_o, *high_o, *lo_o, *hi_o;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "OOnOOOO", &layer_o, &probes_o, &m, &low_o, &high_o, &lo_o, &hi_o))
        return NULL;
    Held h = {.count = 0};
    Layer L;
    if (parse_layer(&h, layer_o, &L) < 0) { release(&h); return NULL; }
    const i64 *cols[MAXW];
    Py_ssize_t at[MAXW];
    int most = low_o == Py_None ? L.width : L.width - 1; /* a bounded next column needs room */
    int p = probe_columns(&h, probes_o, m, most, "more probe columns than the layer has", cols, at);
    if (p < 0) { release(&h); return NULL; }
    if (low_o != Py_None && !L.cols[p].p) { /* (and its values) */
        PyErr_SetString(PyExc_ValueError, "bounds on a column the layer was given without");
        release(&h);
        return NULL;
    }
    int ok = 1;
    const i64 *low = NULL, *high = NULL;
    if (ok && low_o != Py_None) {
        low = take(&h, low_o, 8, 0, m, NULL, "low");
        high = low ? take(&h, high_o, 8, 0, m, NULL, "high") : NULL;
        ok = high != NULL;
    }
    i64 *lo = ok ? take(&h, lo_o, 8, 1, m, NULL, "lo") : NULL;
    i64 *hi = lo ? take(&h, hi_o, 8, 1, m, NULL, "hi") : NULL;
    if (!hi) { release(&h); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    i64 key[MAXW];
    Want want = {&L, at, p, p, low ? AH_RANGE : 0};
    Watch wt = {&want, 1, cols, NULL, 0, m};
    watch_begin(&wt);
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t a, b;
        watch_at(&wt, i);
        gather_key(cols, at, p, i, key);
        key_range(&L, key, p, &a, &b);
        if (low && a < b) {
            if (low[i] > high[i]) b = a;
            else {
                a = bsearch_col(L.cols[p], a, b, low[i], 0);
                b = bsearch_col(L.cols[p], a, b, high[i], 1);
            }
        }
        lo[i] = a;
        hi[i] = b;
    }
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_NONE;
}

/* -- a join step -------------------------------------------------------------------------- */

/* An extender: its layers, where its key's columns are among the prefix's, and how it counts
 * (its counts layers, or the size of its key's range in its one source layer). */
typedef struct {
    Layer source[MAXL];
    int nsource;
    Layer counts[MAXL];
    int ncounts;
    int by_range;
    int p;
    Py_ssize_t key[MAXW];
    int completes;
    /* per prefix: the key's range in each source layer, and galloping cursors */
    i64 kv[MAXW];
    Py_ssize_t lo[MAXL], hi[MAXL], cur[MAXL];
    int ready;
    /* the last key's range in a one-layer extender narrowed to bounds (see `narrowed`) */
    int nmemo;
    i64 nkey[MAXW], nlow, nhigh;
    Py_ssize_t nlo, nhi;
} Ext;

/* (source layers, counts layers or None, key column positions, completes) */
static int parse_ext(Held *h, PyObject *spec, Ext *x) {
    PyObject *source, *counts, *key;
    int completes;
    if (!PyArg_ParseTuple(spec, "OOOp", &source, &counts, &key, &completes)) return -1;
    if (parse_layers(h, source, x->source, &x->nsource) < 0) return -1;
    x->by_range = counts == Py_None;
    x->ncounts = 0;
    if (!x->by_range && parse_layers(h, counts, x->counts, &x->ncounts) < 0) return -1;
    PyObject *fast = PySequence_Fast(key, "key");
    if (!fast) return -1;
    x->p = (int)PySequence_Fast_GET_SIZE(fast);
    for (int j = 0; j < x->p; j++)
        if (as_index(fast, j, &x->key[j]) < 0) { Py_DECREF(fast); return -1; }
    Py_DECREF(fast);
    for (int l = 0; l < x->nsource; l++)
        if (x->source[l].width != x->p + 1 || !x->source[l].cols[x->p].p) {
            PyErr_SetString(PyExc_ValueError, "a source layer must be the key and one value");
            return -1;
        }
    for (int l = 0; l < x->ncounts; l++)
        if (x->counts[l].width != x->p) {
            PyErr_SetString(PyExc_ValueError, "a counts layer must be the key");
            return -1;
        }
    x->completes = completes;
    return 0;
}

static int parse_exts(Held *h, PyObject *specs, Ext *xs, int *count) {
    PyObject *fast = PySequence_Fast(specs, "extenders");
    if (!fast) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > MAXX) { Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "too many extenders"); return -1; }
    for (Py_ssize_t i = 0; i < k; i++)
        if (parse_ext(h, PySequence_Fast_GET_ITEM(fast, i), &xs[i]) < 0) { Py_DECREF(fast); return -1; }
    Py_DECREF(fast);
    *count = (int)k;
    return 0;
}

typedef struct {
    const i64 *cols[MAXW];
    int k;
    Py_ssize_t m;
} Prefix;

static int parse_prefix(Held *h, PyObject *cols, Py_ssize_t m, Prefix *P) {
    PyObject *fast = PySequence_Fast(cols, "prefix columns");
    if (!fast) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > MAXW) { Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "too many columns"); return -1; }
    for (Py_ssize_t j = 0; j < k; j++) {
        P->cols[j] = take(h, PySequence_Fast_GET_ITEM(fast, j), 8, 0, m, NULL, "prefix column");
        if (!P->cols[j]) { Py_DECREF(fast); return -1; }
    }
    Py_DECREF(fast);
    P->k = (int)k;
    P->m = m;
    return 0;
}

/* The extender's count for prefix row r; sets *bad on a sum leaving int64. */
static inline i64 ext_count(Ext *x, const Prefix *P, Py_ssize_t r, int *bad) {
    i64 key[MAXW];
    gather_key(P->cols, x->key, x->p, r, key);
    if (x->by_range) {
        if (x->nsource == 0) return 0;
        Py_ssize_t lo, hi;
        key_range(&x->source[0], key, x->p, &lo, &hi);
        return hi - lo;
    }
    i128 s = 0;
    for (int l = 0; l < x->ncounts; l++) {
        Layer *L = &x->counts[l];
        if (L->width == 0) { s += rows_checked(L, 0, 0, 1) ? diff_at(L, 0) : 0; continue; }
        Py_ssize_t lo, hi;
        key_range(L, key, x->p, &lo, &hi);
        if (lo < hi) s += diff_at(L, lo);
    }
    if (s > INT64_MAX || s < INT64_MIN) { *bad = 1; return 0; }
    return (i64)s;
}

/* -- packing rows into uint64 keys -------------------------------------------------------- */

typedef struct {
    int w;
    i64 low[MAXW];
    u64 span[MAXW];
    int bits[MAXW];
} Box;

static int parse_box(PyObject *lows, PyObject *highs, PyObject *bits, Box *b) {
    PyObject *fl = PySequence_Fast(lows, "lows"), *fh = PySequence_Fast(highs, "highs");
    PyObject *fb = PySequence_Fast(bits, "bits");
    int ok = fl && fh && fb;
    if (ok) {
        b->w = (int)PySequence_Fast_GET_SIZE(fl);
        ok = b->w <= MAXW && PySequence_Fast_GET_SIZE(fh) == b->w && PySequence_Fast_GET_SIZE(fb) == b->w;
        if (!ok) PyErr_SetString(PyExc_ValueError, "a packing's lows, highs and bits differ");
        for (int j = 0; ok && j < b->w; j++) {
            long long lo = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fl, j));
            long long hi = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fh, j));
            long bt = PyLong_AsLong(PySequence_Fast_GET_ITEM(fb, j));
            ok = !PyErr_Occurred();
            b->low[j] = (i64)lo;
            b->span[j] = (u64)hi - (u64)lo;
            b->bits[j] = (int)bt;
        }
    }
    Py_XDECREF(fl);
    Py_XDECREF(fh);
    Py_XDECREF(fb);
    return ok ? 0 : -1;
}

/* pack(columns, n, lows, highs, bits, out keys, inside out or None) -> whether all are inside:
 * column j's ``value - low`` in bits[j] bits, the first column highest; a row outside the box
 * is packed as 0 and flagged. */
static PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *cols_o, *lows, *highs, *bits, *out_o, *inside_o;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OnOOOOO", &cols_o, &n, &lows, &highs, &bits, &out_o, &inside_o))
        return NULL;
    Box b;
    if (parse_box(lows, highs, bits, &b) < 0) return NULL;
    Held h = {.count = 0};
    Prefix P;
    if (parse_prefix(&h, cols_o, n, &P) < 0) { release(&h); return NULL; }
    if (P.k > b.w) { release(&h); PyErr_SetString(PyExc_ValueError, "more columns than the box"); return NULL; }
    u64 *out = take(&h, out_o, 8, 1, n, NULL, "keys");
    uint8_t *inside = NULL;
    if (out && inside_o != Py_None) inside = take(&h, inside_o, 1, 1, n, NULL, "inside");
    if (!out || (inside_o != Py_None && !inside)) { release(&h); return NULL; }
    int all = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        u64 key = 0;
        int in = 1;
        for (int j = 0; j < P.k; j++) {
            u64 off = (u64)P.cols[j][i] - (u64)b.low[j];
            in &= off <= b.span[j];
            if (b.bits[j] == 0) continue;
            key = b.bits[j] >= 64 ? off : (key << b.bits[j]) | off;
        }
        if (!in) { key = 0; all = 0; }
        out[i] = key;
        if (inside) inside[i] = (uint8_t)in;
    }
    Py_END_ALLOW_THREADS
    release(&h);
    return PyBool_FromLong(all);
}

/* unpack(keys, lows, bits, out columns): the rows of packed keys, column by column. */
static PyObject *py_unpack(PyObject *self, PyObject *args) {
    PyObject *keys_o, *lows, *bits, *cols_o;
    if (!PyArg_ParseTuple(args, "OOOO", &keys_o, &lows, &bits, &cols_o)) return NULL;
    Box b;
    if (parse_box(lows, lows, bits, &b) < 0) return NULL;
    Held h = {.count = 0};
    Py_ssize_t n;
    const u64 *keys = take(&h, keys_o, 8, 0, -1, &n, "keys");
    PyObject *fast = keys ? PySequence_Fast(cols_o, "columns") : NULL;
    if (!fast) { release(&h); return NULL; }
    int w = (int)PySequence_Fast_GET_SIZE(fast);
    i64 *cols[MAXW];
    int ok = w == b.w;
    if (!ok) PyErr_SetString(PyExc_ValueError, "columns and box differ");
    for (int j = 0; ok && j < w; j++)
        ok = (cols[j] = take(&h, PySequence_Fast_GET_ITEM(fast, j), 8, 1, n, NULL, "column")) != NULL;
    Py_DECREF(fast);
    if (!ok) { release(&h); return NULL; }
    Py_BEGIN_ALLOW_THREADS
    int shift = 0;
    for (int j = w - 1; j >= 0; j--) {
        int bt = b.bits[j];
        u64 mask = bt >= 64 ? ~(u64)0 : (((u64)1 << bt) - 1);
        i64 *c = cols[j];
        u64 low = (u64)b.low[j];
        if (bt == 0) {
            for (Py_ssize_t i = 0; i < n; i++) c[i] = (i64)low;
            continue;
        }
        for (Py_ssize_t i = 0; i < n; i++) c[i] = (i64)(((keys[i] >> shift) & mask) + low);
        shift += bt;
    }
    Py_END_ALLOW_THREADS
    release(&h);
    Py_RETURN_NONE;
}

/* -- output rows, and loops over prefixes on several threads ------------------------------ */

/* Rows written by a loop: `k` int64 columns and a column of flags. Either the caller's arrays
 * (`fixed`: writing past `cap` is an error) or a thread's own buffer, grown as needed. */
typedef struct {
    i64 *cols[MAXW + 3];
    uint8_t *flags;
    int k, fixed, has_flags;
    Py_ssize_t n, cap;
} Rows;

static int rows_room(Rows *o) {
    if (o->n < o->cap) return 0;
    if (o->fixed) return -1;
    Py_ssize_t cap = o->cap ? 2 * o->cap : 4096;
    for (int j = 0; j < o->k; j++) {
        i64 *c = realloc(o->cols[j], sizeof(i64) * (size_t)cap);
        if (!c) return -2;
        o->cols[j] = c;
    }
    if (o->has_flags) {
        uint8_t *f = realloc(o->flags, (size_t)cap);
        if (!f) return -2;
        o->flags = f;
    }
    o->cap = cap;
    return 0;
}

static void rows_free(Rows *o) {
    if (o->fixed) return;
    for (int j = 0; j < o->k; j++) free(o->cols[j]);
    free(o->flags);
}

/* What a loop reports (summed over threads; an error of the first chunk in order wins). */
typedef struct {
    Py_ssize_t proposed, passed, counted;
    i128 total; /* the survivors' weights summed */
    int flagged;
    int err; /* 1: a sum left int64, 2: output past capacity, 3: out of memory, 4: an aggregate's
              * term (err_ext 1) or prefix sum (0) left int64 */
    Py_ssize_t err_row; /* the prefix row */
    int err_ext;
    i64 err_value;
    Py_ssize_t alive[MAXX];
    Py_ssize_t live, least; /* extend counting for itself: prefixes kept, their least counts */
} Stats;

/* One pass of a loop over a range of its items, writing rows into `out`. */
typedef void (*RangeFn)(void *ctx, void *scratch, Py_ssize_t i0, Py_ssize_t i1, Rows *out,
                        Stats *st);

/* The chunks of [start, stop) run on `threads` threads: each fills a buffer of its own, then
 * copies it into `out` at the place the chunks before it leave (chunks are committed in
 * order, so the rows come out as one thread would write them). */
typedef struct {
    RangeFn fn;
    void *ctx;
    size_t scratch_size;
    const void *scratch_init;
    Py_ssize_t start, stop, chunk, nchunks;
    Rows *out;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    Py_ssize_t next, committed, pos;
    int stop_all;
    Stats total;
    Py_ssize_t err_chunk;
} Pool;

static void stats_add(Stats *into, const Stats *st, int nalive) {
    into->proposed += st->proposed;
    into->passed += st->passed;
    into->counted += st->counted;
    into->total += st->total;
    into->flagged |= st->flagged;
    into->live += st->live;
    into->least += st->least;
    for (int j = 0; j < nalive; j++) into->alive[j] += st->alive[j];
}

static void *pool_worker(void *arg) {
    Pool *pl = arg;
    Rows mine = {.k = pl->out->k, .has_flags = pl->out->has_flags};
    void *scratch = malloc(pl->scratch_size);
    Stats st_total = {0};
    if (scratch) memcpy(scratch, pl->scratch_init, pl->scratch_size);
    for (;;) {
        pthread_mutex_lock(&pl->lock);
        Py_ssize_t c = pl->stop_all ? pl->nchunks : pl->next++;
        pthread_mutex_unlock(&pl->lock);
        if (c >= pl->nchunks) break;
        Py_ssize_t i0 = pl->start + c * pl->chunk;
        Py_ssize_t i1 = i0 + pl->chunk < pl->stop ? i0 + pl->chunk : pl->stop;
        Stats st = {0};
        mine.n = 0;
        if (!scratch) st.err = 3;
        else pl->fn(pl->ctx, scratch, i0, i1, &mine, &st);
        pthread_mutex_lock(&pl->lock);
        while (pl->committed != c) pthread_cond_wait(&pl->turn, &pl->lock);
        Py_ssize_t at = pl->pos;
        int failed = st.err != 0 || (pl->out->fixed && at + mine.n > pl->out->cap);
        if (failed) {
            if (!st.err) { st.err = 2; st.err_row = -1; }
            if (pl->err_chunk < 0 || c < pl->err_chunk) {
                pl->err_chunk = c;
                pl->total.err = st.err;
                pl->total.err_row = st.err_row;
                pl->total.err_ext = st.err_ext;
                pl->total.err_value = st.err_value;
            }
            pl->stop_all = 1;
            mine.n = 0;
        }
        pl->pos += mine.n;
        pl->committed++;
        pthread_cond_broadcast(&pl->turn);
        pthread_mutex_unlock(&pl->lock);
        for (int j = 0; j < mine.k; j++)
            if (mine.n) memcpy(pl->out->cols[j] + at, mine.cols[j], sizeof(i64) * (size_t)mine.n);
        if (mine.has_flags && mine.n) memcpy(pl->out->flags + at, mine.flags, (size_t)mine.n);
        stats_add(&st_total, &st, MAXX);
    }
    pthread_mutex_lock(&pl->lock);
    stats_add(&pl->total, &st_total, MAXX);
    pthread_mutex_unlock(&pl->lock);
    rows_free(&mine);
    free(scratch);
    return NULL;
}

/* Run fn over [start, stop) into `out`: on this thread when `threads` is 1, else in chunks on
 * that many threads. Returns the rows written; *st gets what the loop reports. */
static Py_ssize_t run_pool(RangeFn fn, void *ctx, void *scratch, size_t scratch_size,
                           Py_ssize_t start, Py_ssize_t stop, int threads, Py_ssize_t chunk,
                           Rows *out, Stats *st) {
    Py_ssize_t n = stop - start;
    if (threads <= 1 || n <= chunk) {
        fn(ctx, scratch, start, stop, out, st);
        return out->n;
    }
    Pool pl = {.fn = fn, .ctx = ctx, .scratch_size = scratch_size, .scratch_init = scratch,
               .start = start, .stop = stop, .chunk = chunk, .out = out, .err_chunk = -1};
    pl.nchunks = (n + chunk - 1) / chunk;
    pthread_mutex_init(&pl.lock, NULL);
    pthread_cond_init(&pl.turn, NULL);
    pthread_t ids[64];
    int started = 0;
    if (threads > 64) threads = 64;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&ids[started], NULL, pool_worker, &pl) == 0) started++;
    pool_worker(&pl);
    for (int t = 0; t < started; t++) pthread_join(ids[t], NULL);
    pthread_mutex_destroy(&pl.lock);
    pthread_cond_destroy(&pl.turn);
    *st = pl.total;
    out->n = pl.pos;
    return pl.pos;
}

/* Prefetch what counting prefix rows `far` (its directory entries; none when < 0) and `near`
 * (their first rows) will read: each extender's counts layers, or its one source layer when it
 * counts by the size of its key's range (the directory alone). */
static inline void count_prefetch(Ext *xs, int nx, const Prefix *P, Py_ssize_t far,
                                  Py_ssize_t near) {
    for (int j = 0; j < nx; j++) {
        Ext *x = &xs[j];
        if (x->p == 0) continue;
        const i64 *c0 = P->cols[x->key[0]];
        if (x->by_range) {
            if (x->nsource && far >= 0) prefetch_dir(&x->source[0], c0[far]);
            continue;
        }
        for (int l = 0; l < x->ncounts; l++) {
            if (far >= 0) prefetch_dir(&x->counts[l], c0[far]);
            prefetch_rows(&x->counts[l], c0[near], x->p > 1 ? 1 : -1, 1);
        }
    }
}

/* What counting reads (see `ahead`): each extender's key in its counts layers and the diff at
 * its range's start, or its key's range in its one source layer. Returns the wants. */
static int count_wants(Ext *xs, int nx, Want *out) {
    int nw = 0;
    for (int j = 0; j < nx; j++) {
        Ext *x = &xs[j];
        if (x->by_range && x->nsource) out[nw++] = (Want){&x->source[0], x->key, x->p, -1, 0};
        for (int l = 0; !x->by_range && l < x->ncounts; l++)
            out[nw++] = (Want){&x->counts[l], x->key, x->p, -1, AH_DIFF0};
    }
    return nw;
}

/* -- count -------------------------------------------------------------------------------- */

typedef struct {
    const Prefix *P;
    int nx;
} CountCtx;

static void count_range(void *vctx, void *scratch, Py_ssize_t i0, Py_ssize_t i1, Rows *out,
                        Stats *st) {
    CountCtx *ctx = vctx;
    Ext *xs = scratch;
    Want wants[MAXX * MAXL];
    int nw = count_wants(xs, ctx->nx, wants);
    Watch wt = {wants, nw, ctx->P->cols, NULL, i0, i1};
    watch_begin(&wt);
    for (Py_ssize_t r = i0; r < i1; r++) {
        watch_at(&wt, r);
        if (r + PF_NEAR < i1) count_prefetch(xs, ctx->nx, ctx->P, r + PF_FAR < i1 ? r + PF_FAR : -1,
                                             r + PF_NEAR);
        i64 best = 0;
        int who = -1, err = 0;
        for (int j = 0; j < ctx->nx; j++) {
            i64 c = ext_count(&xs[j], ctx->P, r, &err);
            if (err) break;
            if (c <= 0) { who = -1; break; }
            st->alive[j]++;
            if (who < 0 || c < best) { best = c; who = j; }
        }
        if (err) { st->err = 1; st->err_row = r; return; }
        if (who < 0) continue;
        if (rows_room(out) < 0) { st->err = out->fixed ? 2 : 3; st->err_row = r; return; }
        out->cols[0][out->n] = r;
        out->cols[1][out->n] = who;
        out->cols[2][out->n] = best;
        out->n++;
    }
}

/* count(extenders, prefix columns, m, live out, tag out, least out, alive out, threads, chunk)
 * For every prefix row, each extender's count; rows some extender has none for die. The live
 * rows' positions, the extender with the fewest (ties to the lowest) and that count are
 * written in order; alive[j] counts the rows still alive after extender j. Returns the number
 * of live rows, or -(row + 1) for a count whose sum leaves int64. */
static PyObject *py_count(PyObject *self, PyObject *args) {
    PyObject *exts_o, *cols_o, *live_o, *tag_o, *least_o, *alive_o;
    Py_ssize_t m;
    int threads = 1;
    Py_ssize_t chunk = 1 << 14;
    if (!PyArg_ParseTuple(args, "OOnOOOO|in", &exts_o, &cols_o, &m, &live_o, &tag_o, &least_o,
                          &alive_o, &threads, &chunk))
        return NULL;
    Held h = {.count = 0};
    Py_ssize_t nxs = PySequence_Size(exts_o);
    if (nxs < 0) return NULL;
    if (nxs > MAXX) return PyErr_Format(PyExc_ValueError, "%zd extenders (at most %d)", nxs, MAXX);
    size_t xs_size = sizeof(Ext) * (size_t)(nxs ? nxs : 1);
    Ext *xs = calloc(1, xs_size);
    if (!xs) return PyErr_NoMemory();
    int nx;
    Prefix P;
    i64 *live = NULL, *tag = NULL, *least = NULL, *alive = NULL;
    if (parse_exts(&h, exts_o, xs, &nx) < 0 || parse_prefix(&h, cols_o, m, &P) < 0 ||
        !(live = take(&h, live_o, 8, 1, m, NULL, "live")) ||
        !(tag = take(&h, tag_o, 8, 1, m, NULL, "tag")) ||
        !(least = take(&h, least_o, 8, 1, m, NULL, "least")) ||
        !(alive = take(&h, alive_o, 8, 1, nx, NULL, "alive"))) {
        release(&h);
        free(xs);
        return NULL;
    }
    for (int j = 0; j < nx; j++)
        if (xs[j].by_range && xs[j].nsource > 1) {
            PyErr_SetString(PyExc_ValueError, "counting by range needs one source layer");
            release(&h);
            free(xs);
            return NULL;
        }
    Rows out = {.cols = {live, tag, least}, .k = 3, .fixed = 1, .cap = m};
    Stats st = {0};
    CountCtx ctx = {.P = &P, .nx = nx};
    Py_BEGIN_ALLOW_THREADS
    run_pool(count_range, &ctx, xs, xs_size, 0, m, threads, chunk > 0 ? chunk : 1,
             &out, &st);
    Py_END_ALLOW_THREADS
    for (int j = 0; j < nx; j++) alive[j] = st.alive[j];
    release(&h);
    free(xs);
    if (st.err == 3) return PyErr_NoMemory();
    return PyLong_FromSsize_t(st.err ? -(st.err_row + 1) : out.n);
}

/* -- extend ------------------------------------------------------------------------------- */

enum { LT, LE, GT, GE, EQ, NE };
enum { PREFIX_COL, CONSTANT, ITSELF };

typedef struct {
    int op, kind;
    i64 value; /* a constant, or the prefix column's position */
} Filt;

static inline int holds(int op, i64 a, i64 b) {
    switch (op) {
    case LT: return a < b;
    case LE: return a <= b;
    case GT: return a > b;
    case GE: return a >= b;
    case EQ: return a == b;
    default: return a != b;
    }
}

/* Set up extender x's ranges for prefix key (once per prefix, when first needed). */
static inline void ext_ready(Ext *x, const Prefix *P, Py_ssize_t r) {
    gather_key(P->cols, x->key, x->p, r, x->kv);
    for (int l = 0; l < x->nsource; l++) {
        key_range(&x->source[l], x->kv, x->p, &x->lo[l], &x->hi[l]);
        x->cur[l] = x->lo[l];
    }
    x->ready = 1;
}

/* The summed diff of value v under x's key (cursors move forward: values come ascending). */
static inline i128 ext_find(Ext *x, i64 v) {
    i128 s = 0;
    for (int l = 0; l < x->nsource; l++) {
        Col c = x->source[l].cols[x->p];
        Py_ssize_t at = gallop_col(c, x->cur[l], x->hi[l], v, 0);
        x->cur[l] = at;
        if (at < x->hi[l] && col_at(c, at) == v) s += diff_at(&x->source[l], at);
    }
    return s;
}

/* The places of the values sorted runs a and b share (each run's values distinct), written to
 * ia and ib unless `count_only`; returns how many. A side 16 times shorter than the other
 * gallops through it, else the two are merged. One per pair of column types. */
#define INTERSECT(TA, SA, TB, SB)                                                               \
    static Py_ssize_t isect_##SA##_##SB(const TA *a, Py_ssize_t na, const TB *b, Py_ssize_t nb, \
                                        Py_ssize_t *ia, Py_ssize_t *ib, int count_only) {      \
        Py_ssize_t n = 0, i = 0, j = 0;                                                         \
        if (na * 16 < nb) {                                                                     \
            for (; i < na && j < nb; i++) {                                                     \
                j = gallop_##SB(b, j, nb, (i64)a[i], 0);                                        \
                if (j < nb && (i64)b[j] == (i64)a[i]) {                                         \
                    if (!count_only) { ia[n] = i; ib[n] = j; }                                  \
                    n++;                                                                        \
                    j++;                                                                        \
                }                                                                               \
            }                                                                                   \
            return n;                                                                           \
        }                                                                                       \
        while (i < na && j < nb) {                                                              \
            i64 x = (i64)a[i], y = (i64)b[j];                                                   \
            if (x == y) {                                                                       \
                if (!count_only) { ia[n] = i; ib[n] = j; }                                      \
                n++;                                                                            \
            }                                                                                   \
            i += x <= y;                                                                        \
            j += y <= x;                                                                        \
        }                                                                                       \
        return n;                                                                               \
    }
INTERSECT(i64, 64, i64, 64)
INTERSECT(i64, 64, uint32_t, 32)
INTERSECT(uint32_t, 32, i64, 64)
INTERSECT(uint32_t, 32, uint32_t, 32)

static Py_ssize_t intersect(Col a, Py_ssize_t na, Col b, Py_ssize_t nb, Py_ssize_t *ia,
                            Py_ssize_t *ib, int count_only) {
    if (nb * 16 < na) return intersect(b, nb, a, na, ib, ia, count_only);
    if (a.narrow)
        return b.narrow ? isect_32_32(a.p, na, b.p, nb, ia, ib, count_only)
                        : isect_32_64(a.p, na, b.p, nb, ia, ib, count_only);
    return b.narrow ? isect_64_32(a.p, na, b.p, nb, ia, ib, count_only)
                    : isect_64_64(a.p, na, b.p, nb, ia, ib, count_only);
}

/* A prefix's candidates while they are validated by merging: values, weights, flags, and the
 * places an intersection matched (grown as needed; one set per thread's pass). */
typedef struct {
    i64 *v, *w;
    uint8_t *f;
    Py_ssize_t *ia, *ib;
    Py_ssize_t cap;
} Cands;

static int cands_room(Cands *c, Py_ssize_t n) {
    if (n <= c->cap) return 0;
    Py_ssize_t cap = c->cap ? c->cap : 1024;
    while (cap < n) cap *= 2;
    i64 *v = realloc(c->v, sizeof(i64) * (size_t)cap);
    if (v) c->v = v;
    i64 *w = realloc(c->w, sizeof(i64) * (size_t)cap);
    if (w) c->w = w;
    uint8_t *f = realloc(c->f, (size_t)cap);
    if (f) c->f = f;
    Py_ssize_t *ia = realloc(c->ia, sizeof(Py_ssize_t) * (size_t)cap);
    if (ia) c->ia = ia;
    Py_ssize_t *ib = realloc(c->ib, sizeof(Py_ssize_t) * (size_t)cap);
    if (ib) c->ib = ib;
    if (!v || !w || !f || !ia || !ib) return -1;
    c->cap = cap;
    return 0;
}

static void cands_free(Cands *c) {
    free(c->v);
    free(c->w);
    free(c->f);
    free(c->ia);
    free(c->ib);
}

typedef struct {
    const Prefix *P;
    const i64 *weight, *live, *tag;
    const uint8_t *flags;
    int nx, nf, owner, spread; /* write the owner / the prefix's columns */
    int counting;              /* write nothing: count the survivors and sum their weights */
    int ranged;                /* counting for itself over several layers (`ext_ranged`) */
    i64 *per;                  /* counting: each prefix's sum, at its row (an aggregate's) */
    int value;                 /* counting: sum weight x value (an aggregate's sum(x)) */
    Filt fs[MAXF];
    /* marking (see `Marks`): the extender whose values are marked (-1: none), where its marks
     * lie in a thread's scratch, and the values they cover */
    int mark_ext;
    size_t marks_at;
    i64 mark_low;
    u64 mark_span;
} ExtendCtx;

/* A thread's marks: the values of one key's range in the marked extender's layer, as bits over
 * [ctx.mark_low, + ctx.mark_span) (the words follow the struct in the thread's scratch). A
 * static count's prefixes come sorted by their first column, so the extender keyed by it sees
 * the same key for many prefixes in a row: its range is marked once, and each prefix's other
 * range is then intersected with it by testing bits (independent loads) instead of merging. */
typedef struct {
    int on;
    i64 key;
    Py_ssize_t lo, hi;
} Marks;

static inline u64 *mark_words(Marks *mk) { return (u64 *)(mk + 1); }

static void mark_range(Marks *mk, Col c, Py_ssize_t lo, Py_ssize_t hi, i64 low, int on) {
    u64 *bits = mark_words(mk);
    for (Py_ssize_t q = lo; q < hi; q++) {
        u64 off = (u64)col_at(c, q) - (u64)low;
        if (on) bits[off >> 6] |= (u64)1 << (off & 63);
        else bits[off >> 6] &= ~((u64)1 << (off & 63));
    }
}

/* How many of the values v[0..n) are marked. */
#define COUNT_MARKED(T)                                                                         \
    for (Py_ssize_t q = 0; q < n; q++) {                                                        \
        u64 off = (u64)(i64)((const T *)v.p)[q] - (u64)low;                                     \
        k += off < span ? (Py_ssize_t)((bits[off >> 6] >> (off & 63)) & 1) : 0;                 \
    }
static inline Py_ssize_t count_marked(const Marks *mk, Col v, Py_ssize_t n, i64 low, u64 span) {
    const u64 *bits = mark_words((Marks *)mk);
    Py_ssize_t k = 0;
    if (v.narrow) { COUNT_MARKED(uint32_t) }
    else { COUNT_MARKED(i64) }
    return k;
}

/* The size of the intersection of the proposer's range a and the validator's range b (both
 * within the prefix's bounds) by the marks, when the marked extender's key for row r is
 * marked or worth marking (the next prefix has it too); -1 to merge instead. The side that is
 * not marked is tested bit by bit unless it is much longer than the marked side's range
 * within the bounds (then galloping through it is less work). */
static Py_ssize_t marked_intersection(ExtendCtx *ctx, Ext *xs, int t, Py_ssize_t r,
                                      Py_ssize_t next_r, Col a, Py_ssize_t na, Col b,
                                      Py_ssize_t nb, Marks *mk) {
    int e = ctx->mark_ext;
    Col other = e == t ? b : a;
    Py_ssize_t nother = e == t ? nb : na, nmarked = e == t ? na : nb;
    if (nother > 16 * nmarked + 64) return -1;
    const Prefix *P = ctx->P;
    i64 key = P->cols[0][r];
    if (!mk->on || mk->key != key) {
        if (next_r < 0 || P->cols[0][next_r] != key) return -1;
        Ext *x = &xs[e];
        Layer *L = &x->source[0];
        Col c = L->cols[x->p];
        if (mk->on) mark_range(mk, c, mk->lo, mk->hi, ctx->mark_low, 0);
        Py_ssize_t lo, hi;
        key_range(L, &key, 1, &lo, &hi);
        mark_range(mk, c, lo, hi, ctx->mark_low, 1);
        mk->on = 1;
        mk->key = key;
        mk->lo = lo;
        mk->hi = hi;
    }
    return count_marked(mk, other, nother, ctx->mark_low, ctx->mark_span);
}

/* The rows of x's one layer under its key (ext_ready's range [x->lo[0], x->hi[0])) whose value
 * lies in [low, high], as [*plo, *phi). A key met again (a static count's prefixes come sorted
 * by their first column, so the extender keyed by it meets each key many times in a row)
 * starts from the last answer: the same low's start is reused, a higher bound gallops forward
 * from the last place, a lower one searches within it. */
static inline void narrowed(Ext *x, i64 low, i64 high, Py_ssize_t *plo, Py_ssize_t *phi) {
    Col c = x->source[0].cols[x->p];
    Py_ssize_t a = x->lo[0], b = x->hi[0];
    int again = x->nmemo;
    for (int j = 0; again && j < x->p; j++) again = x->nkey[j] == x->kv[j];
    Py_ssize_t lo, hi;
    if (low == INT64_MIN) lo = a;
    else if (!again || low < x->nlow) lo = bsearch_col(c, a, b, low, 0);
    else if (low == x->nlow) lo = x->nlo;
    else lo = gallop_col(c, x->nlo, b, low, 0);
    if (high == INT64_MAX) hi = b;
    else if (again && high >= x->nhigh && x->nhi >= lo) hi = gallop_col(c, x->nhi, b, high, 1);
    else hi = bsearch_col(c, lo, b, high, 1);
    if (hi < lo) hi = lo;
    memcpy(x->nkey, x->kv, sizeof(i64) * (size_t)x->p);
    x->nmemo = 1;
    x->nlow = low;
    x->nhigh = high;
    x->nlo = lo;
    x->nhi = hi;
    *plo = lo;
    *phi = hi;
}

/* A survivor's weight w (of value v) into the sum: times v for a sum(x) (err 4 when that term
 * leaves int64, naming the prefix row and the value). */
static inline int add_term(const ExtendCtx *ctx, Stats *st, Py_ssize_t r, i64 w, i64 v) {
    if (!ctx->value) { st->total += w; return 0; }
    i128 p = (i128)w * v;
    if (p > INT64_MAX || p < INT64_MIN) {
        st->err = 4; st->err_row = r; st->err_ext = 1; st->err_value = v;
        return -1;
    }
    st->total += p;
    return 0;
}

/* Prefix row r's sum s into ctx->per (err 4 when it leaves int64). */
static inline int put_sum(const ExtendCtx *ctx, Stats *st, Py_ssize_t r, i128 s) {
    if (s > INT64_MAX || s < INT64_MIN) {
        st->err = 4; st->err_row = r; st->err_ext = 0;
        return -1;
    }
    ctx->per[r] = (i64)s;
    return 0;
}

/* One prefix's step by merging (see `extend_range`): the proposer x's range [cur, hi) (already
 * within the bounds [low, high]) intersected with each other extender's range within the same
 * bounds, in the extenders' order, as the galloping path validates them one after another
 * (the same candidates proposed, the same passes counted, the weights multiplied in the same
 * order). Returns -1 on an error set in st. */
static int extend_merged(ExtendCtx *ctx, Ext *xs, int t, Py_ssize_t r, Py_ssize_t i, i64 low,
                         i64 high, i64 w0, uint8_t f0, int plain, Cands *c, Marks *mk,
                         Py_ssize_t next_r, Rows *out, Stats *st, Py_ssize_t *written) {
    const Prefix *P = ctx->P;
    Ext *x = &xs[t];
    const Layer *X = &x->source[0];
    Col av = col_from(X->cols[x->p], x->cur[0]);
    Py_ssize_t na = x->hi[0] - x->cur[0];
    st->proposed += na;
    int first = 1;
    Py_ssize_t nc = na;
    for (int j = 0; j < ctx->nx; j++) {
        if (j == t) continue;
        Ext *y = &xs[j];
        ext_ready(y, P, r);
        const Layer *Y = &y->source[0];
        Col yc = Y->cols[y->p];
        Py_ssize_t lo, hi;
        narrowed(y, low, high, &lo, &hi);
        if (plain) {
            Py_ssize_t k = mk ? marked_intersection(ctx, xs, t, r, next_r, av, na,
                                                    col_from(yc, lo), hi - lo, mk)
                              : -1;
            if (k < 0) k = intersect(av, na, col_from(yc, lo), hi - lo, NULL, NULL, 1);
            st->passed += k;
            if (k) {
                st->flagged |= f0;
                *written += k;
                st->total += (i128)w0 * k;
            }
            return 0;
        }
        if (cands_room(c, nc) < 0) { st->err = 3; st->err_row = r; return -1; }
        Col src = first ? av : (Col){c->v, 0};
        Py_ssize_t k = intersect(src, nc, col_from(yc, lo), hi - lo, c->ia, c->ib, 0);
        st->passed += k;
        for (Py_ssize_t q = 0; q < k; q++) {
            Py_ssize_t a = c->ia[q];
            i64 w;
            uint8_t fl;
            if (first) {
                w = w0;
                fl = f0;
                if (x->completes && !X->unit && __builtin_mul_overflow(w, diff_at(X, x->cur[0] + a), &w))
                    fl = 1;
            } else {
                w = c->w[a];
                fl = c->f[a];
            }
            if (y->completes && !Y->unit && __builtin_mul_overflow(w, diff_at(Y, lo + c->ib[q]), &w))
                fl = 1;
            c->v[q] = col_at(src, a);
            c->w[q] = w;
            c->f[q] = fl;
        }
        nc = k;
        first = 0;
        if (!nc) return 0;
    }
    if (!ctx->counting) {
        for (Py_ssize_t q = 0; q < nc; q++) {
            int room = rows_room(out);
            if (room < 0) { st->err = room == -1 ? 2 : 3; st->err_row = r; return -1; }
            Py_ssize_t at = out->n++;
            int col = 0;
            if (ctx->spread)
                for (; col < P->k; col++) out->cols[col][at] = P->cols[col][r];
            out->cols[col++][at] = c->v[q];
            out->cols[col++][at] = c->w[q];
            if (ctx->owner) out->cols[col][at] = i;
            out->flags[at] = c->f[q];
            st->flagged |= c->f[q];
        }
        return 0;
    }
    for (Py_ssize_t q = 0; q < nc; q++) {
        st->flagged |= c->f[q];
        if (add_term(ctx, st, r, c->w[q], c->v[q]) < 0) return -1;
    }
    *written += nc;
    return 0;
}

/* Extender x's candidates for prefix row r bounded by the sizes of its key's ranges in its
 * layers (`ext_ready`'s, kept for extending; an entry a layer cancels still counts): how a
 * warm epoch's count picks in extend, no counts looked up. */
static inline i64 ext_ranged(Ext *x, const Prefix *P, Py_ssize_t r) {
    ext_ready(x, P, r);
    i64 c = 0;
    for (int l = 0; l < x->nsource; l++) c += x->hi[l] - x->lo[l];
    return c;
}

/* The extender with the fewest candidates for prefix row r (ties to the lowest), each counted
 * by its range in its one layer (`ext_ranged` when `ranged`), as `count_range` picks it (and counts the rows alive after
 * each extender and the live rows' least counts in st); -1 when some extender has none. */
static inline int pick_least(Ext *xs, const Prefix *P, int nx, Py_ssize_t r, Stats *st,
                             int ranged) {
    i64 best = 0;
    int who = -1, err = 0;
    for (int j = 0; j < nx; j++) {
        i64 c = ranged ? ext_ranged(&xs[j], P, r) : ext_count(&xs[j], P, r, &err);
        if (c <= 0) return -1;
        st->alive[j]++;
        if (who < 0 || c < best) { best = c; who = j; }
    }
    if (who >= 0) {
        st->live++;
        st->least += best;
    }
    return who;
}

/* Prefetch what extending prefix rows `far` (the directory entries of every extender's
 * source layers; none when < 0) and `near` (each key's first rows: the column searched after
 * the key's first, the diffs where they multiply) will read first. */
static inline void extend_prefetch(Ext *xs, int nx, const Prefix *P, Py_ssize_t far,
                                   Py_ssize_t near) {
    for (int j = 0; j < nx; j++) {
        Ext *x = &xs[j];
        if (x->p == 0) continue;
        const i64 *c0 = P->cols[x->key[0]];
        for (int l = 0; l < x->nsource; l++) {
            const Layer *L = &x->source[l];
            if (far >= 0) prefetch_dir(L, c0[far]);
            prefetch_rows(L, c0[near], 1, x->completes && !L->unit);
        }
    }
}

/* What extending reads (see `ahead`): every extender's key in each of its source layers,
 * the values of the key's range (proposed or validated) and its diffs where they multiply. */
static int extend_wants(Ext *xs, int nx, Want *out) {
    int nw = 0;
    for (int j = 0; j < nx; j++) {
        Ext *x = &xs[j];
        for (int l = 0; l < x->nsource; l++)
            out[nw++] = (Want){&x->source[l], x->key, x->p, x->p,
                               AH_RANGE | (x->completes ? AH_DIFFS : 0)};
    }
    return nw;
}

static void extend_range(void *vctx, void *scratch, Py_ssize_t i0, Py_ssize_t i1, Rows *out,
                         Stats *st) {
    ExtendCtx *ctx = vctx;
    const Prefix *P = ctx->P;
    Ext *xs = scratch;
    int nx = ctx->nx, nf = ctx->nf;
    const Filt *fs = ctx->fs;
    int writing = !ctx->counting;
    Py_ssize_t written = 0;
    int leftover = 0; /* filters a candidate is checked against (not bounds of its range) */
    for (int f = 0; f < nf; f++) leftover |= fs[f].kind == ITSELF || fs[f].op == NE;
    /* every extender one layer and no leftover filter: the proposer's range is intersected
     * with each validator's by merging (`merged`); with unit multiplicities wherever they
     * multiply, a count of two extenders is the size of the one intersection (`plain`) */
    int merged = nx >= 2 && !leftover, units = 1;
    for (int j = 0; j < nx; j++) {
        merged &= xs[j].nsource == 1;
        units &= !xs[j].completes || (xs[j].nsource == 1 && xs[j].source[0].unit);
    }
    const int plain = merged && units && nx == 2 && !writing && !ctx->value;
    Cands cand = {0};
    Marks *mk = plain && ctx->mark_ext >= 0 ? (Marks *)((char *)scratch + ctx->marks_at) : NULL;
    Want wants[MAXX * MAXL];
    int nw = extend_wants(xs, nx, wants);
    Watch wt = {wants, nw, P->cols, ctx->live, i0, i1};
    watch_begin(&wt);
    Py_ssize_t pr = -1; /* the prefix row summed into ctx->per, from st->total at `base` */
    i128 base = 0;
    for (Py_ssize_t i = i0; i < i1; i++) {
        watch_at(&wt, i);
        if (i + PF_NEAR < i1) {
            Py_ssize_t far = i + PF_FAR < i1 ? i + PF_FAR : -1, near = i + PF_NEAR;
            if (ctx->live) {
                far = far >= 0 ? ctx->live[far] : -1;
                near = ctx->live[near];
            }
            extend_prefetch(xs, nx, P, far, near);
        }
        Py_ssize_t r;
        int t;
        if (ctx->live) {
            r = ctx->live[i];
            t = (int)ctx->tag[i];
        } else {
            /* counting for itself (`py_extend` without live rows): every prefix is counted
             * here as `count_range` counts it, each extender by its one layer's range (no sum
             * to overflow), and the fewest proposes */
            r = i;
            t = pick_least(xs, P, nx, r, st, ctx->ranged);
        }
        if (ctx->per) {
            if (pr >= 0 && put_sum(ctx, st, pr, st->total - base) < 0) break;
            pr = r;
            base = st->total;
        }
        if (t < 0) continue;
        Ext *x = &xs[t];
        /* the bounds: filters comparing the value with a prefix column or a constant */
        i64 low = INT64_MIN, high = INT64_MAX;
        int empty = 0;
        for (int f = 0; f < nf; f++) {
            if (fs[f].kind == ITSELF || fs[f].op == NE) continue;
            i64 o = fs[f].kind == CONSTANT ? fs[f].value : P->cols[fs[f].value][r];
            switch (fs[f].op) {
            case LT: if (o == INT64_MIN) empty = 1; else if (o - 1 < high) high = o - 1; break;
            case LE: if (o < high) high = o; break;
            case GT: if (o == INT64_MAX) empty = 1; else if (o + 1 > low) low = o + 1; break;
            case GE: if (o > low) low = o; break;
            default: if (o > low) low = o; if (o < high) high = o; break;
            }
        }
        if (empty || low > high) continue;
        if (!ctx->ranged) {
            for (int j = 0; j < nx; j++) xs[j].ready = 0;
            ext_ready(x, P, r);
        }
        int nonempty = 0;
        if (x->nsource == 1) {
            narrowed(x, low, high, &x->lo[0], &x->hi[0]);
            x->cur[0] = x->lo[0];
            nonempty = x->lo[0] < x->hi[0];
        }
        for (int l = 0; l < x->nsource && x->nsource > 1; l++) {
            Col c = x->source[l].cols[x->p];
            if (x->lo[l] < x->hi[l] && low != INT64_MIN) x->lo[l] = bsearch_col(c, x->lo[l], x->hi[l], low, 0);
            if (x->lo[l] < x->hi[l] && high != INT64_MAX) x->hi[l] = bsearch_col(c, x->lo[l], x->hi[l], high, 1);
            x->cur[l] = x->lo[l];
            nonempty += x->lo[l] < x->hi[l];
        }
        if (!nonempty) continue;
        i64 w0 = ctx->weight[r];
        uint8_t f0 = ctx->flags ? ctx->flags[r] : 0;
        if (merged) {
            Py_ssize_t next_r = i + 1 < i1 ? (ctx->live ? ctx->live[i + 1] : i + 1) : -1;
            if (extend_merged(ctx, xs, t, r, i, low, high, w0, f0, plain, &cand, mk, next_r, out,
                              st, &written) < 0) {
                cands_free(&cand);
                return;
            }
            continue;
        }
        /* one layer (a first load, a static count): its key's values are distinct, each with
         * a diff that is not 0, so they are read straight along its column */
        const int single = x->nsource == 1;
        Col scol = x->source[0].cols[x->p];
        Py_ssize_t sat = x->cur[0], shi = x->hi[0];
        for (;;) {
            i64 v = 0;
            i128 d = 0;
            if (single) {
                if (sat >= shi) break;
                v = col_at(scol, sat);
                d = diff_at(&x->source[0], sat);
                sat++;
            } else {
                /* the next candidate: the least value at the cursors, its diffs summed */
                int found = 0;
                for (int l = 0; l < x->nsource; l++)
                    if (x->cur[l] < x->hi[l]) {
                        i64 c = col_at(x->source[l].cols[x->p], x->cur[l]);
                        if (!found || c < v) { v = c; found = 1; }
                    }
                if (!found) break;
                for (int l = 0; l < x->nsource; l++)
                    if (x->cur[l] < x->hi[l] && col_at(x->source[l].cols[x->p], x->cur[l]) == v) {
                        d += diff_at(&x->source[l], x->cur[l]);
                        x->cur[l]++;
                    }
                if (d == 0) continue;
                if (d > INT64_MAX || d < INT64_MIN) {
                    st->err = 1; st->err_row = r; st->err_ext = t; st->err_value = v;
                    return;
                }
            }
            st->proposed++;
            int pass = 1;
            for (int f = 0; f < nf && pass && leftover; f++) {
                if (!(fs[f].kind == ITSELF || fs[f].op == NE)) continue;
                i64 o = fs[f].kind == CONSTANT ? fs[f].value
                        : fs[f].kind == ITSELF ? v : P->cols[fs[f].value][r];
                pass = holds(fs[f].op, v, o);
            }
            if (!pass) continue;
            i64 w = w0;
            uint8_t fl = f0;
            if (x->completes && __builtin_mul_overflow(w, (i64)d, &w)) fl = 1;
            for (int j = 0; j < nx && pass; j++) {
                if (j == t) continue;
                Ext *y = &xs[j];
                if (!y->ready) ext_ready(y, P, r);
                i128 e = ext_find(y, v);
                if (e == 0) { pass = 0; break; }
                if (e > INT64_MAX || e < INT64_MIN) {
                    st->err = 1; st->err_row = r; st->err_ext = j; st->err_value = v;
                    return;
                }
                st->passed++;
                if (y->completes && __builtin_mul_overflow(w, (i64)e, &w)) fl = 1;
            }
            if (!pass) continue;
            st->flagged |= fl;
            if (!writing) {
                written++;
                if (add_term(ctx, st, r, w, v) < 0) { cands_free(&cand); return; }
                continue;
            }
            int room = rows_room(out);
            if (room < 0) { st->err = room == -1 ? 2 : 3; st->err_row = r; return; }
            Py_ssize_t at = out->n++;
            int c = 0;
            if (ctx->spread)
                for (; c < P->k; c++) out->cols[c][at] = P->cols[c][r];
            out->cols[c++][at] = v;
            out->cols[c++][at] = w;
            if (ctx->owner) out->cols[c][at] = i;
            out->flags[at] = fl;
        }
    }
    if (ctx->per && pr >= 0 && !st->err) put_sum(ctx, st, pr, st->total - base);
    cands_free(&cand);
    st->counted += written;
}

/* Whether a count's step marks values (see `Marks`): two extenders of one layer each, unit
 * multiplicities wherever they multiply, no leftover filter, one keyed by the prefix's first
 * column alone, and enough prefixes to pay for marking (at least 1/16 of that layer's rows);
 * the marks cover its values' span, if that is not far sparser than its rows. Sets
 * ctx->mark_ext, mark_low and mark_span and returns 0; -1 when not. */
static int choose_marks(ExtendCtx *ctx, Ext *xs, Py_ssize_t prefixes) {
    if (ctx->nx != 2) return -1;
    for (int f = 0; f < ctx->nf; f++)
        if (ctx->fs[f].kind == ITSELF || ctx->fs[f].op == NE) return -1;
    int e = -1;
    for (int j = 0; j < 2; j++) {
        Ext *x = &xs[j];
        if (x->nsource != 1 || (x->completes && !x->source[0].unit)) return -1;
        if (e < 0 && x->p == 1 && x->key[0] == 0) e = j;
    }
    if (e < 0) return -1;
    const Layer *L = &xs[e].source[0];
    if (L->n == 0 || prefixes * 16 < L->n) return -1;
    Col c = L->cols[xs[e].p];
    if (!c.p || !checked(&L->g, c.p, col_bytes(c, L->n))) return -1;
    i64 lo = col_at(c, 0), hi = lo;
    for (Py_ssize_t q = 1; q < L->n; q++) {
        i64 v = col_at(c, q);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    u64 span = (u64)hi - (u64)lo + 1;
    if (span == 0 || span > ((u64)1 << 32) || span > 64 * (u64)L->n + 4096) return -1;
    ctx->mark_ext = e;
    ctx->mark_low = lo;
    ctx->mark_span = span;
    return 0;
}

/* extend(prefix columns, m, weight, flags or None, live, tag, start, stop, extenders, filters,
 *        out columns or None, out owner or None, out weight, out flags, capacity, threads,
 *        chunk, per or None, value)
 * Live prefixes [start, stop): the extender tagged proposes the values of its key's range
 * (within the filters' bounds), summed over its layers (zero sums dropped); each candidate
 * passes the leftover filters, then every other extender validates it (its summed diff not 0);
 * completing extenders multiply their diff into the weight. Survivors are written in prefix
 * order: the prefix's columns and the value (out columns; or the value alone), the prefix's
 * position in `live` (owner), the weight and its overflow flag. Without out columns nothing
 * is written: the survivors are counted and their weights summed (times their values with
 * `value`), each prefix's sum also written at its row of `per` when given. Live and tag None: the
 * prefixes [start, stop) are counted and picked here first, as `count` would (every extender
 * reading one layer: the last step of a count, in one pass; by their ranges, `ext_ranged`, when
 * some reads several). Returns (survivors, proposed,
 * passed, flagged, err, err_row, err_ext, err_value, the weights' sum as high and low 64 bits:
 * 0 when writing, and when counted here the prefixes kept, the sum of their least counts and
 * the rows alive after each extender, summed; else zeros). */
static PyObject *py_extend(PyObject *self, PyObject *args) {
    PyObject *cols_o, *weight_o, *flags_o, *live_o, *tag_o, *exts_o, *filters_o;
    PyObject *ocols_o, *oowner_o, *oweight_o, *oflags_o, *per_o = Py_None;
    Py_ssize_t m, start, stop, cap;
    int threads = 1, value = 0;
    Py_ssize_t chunk = 1 << 11;
    if (!PyArg_ParseTuple(args, "OnOOOOnnOOOOOOn|inOp", &cols_o, &m, &weight_o, &flags_o, &live_o,
                          &tag_o, &start, &stop, &exts_o, &filters_o, &ocols_o, &oowner_o,
                          &oweight_o, &oflags_o, &cap, &threads, &chunk, &per_o, &value))
        return NULL;
    Held h = {.count = 0};
    Py_ssize_t nxs = PySequence_Size(exts_o);
    if (nxs < 0) return NULL;
    if (nxs > MAXX) return PyErr_Format(PyExc_ValueError, "%zd extenders (at most %d)", nxs, MAXX);
    size_t xs_size = sizeof(Ext) * (size_t)(nxs ? nxs : 1);
    Ext *xs = calloc(1, xs_size);
    if (!xs) return PyErr_NoMemory();
    Prefix P;
    ExtendCtx ctx = {.P = &P};
    Rows out = {.fixed = 1, .has_flags = 1, .cap = cap};
    Py_ssize_t nlive = 0;
    int ok = parse_exts(&h, exts_o, xs, &ctx.nx) == 0 && parse_prefix(&h, cols_o, m, &P) == 0;
    ok = ok && (ctx.weight = take(&h, weight_o, 8, 0, m, NULL, "weight"));
    if (ok && flags_o != Py_None) ok = (ctx.flags = take(&h, flags_o, 1, 0, m, NULL, "flags")) != NULL;
    if (live_o == Py_None) {
        /* no live rows: every prefix is counted here, by its ranges (`ext_ranged`) when an
         * extender reads several layers */
        nlive = m;
        for (int j = 0; ok && j < ctx.nx; j++) {
            ctx.ranged |= xs[j].nsource > 1;
            if (!xs[j].by_range) {
                PyErr_SetString(PyExc_ValueError, "counting in extend takes no counts layers");
                ok = 0;
            }
        }
    } else {
        ok = ok && (ctx.live = take(&h, live_o, 8, 0, -1, &nlive, "live"));
        ok = ok && (ctx.tag = take(&h, tag_o, 8, 0, nlive, NULL, "tag"));
    }
    if (ok && (start < 0 || stop > nlive || start > stop)) {
        PyErr_SetString(PyExc_ValueError, "a piece outside the live rows");
        ok = 0;
    }
    if (ok) {
        PyObject *fast = PySequence_Fast(filters_o, "filters");
        ok = fast != NULL;
        if (ok) {
            ctx.nf = (int)PySequence_Fast_GET_SIZE(fast);
            if (ctx.nf > MAXF) { PyErr_SetString(PyExc_ValueError, "too many filters"); ok = 0; }
            for (int f = 0; ok && f < ctx.nf; f++) {
                long long v;
                ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, f), "iiL", &ctx.fs[f].op,
                                      &ctx.fs[f].kind, &v) != 0;
                ctx.fs[f].value = (i64)v;
                if (ok && ctx.fs[f].kind == PREFIX_COL && (v < 0 || v >= P.k)) {
                    PyErr_SetString(PyExc_ValueError, "a filter on a column the prefix lacks");
                    ok = 0;
                }
            }
            Py_DECREF(fast);
        }
    }
    int writing = ocols_o != Py_None;
    ctx.counting = !writing;
    ctx.value = value && !writing;
    if (ok && !writing && per_o != Py_None)
        ok = (ctx.per = take(&h, per_o, 8, 1, m, NULL, "per")) != NULL;
    if (ok && writing) {
        PyObject *fast = PySequence_Fast(ocols_o, "out columns");
        ok = fast != NULL;
        int nocols = 0;
        if (ok) {
            nocols = (int)PySequence_Fast_GET_SIZE(fast);
            if (nocols != P.k + 1 && nocols != 1) {
                PyErr_SetString(PyExc_ValueError, "out columns: the prefix's and the value, or the value");
                ok = 0;
            }
            for (int j = 0; ok && j < nocols; j++)
                ok = (out.cols[j] = take(&h, PySequence_Fast_GET_ITEM(fast, j), 8, 1, cap, NULL, "out column")) != NULL;
            Py_DECREF(fast);
        }
        ctx.spread = nocols == P.k + 1;
        out.k = nocols;
        ok = ok && (out.cols[out.k++] = take(&h, oweight_o, 8, 1, cap, NULL, "out weight"));
        if (ok && oowner_o != Py_None) {
            ok = (out.cols[out.k++] = take(&h, oowner_o, 8, 1, cap, NULL, "owner")) != NULL;
            ctx.owner = 1;
        }
        ok = ok && (out.flags = take(&h, oflags_o, 1, 1, cap, NULL, "out flags"));
    }
    for (Py_ssize_t i = start; ok && ctx.live && i < stop; i++)
        if (ctx.live[i] < 0 || ctx.live[i] >= m || ctx.tag[i] < 0 || ctx.tag[i] >= ctx.nx) {
            PyErr_SetString(PyExc_ValueError, "a live row or tag out of range");
            ok = 0;
        }
    if (!ok) { release(&h); free(xs); return NULL; }
    ctx.mark_ext = -1;
    if (!writing && !choose_marks(&ctx, xs, stop - start)) {
        /* each thread's scratch: the extenders, then its marks */
        size_t words = (size_t)(ctx.mark_span >> 6) + 1;
        size_t grown = xs_size + sizeof(Marks) + sizeof(u64) * words;
        Ext *more = realloc(xs, grown);
        if (!more) { release(&h); free(xs); return PyErr_NoMemory(); }
        xs = more;
        memset((char *)xs + xs_size, 0, grown - xs_size);
        ctx.marks_at = xs_size;
        xs_size = grown;
    }
    Stats st = {0};
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    if (!writing) out.cap = 0; /* nothing is written: only counted */
    n = run_pool(extend_range, &ctx, xs, xs_size, start, stop, threads,
                 chunk > 0 ? chunk : 1, &out, &st);
    if (!writing) n = st.counted;
    Py_END_ALLOW_THREADS
    release(&h);
    free(xs);
    if (st.err == 3) return PyErr_NoMemory();
    /* the weights' sum as two longs: high * 2**64 + low (low unsigned) */
    i64 hi = (i64)(st.total >> 64);
    u64 lo = (u64)st.total;
    Py_ssize_t alive = 0;
    for (int j = 0; j < ctx.nx; j++) alive += st.alive[j];
    return Py_BuildValue("nnniininLKnnn", n, st.proposed, st.passed, st.flagged, st.err,
                         st.err_row, st.err_ext, (Py_ssize_t)st.err_value, (long long)hi,
                         (unsigned long long)lo, st.live, st.least, alive);
}

/* -- reading text edge lists -------------------------------------------------------------- */

/* The line ends in [p, p + n). */
static Py_ssize_t count_newlines(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t lines = 0;
    for (Py_ssize_t i = 0; i < n; i++) lines += p[i] == '\n';
    return lines;
}

/* newlines(bytes) -> how many "\n" it holds */
static PyObject *py_newlines(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    Py_ssize_t lines;
    Py_BEGIN_ALLOW_THREADS
    lines = count_newlines(b.buf, b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(lines);
}

/* lone_returns(bytes) -> whether a "\r" is not followed by "\n" (a line end of its own) */
static PyObject *py_lone_returns(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const unsigned char *p = b.buf;
    Py_ssize_t n = b.len;
    int lone = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i + 1 < n; i++) lone |= (p[i] == '\r') & (p[i + 1] != '\n');
    if (n && p[n - 1] == '\r') lone = 1;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyBool_FromLong(lone);
}

static inline int blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* The rows of a block of text lines (see py_parse_text) into out[j * cap + row]; the rows
 * written, or -1 where the block holds anything the strict rules do not vouch for. */
static Py_ssize_t parse_lines(const unsigned char *p, Py_ssize_t n, int arity, i64 *out,
                              Py_ssize_t cap) {
    Py_ssize_t i = 0, rows = 0;
    while (i < n) {
        while (i < n && blank(p[i])) i++;
        if (i == n) break;
        if (p[i] == '\n') { i++; continue; }           /* a blank line */
        if (p[i] == '#') {                              /* a comment line: anything to its end */
            const unsigned char *end = memchr(p + i, '\n', (size_t)(n - i));
            i = end ? (Py_ssize_t)(end - p) + 1 : n;
            continue;
        }
        if (rows == cap) return -1;
        for (int j = 0; j < arity; j++) {
            if (j) {
                if (i == n || !blank(p[i])) return -1;  /* fields apart by blanks */
                while (i < n && blank(p[i])) i++;
            }
            int negative = 0;
            if (i < n && (p[i] == '+' || p[i] == '-')) negative = p[i++] == '-';
            if (i == n || p[i] < '0' || p[i] > '9') return -1;
            u64 v = 0;
            while (i < n && p[i] >= '0' && p[i] <= '9') {
                u64 d = (u64)(p[i++] - '0');
                if (v > (UINT64_MAX - d) / 10) return -1;
                v = v * 10 + d;
            }
            if (negative ? v > (u64)1 << 63 : v > (u64)INT64_MAX) return -1;
            out[(Py_ssize_t)j * cap + rows] = negative ? (i64)(0 - v) : (i64)v;
        }
        while (i < n && blank(p[i])) i++;
        if (i < n && p[i] != '\n') return -1;         /* more fields, or not a number */
        i++;
        rows++;
    }
    return rows;
}

/* `parse_lines` for a block whose last byte is a line end (every block but perhaps a file's
 * last): every scan stops at that '\n' at the latest, so no scan checks the block's end, and a
 * field of at most 18 digits cannot leave the range (longer ones are read again, checked). */
static Py_ssize_t parse_lines_nl(const unsigned char *p, Py_ssize_t n, int arity, i64 *out,
                                 Py_ssize_t cap) {
    Py_ssize_t i = 0, rows = 0;
    while (i < n) {
        while (blank(p[i])) i++;
        if (p[i] == '\n') { i++; continue; }           /* a blank line */
        if (p[i] == '#') {                              /* a comment line: anything to its end */
            const unsigned char *end = memchr(p + i, '\n', (size_t)(n - i));
            i = (Py_ssize_t)(end - p) + 1;
            continue;
        }
        if (rows == cap) return -1;
        for (int j = 0; j < arity; j++) {
            if (j) {
                if (!blank(p[i])) return -1;            /* fields apart by blanks */
                while (blank(p[i])) i++;
            }
            int negative = 0;
            if (p[i] == '+' || p[i] == '-') negative = p[i++] == '-';
            Py_ssize_t first = i;
            u64 v = 0;
            while ((unsigned)(p[i] - '0') < 10u) v = v * 10 + (u64)(p[i++] - '0');
            if (i == first) return -1;
            if (i - first > 18) {
                v = 0;
                for (Py_ssize_t q = first; q < i; q++) {
                    u64 d = (u64)(p[q] - '0');
                    if (v > (UINT64_MAX - d) / 10) return -1;
                    v = v * 10 + d;
                }
                if (negative ? v > (u64)1 << 63 : v > (u64)INT64_MAX) return -1;
            }
            out[(Py_ssize_t)j * cap + rows] = negative ? (i64)(0 - v) : (i64)v;
        }
        while (blank(p[i])) i++;
        if (p[i] != '\n') return -1;                    /* more fields, or not a number */
        i++;
        rows++;
    }
    return rows;
}

/* parse_text(bytes, arity, out, cap) -> rows, or -1
 * A block of whole lines of a text edge list read by the strict rules alone: blank lines and
 * lines whose first non-blank is '#' skipped, every other line exactly `arity` fields of
 * [+-]?[0-9]+ in the int64 range, apart by runs of ' ', '\t' or '\r' (blanks may lead and
 * trail). Field j of data row r goes to out[j * cap + r]. -1 (nothing to trust in `out`): the
 * block holds something else, or more than `cap` data rows; the caller reads it line by
 * line, which names the first bad line. */
static PyObject *py_parse_text(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *out_o;
    int arity;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "y*iOn", &b, &arity, &out_o, &cap)) return NULL;
    Held h = {.count = 0};
    i64 *out = NULL;
    if (arity < 1 || arity > MAXW || cap < 0)
        PyErr_SetString(PyExc_ValueError, "parse_text: an arity of 1 to 32 and a capacity >= 0");
    else
        out = take(&h, out_o, 8, 1, (Py_ssize_t)arity * cap, NULL, "out");
    if (!out) {
        release(&h);
        PyBuffer_Release(&b);
        return NULL;
    }
    Py_ssize_t rows;
    Py_BEGIN_ALLOW_THREADS
    const unsigned char *text = b.buf;
    rows = b.len && text[b.len - 1] == '\n' ? parse_lines_nl(text, b.len, arity, out, cap)
                                            : parse_lines(text, b.len, arity, out, cap);
    Py_END_ALLOW_THREADS
    release(&h);
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(rows);
}

/* -- the module --------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"argsort", py_argsort, METH_VARARGS, "argsort(keys, sorted out, order out or None, threads=1): stable radix sort of uint64 keys"},
    {"consolidate", py_consolidate, METH_VARARGS, "consolidate(sorted keys (compacted in place), diff (one for all: length 1), order or None, sums out) -> runs kept, or -(row + 1)"},
    {"directory", py_directory, METH_VARARGS, "directory(sorted column, out, low): first row at or after each key"},
    {"pack", py_pack, METH_VARARGS, "pack(columns, n, lows, highs, bits, keys out, inside out or None) -> all inside"},
    {"unpack", py_unpack, METH_VARARGS, "unpack(keys, lows, bits, columns out)"},
    {"multiply", py_multiply, METH_VARARGS, "multiply(a, b, out, flags) -> whether any row is flagged"},
    {"lookup", py_lookup, METH_VARARGS, "lookup(layers, probe columns, m, out) -> -1, or the row whose sum leaves int64"},
    {"ranges", py_ranges, METH_VARARGS, "ranges(layer, probe columns, m, low or None, high or None, lo out, hi out)"},
    {"count", py_count, METH_VARARGS, "count(extenders, prefix columns, m, live, tag, least, alive) -> live rows, or -(row + 1)"},
    {"extend", py_extend, METH_VARARGS, "extend(...): propose, filter and validate one step's candidates"},
    {"checked", py_checked, METH_VARARGS, "checked(guard, offset, length) -> whether those bytes of a mapped segment match their blocks' sums"},
    {"seek_ranges", py_seek_ranges, METH_VARARGS, "seek_ranges(layer, probe columns, m, lo out, hi out) -> madvise calls: the key ranges read ahead level by level"},
    {"read_ahead", py_read_ahead, METH_VARARGS, "read_ahead(mode=-1, least rows=-1) -> (mode, reading ahead now, passes, madvise calls, seconds in passes): mode 0 never, 1 after a fault, 2 always"},
    {"lone_returns", py_lone_returns, METH_VARARGS, "lone_returns(bytes) -> whether a carriage return is not followed by a line feed"},
    {"newlines", py_newlines, METH_VARARGS, "newlines(bytes) -> how many line feeds it holds"},
    {"parse_text", py_parse_text, METH_VARARGS, "parse_text(bytes, arity, out, cap) -> data rows, or -1: a text block's fields into out[j * cap + row]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The kernel's compiled inner loops.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *mod = PyModule_Create(&module);
    if (!mod) return NULL;
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0) page_bytes = (uintptr_t)page;
    if (PyModule_AddStringConstant(mod, "SOURCE_HASH", WCOJ_SOURCE_HASH) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
