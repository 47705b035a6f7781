/* The barrier's sort in C: (meta, payload) pairs put in Meta order, ties as they were; and the
 * latency samples of a release (sampled_times, at the end).
 *
 * A release sorts what arrived since the last one (the keyed step's outputs, grouped by key,
 * so in runs of a few elements) and merges runs. list.sort(key=meta) compares Meta tuples
 * with Python's rich comparison: the index's ~50 outputs of a document share ts, source,
 * partition and offset, so most comparisons walk into the child ids' tuple; ~0.7 us an
 * element of the index, the barrier's largest cost. Here each Meta is read once into
 * integers and the sort compares those. ``barrier.py``'s list.sort is the reference and
 * takes any list this refuses; ``tests/barriers/test_meta_sort.py`` requires the same order.
 *
 * Cost: O(n log n) integer comparisons (O(n) for a list of two sorted runs), O(n) reads of
 * the Metas; memory kept from call to call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_CHILDREN 6

typedef struct {
    int64_t f[4];                  /* ts, source, partition, offset */
    int64_t child[MAX_CHILDREN];   /* child ids */
    Py_ssize_t nchild;
    int tomb;
    PyObject *item;
} Key;

/* an exact int (not a bool) that fits 64 bits, into *out; 0 for anything else */
static int read_int(PyObject *x, int64_t *out) {
    if (!PyLong_CheckExact(x))
        return 0;
#if PY_VERSION_HEX < 0x030C0000
    /* one digit or none (|x| < 2**30, every Meta field but a wall-clock ts): read in place,
     * a third of the sort's time through PyLong_AsLongLongAndOverflow */
    Py_ssize_t size = Py_SIZE(x);
    if (size >= -1 && size <= 1) {
        *out = size * (int64_t)((PyLongObject *)x)->ob_digit[0];
        return 1;
    }
#endif
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* pair -> key: 1, or 0 for a pair this does not take (any shape but a (meta, payload) pair
 * of a 6-field Meta of ints, a tuple of at most MAX_CHILDREN ints and a bool) */
static int read_meta(PyObject *meta, Key *k);

static int read_key(PyObject *item, Key *k) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 1 || !read_meta(PyTuple_GET_ITEM(item, 0), k))
        return 0;
    k->item = item;
    return 1;
}

/* a Meta alone -> key (its item left unset): 1, or 0 for a shape read_key does not take */
static int read_meta(PyObject *meta, Key *k) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6)
        return 0;
    for (int i = 0; i < 4; i++)
        if (!read_int(PyTuple_GET_ITEM(meta, i), &k->f[i]))
            return 0;
    PyObject *children = PyTuple_GET_ITEM(meta, 4), *tomb = PyTuple_GET_ITEM(meta, 5);
    if (!PyTuple_CheckExact(children) || PyTuple_GET_SIZE(children) > MAX_CHILDREN || !PyBool_Check(tomb))
        return 0;
    k->nchild = PyTuple_GET_SIZE(children);
    for (Py_ssize_t i = 0; i < k->nchild; i++)
        if (!read_int(PyTuple_GET_ITEM(children, i), &k->child[i]))
            return 0;
    k->tomb = tomb == Py_True;
    return 1;
}

/* Python's tuple order on the Metas (child ids: a prefix first): <0, 0, >0 */
static int compare(const Key *a, const Key *b) {
    for (int i = 0; i < 4; i++)
        if (a->f[i] != b->f[i])
            return a->f[i] < b->f[i] ? -1 : 1;
    Py_ssize_t n = a->nchild < b->nchild ? a->nchild : b->nchild;
    for (Py_ssize_t i = 0; i < n; i++)
        if (a->child[i] != b->child[i])
            return a->child[i] < b->child[i] ? -1 : 1;
    if (a->nchild != b->nchild)
        return a->nchild < b->nchild ? -1 : 1;
    return a->tomb - b->tomb;
}

/* Runs of at least MIN_RUN made by a stable insertion sort, then merged pairwise: a natural
 * merge sort, stable (ties keep their order), O(n) comparisons on two sorted runs (a merge of
 * the barrier's runs) as Timsort's, O(n log n) at most. */
#define MIN_RUN 32

static void insertion_sort(Key **a, Py_ssize_t lo, Py_ssize_t start, Py_ssize_t hi) {
    for (Py_ssize_t i = start; i < hi; i++) {
        Key *x = a[i];
        Py_ssize_t j = i;
        while (j > lo && compare(a[j - 1], x) > 0) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = x;
    }
}

static void merge(Key **a, Py_ssize_t lo, Py_ssize_t mid, Py_ssize_t hi, Key **tmp) {
    if (compare(a[mid - 1], a[mid]) <= 0)
        return; /* already in order */
    memcpy(tmp + lo, a + lo, (mid - lo) * sizeof(Key *));
    Py_ssize_t i = lo, j = mid, k = lo;
    while (i < mid && j < hi)
        a[k++] = compare(a[j], tmp[i]) < 0 ? a[j++] : tmp[i++]; /* a tie takes the left run's first */
    while (i < mid)
        a[k++] = tmp[i++];
}

static void natural_merge_sort(Key **a, Py_ssize_t n, Key **tmp, Py_ssize_t *bounds) {
    Py_ssize_t runs = 0, lo = 0;
    while (lo < n) {
        Py_ssize_t hi = lo + 1;
        while (hi < n && compare(a[hi - 1], a[hi]) <= 0)
            hi++;
        if (hi - lo < MIN_RUN && hi < n) {
            Py_ssize_t end = lo + MIN_RUN < n ? lo + MIN_RUN : n;
            insertion_sort(a, lo, hi, end);
            hi = end;
        }
        bounds[runs++] = lo;
        lo = hi;
    }
    bounds[runs] = n;
    while (runs > 1) {
        Py_ssize_t out = 0;
        for (Py_ssize_t r = 0; r < runs; r += 2) {
            if (r + 1 < runs)
                merge(a, bounds[r], bounds[r + 1], bounds[r + 2], tmp);
            bounds[out++] = bounds[r];
        }
        bounds[out] = n;
        runs = out;
    }
}

/* The sort's memory, kept between calls: fresh memory for each (a release's thousands of
 * keys) cost more in page faults than the sort. Used with the GIL held throughout. */
static struct {
    Key *keys;
    Key **order; /* n for the order, n for the merges' copies */
    Py_ssize_t *bounds;
    Py_ssize_t cap;
} scratch;

static int reserve(Py_ssize_t n) {
    if (n <= scratch.cap)
        return 0;
    Py_ssize_t cap = n < 4096 ? 4096 : n + n / 2;
    Key *keys = PyMem_Realloc(scratch.keys, cap * sizeof(Key));
    if (keys != NULL)
        scratch.keys = keys;
    Key **order = PyMem_Realloc(scratch.order, 2 * cap * sizeof(Key *));
    if (order != NULL)
        scratch.order = order;
    Py_ssize_t *bounds = PyMem_Realloc(scratch.bounds, (cap + 1) * sizeof(Py_ssize_t));
    if (bounds != NULL)
        scratch.bounds = bounds;
    if (keys == NULL || order == NULL || bounds == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    scratch.cap = cap;
    return 0;
}

/* sort_pairs(pairs) -> bool: sort the list in place as list.sort(key=itemgetter(0)) would,
 * True; False, the list untouched, if a pair is of a shape this does not take. */
static PyObject *sort_pairs(PyObject *mod, PyObject *list) {
    if (!PyList_CheckExact(list)) {
        PyErr_SetString(PyExc_TypeError, "sort_pairs takes a list of (meta, payload) pairs");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n < 2)
        Py_RETURN_TRUE;
    if (reserve(n) < 0)
        return NULL;
    Key *keys = scratch.keys, **order = scratch.order;
    Py_ssize_t *bounds = scratch.bounds;
    int sorted = 1, taken = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!read_key(PyList_GET_ITEM(list, i), &keys[i])) {
            taken = 0;
            break;
        }
        order[i] = &keys[i];
        if (sorted && i > 0 && compare(order[i - 1], order[i]) > 0)
            sorted = 0;
    }
    if (taken && !sorted) {
        /* nothing here calls back into Python: the list cannot change under the sort */
        natural_merge_sort(order, n, order + n, bounds);
        PyObject **items = ((PyListObject *)list)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            items[i] = order[i]->item; /* a permutation: the references stay as they were */
    }
    if (taken)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* split_items(items) -> (pairs, tombstones) or None
 *
 * Barrier.add_many's split of a step's (meta, payload, key) items: (meta, payload) pairs of
 * the elements, in order, and the tombstones' items, in order. None for an item that is not a
 * 3-tuple whose Meta is a tuple with a bool at 5 (the Python's comprehension then runs, and
 * raises what it raises). */
static PyObject *split_items(PyObject *mod, PyObject *items) {
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "split_items takes a list of (meta, payload, key) items");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *pairs = PyList_New(n), *tombstones = PyList_New(0);
    Py_ssize_t k = 0;
    if (pairs == NULL || tombstones == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3)
            goto refuse;
        PyObject *meta = PyTuple_GET_ITEM(item, 0);
        if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) < 6 || !PyBool_Check(PyTuple_GET_ITEM(meta, 5)))
            goto refuse;
        if (PyTuple_GET_ITEM(meta, 5) == Py_True) {
            if (PyList_Append(tombstones, item) < 0)
                goto fail;
            continue;
        }
        PyObject *pair = PyTuple_Pack(2, meta, PyTuple_GET_ITEM(item, 1));
        if (pair == NULL)
            goto fail;
        PyList_SET_ITEM(pairs, k++, pair);
    }
    /* the tombstones' places were left at the end: cut them off (they are NULL) */
    if (k < n && PyList_SetSlice(pairs, k, n, NULL) < 0)
        goto fail;
    PyObject *out = PyTuple_Pack(2, pairs, tombstones);
    Py_DECREF(pairs);
    Py_DECREF(tombstones);
    return out;
refuse:
    Py_DECREF(pairs);
    Py_DECREF(tombstones);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(pairs);
    Py_XDECREF(tombstones);
    return NULL;
}

/* lower_bounds(pairs, metas) -> [index, ...] or None
 *
 * For each of metas (in Meta order), the first index of the (meta, payload) pairs (in Meta
 * order) whose Meta is not below it, as bisect.bisect_left over the pairs' Metas, each search
 * starting where the last one ended: where a release finds the elements its settled tombstones
 * invalidate. Keys are read only where the search looks. None for a Meta read_meta does not
 * take (the Python bisects). O(len(metas) x log n). */
static PyObject *lower_bounds(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "lower_bounds(pairs: list, metas: list)");
        return NULL;
    }
    PyObject *pairs = args[0], *metas = args[1];
    Py_ssize_t n = PyList_GET_SIZE(pairs), m = PyList_GET_SIZE(metas), lo = 0;
    PyObject *out = PyList_New(m);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < m; j++) {
        Key target, probe;
        if (!read_meta(PyList_GET_ITEM(metas, j), &target))
            goto refuse;
        Py_ssize_t hi = n;
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (!read_key(PyList_GET_ITEM(pairs, mid), &probe))
                goto refuse;
            if (compare(&probe, &target) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        PyObject *at = PyLong_FromSsize_t(lo);
        if (at == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, at);
    }
    return out;
refuse:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* sampled_times(items, every) -> [t[:4], ...] or None
 *
 * LatencySamples.add's samples of (meta, ...) items: the first four fields of each Meta whose
 * offset is a multiple of every, or, for a window's result (a negative offset), whose time
 * is; one for each run of equal ones (a document's outputs share them: the same dict after
 * the update, a slice and a hash per run instead of per element). None for an item this does
 * not take (the Python then samples them all). */
static PyObject *sampled_times(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "sampled_times(items: list, every: int)");
        return NULL;
    }
    PyObject *items = args[0];
    long long every = PyLong_AsLongLong(args[1]);
    if (every == -1 && PyErr_Occurred())
        return NULL;
    if (every < 1) {
        PyErr_SetString(PyExc_ValueError, "sampled_times: every is at least 1");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    int64_t last[4] = {0, 0, 0, 0};
    int have_last = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *meta = PyTuple_Check(item) && PyTuple_GET_SIZE(item) >= 1 ? PyTuple_GET_ITEM(item, 0) : NULL;
        int64_t f[4];
        int ok = meta != NULL && PyTuple_Check(meta) && PyTuple_GET_SIZE(meta) >= 4;
        for (int k = 0; ok && k < 4; k++)
            ok = read_int(PyTuple_GET_ITEM(meta, k), &f[k]);
        if (!ok) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if (!(f[3] % every == 0 || (f[3] < 0 && f[0] % every == 0)))
            continue;
        if (have_last && f[0] == last[0] && f[1] == last[1] && f[2] == last[2] && f[3] == last[3])
            continue;
        PyObject *t = PyTuple_GetSlice(meta, 0, 4);
        if (t == NULL || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(t);
        memcpy(last, f, sizeof last);
        have_last = 1;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"sort_pairs", (PyCFunction)sort_pairs, METH_O, "sort (meta, payload) pairs in Meta order, ties as they were"},
    {"split_items", (PyCFunction)split_items, METH_O, "Barrier.add_many's pairs and tombstones of a step's items"},
    {"lower_bounds", (PyCFunction)(void (*)(void))lower_bounds, METH_FASTCALL, "bisect_left of each Meta over Meta-ordered pairs"},
    {"sampled_times", (PyCFunction)(void (*)(void))sampled_times, METH_FASTCALL, "LatencySamples.add's samples, a run of equal times once"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_meta_sort", "The barrier's sort in Meta order, in C (see barrier.py).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__meta_sort(void) { return PyModule_Create(&module); }
