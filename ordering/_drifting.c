/* Drifting keyed state's in-order path in C: what every element of a backlog pays.
 *
 * ``keyed_state.DriftingLogs`` and its two forms (``DriftingKeyedState``: a value per key;
 * ``entry_state.EntryKeyedState``: a map of entries per key) are the reference, in Python.
 * This module runs the same steps for the common case and calls back into those classes
 * for everything else, so there is one definition of each rare case:
 *
 *   - apply_batch: an element that lands at the tail of its key's log (or starts one) is
 *     appended here, and applied at once when the batch has not touched its key; one that
 *     lands before the tail is inserted here and the tail rolled back (entries: the journals
 *     undone), to be re-applied when the batch has landed; a tombstone and an element while
 *     tombstones wait for their invalidee go to the class's ``_land``.
 *   - replay: the user's function is called here with the state (a value, or an
 *     ``EntryHandle``: MapState's protocol over the overlay), and its output recorded (an
 *     output that replaces an earlier one: a tombstone and the new one); an element whose
 *     function raises goes to the class's ``_replay_failed``.
 *   - advance: the keys whose head the watermark passed are folded here (entries: the
 *     bottoms of the overlay's stacks, every key's in one call of the backend's ``fold``;
 *     values: the last state), with the class's ``_fold`` when elements were diverted to
 *     dead letters.
 *   - reads of settled entries go through the cache's decoded states where the backend
 *     offers them (``read_view``), else through its ``get``.
 *
 * Why C: in one process an element of the inverted index cost ~13 us in these steps, a
 * dozen Python frames and ~40 dict and list operations, where the user's function takes
 * ~0.5 us. Nothing here changes what is computed: tests run every ordering property on
 * both paths (``tests/ordering/test_in_order_path.py``).
 *
 * Costs are those of the Python: an in-order element is O(1) plus its function, an
 * element that lands i places before the tail costs i re-applications, a fold is
 * O(writes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ---- LogFields: the four parallel lists of a key's log (KeyLog's base) ---- */

typedef struct {
    PyObject_HEAD
    PyObject *metas;    /* list of metas, sorted */
    PyObject *payloads; /* list */
    PyObject *after;    /* list: the state after each entry, or its journal; None: not applied */
    PyObject *outputs;  /* list of lists: what each entry emitted */
} LogFields;

static int logfields_traverse(LogFields *self, visitproc visit, void *arg) {
    Py_VISIT(self->metas);
    Py_VISIT(self->payloads);
    Py_VISIT(self->after);
    Py_VISIT(self->outputs);
    return 0;  /* a heap subclass's own traverse visits its type */
}

static int logfields_clear(LogFields *self) {
    Py_CLEAR(self->metas);
    Py_CLEAR(self->payloads);
    Py_CLEAR(self->after);
    Py_CLEAR(self->outputs);
    return 0;
}

static void logfields_dealloc(LogFields *self) {
    PyObject_GC_UnTrack(self);
    logfields_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);  /* a heap subclass's own dealloc releases its type */
}

static PyMemberDef logfields_members[] = {
    {"metas", T_OBJECT_EX, offsetof(LogFields, metas), 0, "metas, sorted"},
    {"payloads", T_OBJECT_EX, offsetof(LogFields, payloads), 0, "payloads"},
    {"after", T_OBJECT_EX, offsetof(LogFields, after), 0, "state or journal after each entry"},
    {"outputs", T_OBJECT_EX, offsetof(LogFields, outputs), 0, "outputs of each entry"},
    {NULL}
};

static PyTypeObject LogFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._drifting.LogFields",
    .tp_doc = "The fields of a key's log (KeyLog adds its methods in Python).",
    .tp_basicsize = sizeof(LogFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)logfields_traverse,
    .tp_clear = (inquiry)logfields_clear,
    .tp_dealloc = (destructor)logfields_dealloc,
    .tp_members = logfields_members,
};

/* ---- InOrderPath: one form's accelerator, with the Python objects it builds and compares with ---- */

typedef struct {
    PyObject_HEAD
    int entries;            /* EntryKeyedState's form (else DriftingKeyedState's) */
    PyTypeObject *keylog;   /* keyed_state.KeyLog */
    PyObject *no_output;    /* keyed_state.NO_OUTPUT: the shared empty output list */
    PyObject *deleted;      /* entry_state.DELETED (entries only) */
    PyObject *size_entry;   /* entry_state.SIZE (entries only) */
} InOrderPath;

static PyObject *small_ints[8];  /* child ids 0..7 as 1-tuples */

static int path_ready(const InOrderPath *self) {
    if (self->keylog == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "InOrderPath.__init__ was not called");
        return 0;
    }
    return 1;
}

static PyObject *s_logs, *s_heads, *s_pending, *s_size, *s_land, *s_push, *s_pop_below, *s_fn, *s_flat,
    *s_backend, *s_overlay, *s_get, *s_fold, *s_replay_failed, *s_not_a_pair, *s_emit_diff, *s_diverted, *s_check_pending,
    *s__fold, *s_read_view, *s_complete, *s_out_of_order, *s_tombstones;

/* ---- small helpers ---- */

/* A record (key, entry) is a tuple, whose hash CPython does not cache: the entry path hashes
 * each record once and meets the overlay and the cache's states with that hash. */
#define GET_H(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))

/* state.<name> += delta (a counter the C keeps in a local until the call ends); keeps an
 * exception that is being raised. */
static int add_to(PyObject *state, PyObject *name, Py_ssize_t delta) {
    if (delta == 0)
        return 0;
    PyObject *etype, *evalue, *etb;
    PyErr_Fetch(&etype, &evalue, &etb);
    int rc = -1;
    PyObject *old = PyObject_GetAttr(state, name);
    if (old != NULL) {
        PyObject *d = PyLong_FromSsize_t(delta);
        PyObject *now = d ? PyNumber_Add(old, d) : NULL;
        if (now != NULL)
            rc = PyObject_SetAttr(state, name, now);
        Py_XDECREF(now);
        Py_XDECREF(d);
        Py_DECREF(old);
    }
    if (etype != NULL) {
        if (rc < 0)
            PyErr_Clear();
        PyErr_Restore(etype, evalue, etb);
        return -1;
    }
    return rc;
}

#define add_size(state, delta) add_to((state), s_size, (delta))

static LogFields *as_log(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &LogFieldsType)) {
        PyErr_Format(PyExc_TypeError, "a key's log must be a KeyLog, not %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    LogFields *log = (LogFields *)obj;
    if (!log->metas || !log->payloads || !log->after || !log->outputs || !PyList_Check(log->metas) ||
        !PyList_Check(log->payloads) || !PyList_Check(log->after) || !PyList_Check(log->outputs)) {
        PyErr_SetString(PyExc_TypeError, "a KeyLog's fields must be lists");
        return NULL;
    }
    return log;
}

/* A new log of one element (KeyLog.of). */
static PyObject *log_of(const InOrderPath *p, PyObject *meta, PyObject *payload) {
    PyObject *obj = p->keylog->tp_alloc(p->keylog, 0);
    if (obj == NULL)
        return NULL;
    LogFields *log = (LogFields *)obj;
    log->metas = PyList_New(1);
    log->payloads = PyList_New(1);
    log->after = PyList_New(1);
    log->outputs = PyList_New(1);
    if (!log->metas || !log->payloads || !log->after || !log->outputs) {
        Py_DECREF(obj);
        return NULL;
    }
    Py_INCREF(meta); PyList_SET_ITEM(log->metas, 0, meta);
    Py_INCREF(payload); PyList_SET_ITEM(log->payloads, 0, payload);
    Py_INCREF(Py_None); PyList_SET_ITEM(log->after, 0, Py_None);
    Py_INCREF(p->no_output); PyList_SET_ITEM(log->outputs, 0, p->no_output);
    return obj;
}

/* The first i of a sorted list whose item is not below x (bisect_left); -1 on error. */
static Py_ssize_t bisect_left(PyObject *list, PyObject *x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        PyObject *item = PyList_GET_ITEM(list, mid);
        Py_INCREF(item);
        int lt = PyObject_RichCompareBool(item, x, Py_LT);
        Py_DECREF(item);
        if (lt < 0)
            return -1;
        if (lt)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* (m0, m1, m2, m3, ids + (k,), m5) */
static PyObject *child_meta(PyObject *meta, Py_ssize_t k) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6) {
        PyErr_SetString(PyExc_TypeError, "a meta is a 6-tuple");
        return NULL;
    }
    PyObject *suffix;
    if (k < 8) {
        suffix = small_ints[k];
        Py_INCREF(suffix);
    } else {
        PyObject *n = PyLong_FromSsize_t(k);
        if (n == NULL)
            return NULL;
        suffix = PyTuple_Pack(1, n);
        Py_DECREF(n);
        if (suffix == NULL)
            return NULL;
    }
    PyObject *parent = PyTuple_GET_ITEM(meta, 4), *ids;
    if (PyTuple_CheckExact(parent)) {  /* ids + (k,), without the generic concatenation's dispatch */
        Py_ssize_t n = PyTuple_GET_SIZE(parent);
        ids = PyTuple_New(n + 1);
        if (ids != NULL) {
            for (Py_ssize_t q = 0; q < n; q++) {
                Py_INCREF(PyTuple_GET_ITEM(parent, q));
                PyTuple_SET_ITEM(ids, q, PyTuple_GET_ITEM(parent, q));
            }
            Py_INCREF(PyTuple_GET_ITEM(suffix, 0));
            PyTuple_SET_ITEM(ids, n, PyTuple_GET_ITEM(suffix, 0));
        }
    } else {
        ids = PySequence_Concat(parent, suffix);
    }
    Py_DECREF(suffix);
    if (ids == NULL)
        return NULL;
    PyObject *child = PyTuple_New(6);
    if (child == NULL) {
        Py_DECREF(ids);
        return NULL;
    }
    for (int f = 0; f < 6; f++) {
        PyObject *v = f == 4 ? ids : PyTuple_GET_ITEM(meta, f);
        if (f != 4)
            Py_INCREF(v);
        PyTuple_SET_ITEM(child, f, v);
    }
    return child;
}

/* [item] */
static PyObject *list_of(PyObject *item) {
    PyObject *list = PyList_New(1);
    if (list != NULL) {
        Py_INCREF(item);
        PyList_SET_ITEM(list, 0, item);
    }
    return list;
}

static int append_pair(PyObject *out, PyObject *a, PyObject *b) {
    PyObject *pair = PyTuple_Pack(2, a, b);
    if (pair == NULL)
        return -1;
    int rc = PyList_Append(out, pair);
    Py_DECREF(pair);
    return rc;
}

/* What one apply_batch call emits into: its list, whether its items are ``(meta, payload, None)``
 * (``triples``: what Keyed.run hands on, built here instead of by a comprehension over pairs)
 * or ``(meta, payload)``, and the tombstones emitted so far (added to the state's count once). */
typedef struct {
    PyObject *out;
    int triples;
    Py_ssize_t tombstones;
} Emit;

static int emit(Emit *e, PyObject *meta, PyObject *payload) {
    PyObject *item = e->triples ? PyTuple_Pack(3, meta, payload, Py_None) : PyTuple_Pack(2, meta, payload);
    if (item == NULL)
        return -1;
    int rc = PyList_Append(e->out, item);
    Py_DECREF(item);
    return rc;
}

/* (m0, m1, m2, m3, ids, True): tombstone_of */
static PyObject *tombstone_meta(PyObject *meta) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6) {
        PyErr_SetString(PyExc_TypeError, "a meta is a 6-tuple");
        return NULL;
    }
    PyObject *t = PyTuple_New(6);
    if (t == NULL)
        return NULL;
    for (int f = 0; f < 6; f++) {
        PyObject *v = f == 5 ? Py_True : PyTuple_GET_ITEM(meta, f);
        Py_INCREF(v);
        PyTuple_SET_ITEM(t, f, v);
    }
    return t;
}

/* DriftingLogs._emit_diff: the outputs of ``meta`` were ``old`` and are ``new``; each one that
 * changed is invalidated (a tombstone) and emitted anew. Equality as Python's ``==`` (no
 * identity shortcut), as the reference compares. */
static int emit_diff(Emit *e, PyObject *meta, PyObject *old, PyObject *new, int flat) {
    Py_ssize_t n_old = PyList_GET_SIZE(old), n_new = PyList_GET_SIZE(new);
    for (Py_ssize_t k = 0; k < n_old || k < n_new; k++) {
        if (k < n_old && k < n_new) {
            PyObject *a = PyList_GET_ITEM(old, k), *b = PyList_GET_ITEM(new, k);
            Py_INCREF(a);
            Py_INCREF(b);
            PyObject *eq = PyObject_RichCompare(a, b, Py_EQ);
            int same = eq == NULL ? -1 : PyObject_IsTrue(eq);
            Py_XDECREF(eq);
            Py_DECREF(a);
            Py_DECREF(b);
            if (same < 0)
                return -1;
            if (same)
                continue;
            n_old = PyList_GET_SIZE(old);  /* an __eq__ may not change them, but must not crash us */
            n_new = PyList_GET_SIZE(new);
        }
        PyObject *m = flat ? child_meta(meta, k) : (Py_INCREF(meta), meta);
        if (m == NULL)
            return -1;
        int r = 0;
        if (k < n_old) {
            PyObject *t = tombstone_meta(m);
            r = t == NULL ? -1 : emit(e, t, PyList_GET_ITEM(old, k));
            Py_XDECREF(t);
            if (r == 0)
                e->tombstones++;
        }
        if (r == 0 && k < n_new)
            r = emit(e, m, PyList_GET_ITEM(new, k));
        Py_DECREF(m);
        if (r < 0)
            return -1;
    }
    return 0;
}

/* Items a Python callback appended as pairs (``_land``, ``_replay_failed``) become triples. */
static int pairs_to_triples(PyObject *out) {
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(out); k++) {
        PyObject *item = PyList_GET_ITEM(out, k);
        if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) {
            PyObject *t = PyTuple_Pack(3, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), Py_None);
            if (t == NULL)
                return -1;
            PyList_SetItem(out, k, t);  /* steals t; releases the pair */
        }
    }
    return 0;
}

/* DriftingLogs._record: entry j produced ``result``; emit what changed. 0 or -1. */
static int record(const InOrderPath *p, LogFields *log, Py_ssize_t j, PyObject *result, int flat, Emit *e) {
    PyObject *new;
    if (flat)
        /* a list nothing else holds (the function built it and let go) is taken as it is, not copied:
         * no one can change it after (the reference copies: list(result)) */
        new = result == Py_None ? (Py_INCREF(p->no_output), p->no_output)
              : (PyList_CheckExact(result) && Py_REFCNT(result) == 1) ? (Py_INCREF(result), result) : PySequence_List(result);
    else if (result == Py_None)
        new = (Py_INCREF(p->no_output), p->no_output);
    else
        new = list_of(result);
    if (new == NULL)
        return -1;
    PyObject *old = PyList_GET_ITEM(log->outputs, j);
    Py_INCREF(old);
    int differs, rc = -1;
    if (PyList_Check(old) && PyList_GET_SIZE(old) == 0)
        differs = PyList_GET_SIZE(new) != 0;
    else
        differs = PyObject_RichCompareBool(new, old, Py_NE);
    if (differs < 0)
        goto done;
    if (differs) {
        PyObject *meta = PyList_GET_ITEM(log->metas, j);
        Py_INCREF(meta);
        int r, replaces = PyObject_IsTrue(old);
        if (replaces < 0) {
            r = -1;
        } else if (replaces) {
            r = PyList_Check(old) ? emit_diff(e, meta, old, new, flat) : -1;
            if (!PyList_Check(old))
                PyErr_SetString(PyExc_TypeError, "a log entry's outputs are a list");
        } else if (flat) {
            r = 0;
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(new) && r == 0; k++) {
                PyObject *child = child_meta(meta, k);
                r = child == NULL ? -1 : emit(e, child, PyList_GET_ITEM(new, k));
                Py_XDECREF(child);
            }
        } else {
            r = emit(e, meta, result);
        }
        Py_DECREF(meta);
        if (r < 0)
            goto done;
        Py_INCREF(new);
        PyList_SetItem(log->outputs, j, new);  /* steals new; releases the old item */
    }
    rc = 0;
done:
    Py_DECREF(old);
    Py_DECREF(new);
    return rc;
}

/* Entry j's function (or its recording) raised: the class's _replay_failed decides (raise, or
 * record a dead letter with the key's state as if the element had not come). */
static int replay_failed(PyObject *state, PyObject *key, PyObject *log, Py_ssize_t j, PyObject *out) {
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;  /* as ``except Exception``: KeyboardInterrupt and the like go through */
    PyObject *etype, *exc, *etb;
    PyErr_Fetch(&etype, &exc, &etb);
    PyErr_NormalizeException(&etype, &exc, &etb);
    if (etb != NULL && exc != NULL)
        PyException_SetTraceback(exc, etb);
    Py_XDECREF(etype);
    Py_XDECREF(etb);
    PyObject *jj = PyLong_FromSsize_t(j);
    PyObject *res = jj ? PyObject_CallMethodObjArgs(state, s_replay_failed, key, log, jj, exc, out, NULL) : NULL;
    Py_XDECREF(jj);
    Py_XDECREF(exc);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* ---- BackendReader: an entry backend's reads, the cache's decoded states first ---- */

/* The settled value of a record, as the backend's get(record) gives it (DELETED: none). With a
 * backend that offers read_view() (a StateCache's decoded states, its mark of a removed record
 * and the cache), a cached record, and a missing one while the cache is complete, are read
 * here: two Python frames less per read, and the index reads 1.6 records an element. */
typedef struct {
    PyObject_HEAD
    PyObject *getter;   /* the backend's get(record) */
    PyObject *states;   /* dict, or NULL: no read_view */
    PyObject *removed;  /* the states' mark of a removed record */
    PyObject *cache;    /* its ``complete`` says whether a miss is a record with no value */
    PyObject *deleted;  /* what the backend's get returns for a record with no value */
    int complete;       /* the cache's ``complete`` once a miss asked it (-1: not yet): it cannot
                         * change within a call, as only a ``get`` (not made while complete) or a
                         * fold can change the cache */
} BackendReader;

static int reader_traverse(BackendReader *self, visitproc visit, void *arg) {
    Py_VISIT(self->getter);
    Py_VISIT(self->states);
    Py_VISIT(self->removed);
    Py_VISIT(self->cache);
    Py_VISIT(self->deleted);
    return 0;
}

static int reader_clear(BackendReader *self) {
    Py_CLEAR(self->getter);
    Py_CLEAR(self->states);
    Py_CLEAR(self->removed);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->deleted);
    return 0;
}

static void reader_dealloc(BackendReader *self) {
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject BackendReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._drifting.BackendReader",
    .tp_basicsize = sizeof(BackendReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_doc = "an entry backend's reads (built by the in-order path, once per call)",
};

/* The reader of backend: its get, and its read_view() if it has one. */
static PyObject *reader_new(PyObject *backend, PyObject *deleted) {
    BackendReader *r = PyObject_GC_New(BackendReader, &BackendReaderType);
    if (r == NULL)
        return NULL;
    r->getter = r->states = r->removed = r->cache = NULL;
    r->complete = -1;
    Py_INCREF(deleted); r->deleted = deleted;
    PyObject_GC_Track(r);
    if ((r->getter = PyObject_GetAttr(backend, s_get)) == NULL)
        goto fail;
    PyObject *view_of = PyObject_GetAttr(backend, s_read_view);
    if (view_of == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto fail;
        PyErr_Clear();
        return (PyObject *)r;
    }
    PyObject *view = PyObject_CallNoArgs(view_of);
    Py_DECREF(view_of);
    if (view == NULL)
        goto fail;
    if (!PyTuple_Check(view) || PyTuple_GET_SIZE(view) != 3 || !PyDict_Check(PyTuple_GET_ITEM(view, 0))) {
        Py_DECREF(view);
        PyErr_SetString(PyExc_TypeError, "read_view() returns (a dict of states, the removed mark, the cache)");
        goto fail;
    }
    r->states = PyTuple_GET_ITEM(view, 0); Py_INCREF(r->states);
    r->removed = PyTuple_GET_ITEM(view, 1); Py_INCREF(r->removed);
    r->cache = PyTuple_GET_ITEM(view, 2); Py_INCREF(r->cache);
    Py_DECREF(view);
    return (PyObject *)r;
fail:
    Py_DECREF(r);
    return NULL;
}

/* The backend's value of record (the reader's ``deleted``: none). New ref. */
static PyObject *reader_get(BackendReader *r, PyObject *record, Py_hash_t h) {
    if (r->states != NULL) {
        PyObject *v = GET_H(r->states, record, h);
        if (v != NULL) {
            v = (v == r->removed || v == Py_None) ? r->deleted : v;
            Py_INCREF(v);
            return v;
        }
        if (PyErr_Occurred())
            return NULL;
        if (r->complete < 0) {
            PyObject *c = PyObject_GetAttr(r->cache, s_complete);
            int complete = c == NULL ? -1 : PyObject_IsTrue(c);
            Py_XDECREF(c);
            if (complete < 0)
                return NULL;
            r->complete = complete;
        }
        if (r->complete) {
            Py_INCREF(r->deleted);
            return r->deleted;
        }
    }
    return PyObject_CallOneArg(r->getter, record);
}

/* ---- EntryHandle: MapState's protocol over the overlay, for entry state's functions ---- */

typedef struct {
    PyObject_HEAD
    InOrderPath *path;  /* its markers: DELETED, SIZE */
    PyObject *overlay;  /* dict: (key, entry) -> list of values, in log order */
    BackendReader *reader;  /* the backend's reads */
    PyObject *key;
    PyObject *journal;  /* list: the entries this element wrote (not the records: a fold makes them
                         * anew, and the cache keys its states by new tuples made together,
                         * ~15% less CPU in its put_many than the records made at apply time) */
    PyObject *size_record;  /* (key, SIZE), made at its first use (NULL: not yet) */
} EntryHandle;

static int handle_traverse(EntryHandle *self, visitproc visit, void *arg) {
    Py_VISIT(self->path);
    Py_VISIT(self->overlay);
    Py_VISIT(self->reader);
    Py_VISIT(self->key);
    Py_VISIT(self->journal);
    Py_VISIT(self->size_record);
    return 0;
}

static int handle_clear(EntryHandle *self) {
    Py_CLEAR(self->path);
    Py_CLEAR(self->overlay);
    Py_CLEAR(self->reader);
    Py_CLEAR(self->key);
    Py_CLEAR(self->journal);
    Py_CLEAR(self->size_record);
    return 0;
}

static void handle_dealloc(EntryHandle *self) {
    PyObject_GC_UnTrack(self);
    handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject EntryHandleType;

static PyObject *handle_new(InOrderPath *path, PyObject *overlay, BackendReader *reader, PyObject *key, PyObject *journal) {
    EntryHandle *h = PyObject_GC_New(EntryHandle, &EntryHandleType);
    if (h == NULL)
        return NULL;
    Py_INCREF(path); h->path = path;
    Py_INCREF(overlay); h->overlay = overlay;
    Py_INCREF(reader); h->reader = reader;
    Py_INCREF(key); h->key = key;
    Py_INCREF(journal); h->journal = journal;
    h->size_record = NULL;
    PyObject_GC_Track(h);
    return (PyObject *)h;
}

/* The value of record (key, entry): the top of its overlay stack, else the backend's (DELETED: none). New ref. */
static PyObject *read_record(PyObject *overlay, BackendReader *reader, PyObject *record) {
    Py_hash_t h = PyObject_Hash(record);
    if (h == -1)
        return NULL;
    PyObject *stack = GET_H(overlay, record, h);
    if (stack != NULL && PyList_Check(stack) && PyList_GET_SIZE(stack) > 0) {
        PyObject *top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
        Py_INCREF(top);
        return top;
    }
    if (PyErr_Occurred())
        return NULL;
    return reader_get(reader, record, h);
}

/* (key, SIZE), borrowed: made once per handle (len and every write that changes the count use it). */
static PyObject *size_record_of(EntryHandle *self) {
    if (self->size_record == NULL)
        self->size_record = PyTuple_Pack(2, self->key, self->path->size_entry);
    return self->size_record;
}

static PyObject *handle_read(EntryHandle *self, PyObject *entry) {
    PyObject *record = entry == self->path->size_entry ? size_record_of(self) : PyTuple_Pack(2, self->key, entry);
    if (record == NULL)
        return NULL;
    if (record == self->size_record)
        Py_INCREF(record);
    PyObject *value = read_record(self->overlay, self->reader, record);
    Py_DECREF(record);
    return value;
}

/* Push value onto record's stack (a new stack if it has none). */
static int push_value(PyObject *overlay, PyObject *record, Py_hash_t h, PyObject *stack, PyObject *value) {
    if (stack != NULL)
        return PyList_Append(stack, value);
    PyObject *fresh = list_of(value);
    if (fresh == NULL)
        return -1;
    int rc = _PyDict_SetItem_KnownHash(overlay, record, fresh, h);
    Py_DECREF(fresh);
    return rc;
}

/* EntryKeyedState._write: value (DELETED: remove) over the entry, journaled, the key's size kept. */
static int handle_write(EntryHandle *self, PyObject *entry, PyObject *value) {
    PyObject *record = PyTuple_Pack(2, self->key, entry);
    if (record == NULL)
        return -1;
    int rc = -1;
    PyObject *old = NULL, *size_record = NULL, *size = NULL, *stack = NULL;
    Py_hash_t h = PyObject_Hash(record), hs = 0;
    if (h == -1)
        goto done;
    stack = GET_H(self->overlay, record, h);  /* borrowed; never empty */
    if (stack == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(stack);
    if (stack != NULL && PyList_Check(stack) && PyList_GET_SIZE(stack) > 0) {
        old = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
        Py_INCREF(old);
    } else {
        Py_CLEAR(stack);
        old = reader_get(self->reader, record, h);
        if (old == NULL)
            goto done;
    }
    int was_deleted = old == self->path->deleted, now_deleted = value == self->path->deleted;
    if (was_deleted == now_deleted) {
        if (now_deleted) {  /* removing a missing entry writes nothing */
            rc = 0;
            goto done;
        }
    } else {
        size_record = size_record_of(self);
        if (size_record == NULL)
            goto done;
        Py_INCREF(size_record);
        if ((hs = PyObject_Hash(size_record)) == -1)
            goto done;
        PyObject *sizes = GET_H(self->overlay, size_record, hs);
        if (sizes == NULL && PyErr_Occurred())
            goto done;
        if (sizes != NULL && !(PyList_Check(sizes) && PyList_GET_SIZE(sizes) > 0))
            sizes = NULL;
        PyObject *current;
        if (sizes != NULL) {
            current = PyList_GET_ITEM(sizes, PyList_GET_SIZE(sizes) - 1);
            Py_INCREF(current);
        } else if ((current = reader_get(self->reader, size_record, hs)) == NULL) {
            goto done;
        }
        long n = 0;
        if (current != self->path->deleted) {
            n = PyLong_AsLong(current);
            if (n == -1 && PyErr_Occurred()) {
                Py_DECREF(current);
                goto done;
            }
        }
        Py_DECREF(current);
        size = PyLong_FromLong(n + (now_deleted ? -1 : 1));
        if (size == NULL || push_value(self->overlay, size_record, hs, sizes, size) < 0 ||
            PyList_Append(self->journal, self->path->size_entry) < 0)
            goto done;
    }
    if (push_value(self->overlay, record, h, stack, value) < 0 || PyList_Append(self->journal, entry) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(stack);
    Py_XDECREF(old);
    Py_XDECREF(size_record);
    Py_XDECREF(size);
    Py_DECREF(record);
    return rc;
}

static PyObject *handle_get(EntryHandle *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(entry, default=None)");
        return NULL;
    }
    PyObject *value = handle_read(self, args[0]);
    if (value == self->path->deleted) {
        Py_DECREF(value);
        value = nargs == 2 ? args[1] : Py_None;
        Py_INCREF(value);
    }
    return value;
}

static int handle_contains(EntryHandle *self, PyObject *entry) {
    PyObject *value = handle_read(self, entry);
    if (value == NULL)
        return -1;
    int present = value != self->path->deleted;
    Py_DECREF(value);
    return present;
}

static Py_ssize_t handle_len(EntryHandle *self) {
    PyObject *value = handle_read(self, self->path->size_entry);
    if (value == NULL)
        return -1;
    Py_ssize_t n = value == self->path->deleted ? 0 : PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return n;
}

static PyObject *handle_put(EntryHandle *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(entry, value)");
        return NULL;
    }
    PyObject *entry = args[0], *value = args[1];
    if (value == Py_None) {
        PyObject *r = PyObject_Repr(entry);
        if (r != NULL)
            PyErr_Format(PyExc_ValueError,
                         "MapState.put(%U, None): an entry's value cannot be None; remove(entry) deletes it", r);
        Py_XDECREF(r);
        return NULL;
    }
    if (PyTuple_Check(entry)) {
        int reserved = PyObject_RichCompareBool(entry, self->path->size_entry, Py_EQ);
        if (reserved < 0)
            return NULL;
        if (reserved) {
            PyObject *r = PyObject_Repr(self->path->size_entry);
            if (r != NULL)
                PyErr_Format(PyExc_ValueError, "%U is reserved", r);
            Py_XDECREF(r);
            return NULL;
        }
    }
    if (handle_write(self, entry, value) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *handle_remove(EntryHandle *self, PyObject *entry) {
    if (handle_write(self, entry, self->path->deleted) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef handle_methods[] = {
    {"get", (PyCFunction)(void (*)(void))handle_get, METH_FASTCALL, "get(entry, default=None): the entry's value"},
    {"put", (PyCFunction)(void (*)(void))handle_put, METH_FASTCALL, "put(entry, value): write the entry"},
    {"remove", (PyCFunction)handle_remove, METH_O, "remove(entry): remove the entry if present"},
    {NULL}
};

static PySequenceMethods handle_as_sequence = {
    .sq_length = (lenfunc)handle_len,
    .sq_contains = (objobjproc)handle_contains,
};

static PyTypeObject EntryHandleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._drifting.EntryHandle",
    .tp_doc = "The state of one key as one element sees it: MapState's get, put, remove, in, len.",
    .tp_basicsize = sizeof(EntryHandle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_methods = handle_methods,
    .tp_as_sequence = &handle_as_sequence,
};

/* ---- the two forms: replay (apply entries i.. of a log) and fold (the first n leave) ---- */

/* What a form's steps read from the state, loaded once per apply_batch or advance call. */
typedef struct {
    InOrderPath *path;                          /* borrowed: the caller holds it */
    PyObject *fn, *backend, *overlay;           /* overlay: entries only */
    BackendReader *reader;                      /* entries that apply (not those that fold) only */
    PyObject *diverted;                         /* values only: the set of dead-lettered metas */
    int flat;
} Form;

static void form_release(Form *f) {
    Py_CLEAR(f->fn);
    Py_CLEAR(f->backend);
    Py_CLEAR(f->reader);
    Py_CLEAR(f->overlay);
    Py_CLEAR(f->diverted);
}

/* ``reads``: the call applies elements, whose functions read settled entries (an advance only
 * folds: it needs no reader, whose read_view() is two Python frames). */
static int form_load(PyObject *state, InOrderPath *path, Form *f, int reads) {
    memset(f, 0, sizeof(*f));
    f->path = path;
    f->fn = PyObject_GetAttr(state, s_fn);
    f->backend = f->fn ? PyObject_GetAttr(state, s_backend) : NULL;
    PyObject *flat = f->backend ? PyObject_GetAttr(state, s_flat) : NULL;
    if (flat == NULL)
        goto fail;
    f->flat = PyObject_IsTrue(flat);
    Py_DECREF(flat);
    if (f->flat < 0)
        goto fail;
    if (!path->entries) {
        f->diverted = PyObject_GetAttr(state, s_diverted);
        if (f->diverted == NULL)
            goto fail;
        if (!PySet_Check(f->diverted)) {
            PyErr_SetString(PyExc_TypeError, "DriftingKeyedState.diverted must be a set");
            goto fail;
        }
    } else {
        f->overlay = PyObject_GetAttr(state, s_overlay);
        if (f->overlay == NULL)
            goto fail;
        if (!PyDict_Check(f->overlay)) {
            PyErr_SetString(PyExc_TypeError, "EntryKeyedState.overlay must be a dict");
            goto fail;
        }
        if (reads && (f->reader = (BackendReader *)reader_new(f->backend, path->deleted)) == NULL)
            goto fail;
    }
    return 0;
fail:
    form_release(f);
    return -1;
}

/* EntryKeyedState._replay. One handle serves the key's elements while the function keeps no
 * reference to it (its journal swapped per element): an allocation and a collector's
 * track and untrack less per element. */
static int replay_entries(PyObject *state, Form *f, PyObject *key, PyObject *logobj, Py_ssize_t i, Emit *e) {
    LogFields *log = (LogFields *)logobj;
    Py_ssize_t n = PyList_GET_SIZE(log->metas);
    EntryHandle *handle = NULL;
    int rc = -1;
    for (Py_ssize_t j = i; j < n && j < PyList_GET_SIZE(log->after); j++) {
        PyObject *journal = PyList_New(0);
        if (journal == NULL)
            goto done;
        Py_INCREF(journal);
        PyList_SetItem(log->after, j, journal);
        if (handle != NULL && Py_REFCNT(handle) == 1) {
            Py_SETREF(handle->journal, journal);
        } else {
            Py_XDECREF(handle);
            handle = (EntryHandle *)handle_new(f->path, f->overlay, f->reader, key, journal);
            Py_DECREF(journal);
            if (handle == NULL)
                goto done;
        }
        PyObject *args[2] = {(PyObject *)handle, PyList_GET_ITEM(log->payloads, j)};
        Py_INCREF(args[1]);
        PyObject *result = PyObject_Vectorcall(f->fn, args, 2, NULL);
        Py_DECREF(args[1]);
        int ok = result != NULL && record(f->path, log, j, result, f->flat, e) == 0;
        Py_XDECREF(result);
        if (!ok && replay_failed(state, key, logobj, j, e->out) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(handle);
    return rc;
}

/* DriftingKeyedState._replay */
static int replay_values(PyObject *state, Form *f, PyObject *key, PyObject *logobj, Py_ssize_t i, Emit *e) {
    LogFields *log = (LogFields *)logobj;
    PyObject *current;
    if (i > 0) {
        current = PyList_GET_ITEM(log->after, i - 1);
        Py_INCREF(current);
    } else if ((current = PyObject_CallMethodOneArg(f->backend, s_get, key)) == NULL) {
        return -1;
    }
    PyObject *diverted = f->diverted;
    int rc = -1;
    Py_ssize_t n = PyList_GET_SIZE(log->metas);
    for (Py_ssize_t j = i; j < n && j < PyList_GET_SIZE(log->after); j++) {
        PyObject *args[2] = {current, PyList_GET_ITEM(log->payloads, j)};
        Py_INCREF(args[1]);
        PyObject *pair = PyObject_Vectorcall(f->fn, args, 2, NULL);
        Py_DECREF(args[1]);
        PyObject *new = NULL;
        int ok = 0;
        if (pair != NULL) {
            if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
                new = PyTuple_GET_ITEM(pair, 0);
                Py_INCREF(new);
                ok = record(f->path, log, j, PyTuple_GET_ITEM(pair, 1), f->flat, e) == 0;
            } else {  /* the error the Python path raises: DriftingKeyedState.not_a_state_pair */
                PyObject *err = PyObject_CallMethodOneArg(state, s_not_a_pair, pair);
                if (err != NULL) {
                    PyErr_SetObject((PyObject *)Py_TYPE(err), err);
                    Py_DECREF(err);
                }
            }
            Py_DECREF(pair);
        }
        if (ok) {
            Py_SETREF(current, new);
            new = NULL;
            if (PySet_GET_SIZE(diverted) > 0) {  /* a late arrival before it changed its state */
                PyObject *meta = PyList_GET_ITEM(log->metas, j);
                if (PySet_Discard(diverted, meta) < 0)
                    goto done;
            }
        } else {
            Py_XDECREF(new);
            if (replay_failed(state, key, logobj, j, e->out) < 0)
                goto done;
        }
        Py_INCREF(current);
        PyList_SetItem(log->after, j, current);
    }
    rc = 0;
done:
    Py_DECREF(current);
    return rc;
}

/* EntryKeyedState._fold: the writes of the first n entries join ``writes``, in log order (the
 * backend takes those of every key an advance folds in one call). ``whole``: the n are the key's
 * whole log, so every overlay stack of the key holds their values only: each record leaves with
 * its last value, one write (a word's size entry, written by each of its n elements, goes once). */
static int fold_entries(Form *f, PyObject *key, LogFields *log, Py_ssize_t n, PyObject *writes, int whole) {
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *journal = PyList_GET_ITEM(log->after, j);
        if (!PyList_Check(journal)) {
            PyErr_SetString(PyExc_TypeError, "folding an entry that was not applied");
            return -1;
        }
        for (Py_ssize_t w = 0; w < PyList_GET_SIZE(journal); w++) {
            PyObject *record = PyTuple_Pack(2, key, PyList_GET_ITEM(journal, w));
            if (record == NULL)
                return -1;
            Py_hash_t h = PyObject_Hash(record);
            PyObject *stack = h == -1 ? NULL : GET_H(f->overlay, record, h);
            if (stack == NULL) {
                if (whole && !PyErr_Occurred()) {  /* left with its last value already */
                    Py_DECREF(record);
                    continue;
                }
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, record);
                Py_DECREF(record);
                return -1;
            }
            Py_INCREF(stack);
            int bad = !PyList_Check(stack) || PyList_GET_SIZE(stack) == 0;
            if (bad)
                PyErr_SetString(PyExc_TypeError, "an overlay stack is a non-empty list");
            int r = bad ? -1 : append_pair(writes, record, PyList_GET_ITEM(stack, whole ? PyList_GET_SIZE(stack) - 1 : 0));
            if (r == 0) {
                if (!whole && PyList_GET_SIZE(stack) > 1)  /* the older value leaves; the rest stay */
                    r = PyList_SetSlice(stack, 0, 1, NULL);
                else  /* written once in the log (the common case): the entry leaves */
                    r = _PyDict_DelItem_KnownHash(f->overlay, record, h);
            }
            Py_DECREF(stack);
            Py_DECREF(record);
            if (r < 0)
                return -1;
        }
    }
    return 0;
}

/* DriftingKeyedState._fold, without dead letters among the n (those go to the class's). */
static int fold_values(PyObject *state, Form *f, PyObject *key, LogFields *log, Py_ssize_t n) {
    PyObject *res;
    if (PySet_GET_SIZE(f->diverted) > 0) {
        PyObject *nn = PyLong_FromSsize_t(n);
        res = nn ? PyObject_CallMethodObjArgs(state, s__fold, key, (PyObject *)log, nn, NULL) : NULL;
        Py_XDECREF(nn);
    } else {
        PyObject *inputs = PyList_GetSlice(log->payloads, 0, n);
        res = inputs ? PyObject_CallMethodObjArgs(f->backend, s_fold, key, PyList_GET_ITEM(log->after, n - 1), inputs, NULL)
                     : NULL;
        Py_XDECREF(inputs);
    }
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* ---- InOrderPath: apply_batch and advance for one form ---- */

static int unpack_item(PyObject *item, PyObject **meta, PyObject **payload, PyObject **key) {
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
        *meta = PyTuple_GET_ITEM(item, 0);
        *payload = PyTuple_GET_ITEM(item, 1);
        *key = PyTuple_GET_ITEM(item, 2);
        return 0;
    }
    if (PyList_Check(item) && PyList_GET_SIZE(item) == 3) {
        *meta = PyList_GET_ITEM(item, 0);
        *payload = PyList_GET_ITEM(item, 1);
        *key = PyList_GET_ITEM(item, 2);
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, "apply_batch takes (meta, payload, key) items");
    return -1;
}

/* The first i of a sorted list whose item is above x (bisect_right, as the reference's
 * KeyLog.insert: after any equal item); -1 on error. */
static Py_ssize_t bisect_right(PyObject *list, PyObject *x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(list);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (mid >= PyList_GET_SIZE(list))
            break;  /* a comparison shrank the list: stop where we are */
        PyObject *item = PyList_GET_ITEM(list, mid);
        Py_INCREF(item);
        int lt = PyObject_RichCompareBool(x, item, Py_LT);
        Py_DECREF(item);
        if (lt < 0)
            return -1;
        if (lt)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* EntryKeyedState._undo: pop what one element wrote (the newest applied element of its key). */
static int undo_journal(PyObject *overlay, PyObject *key, PyObject *journal) {
    if (journal == Py_None)
        return 0;
    if (!PyList_Check(journal)) {
        PyErr_SetString(PyExc_TypeError, "a journal is a list");
        return -1;
    }
    for (Py_ssize_t w = PyList_GET_SIZE(journal) - 1; w >= 0; w--) {
        if (w >= PyList_GET_SIZE(journal))
            continue;
        PyObject *record = PyTuple_Pack(2, key, PyList_GET_ITEM(journal, w));
        if (record == NULL)
            return -1;
        Py_hash_t h = PyObject_Hash(record);
        PyObject *stack = h == -1 ? NULL : GET_H(overlay, record, h);
        int r = -1;
        if (stack == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, record);
        } else if (!PyList_Check(stack) || PyList_GET_SIZE(stack) == 0) {
            PyErr_SetString(PyExc_TypeError, "an overlay stack is a non-empty list");
        } else {
            Py_INCREF(stack);
            Py_ssize_t n = PyList_GET_SIZE(stack);
            r = PyList_SetSlice(stack, n - 1, n, NULL);
            if (r == 0 && PyList_GET_SIZE(stack) == 0)
                r = _PyDict_DelItem_KnownHash(overlay, record, h);
            Py_DECREF(stack);
        }
        Py_DECREF(record);
        if (r < 0)
            return -1;
    }
    return 0;
}

/* EntryKeyedState._roll_back: undo the writes of entries i.. of the log, newest first. The
 * applied entries of a log are a prefix of it (an element lands unapplied, and what lies after
 * it is rolled back), so the first entry not applied ends the scan: an element landing among
 * many not yet re-applied costs its own writes, not a pass over them all. */
static int roll_back_entries(PyObject *overlay, PyObject *key, LogFields *log, Py_ssize_t i) {
    PyObject *journals = log->after;
    Py_ssize_t end = i;
    while (end < PyList_GET_SIZE(journals) && PyList_GET_ITEM(journals, end) != Py_None)
        end++;
    for (Py_ssize_t j = end - 1; j >= i; j--) {
        if (j >= PyList_GET_SIZE(journals))
            continue;
        PyObject *journal = PyList_GET_ITEM(journals, j);
        Py_INCREF(journal);
        int r = undo_journal(overlay, key, journal);
        Py_DECREF(journal);
        if (r < 0)
            return -1;
        if (j < PyList_GET_SIZE(journals)) {
            Py_INCREF(Py_None);
            PyList_SetItem(journals, j, Py_None);  /* steals; releases the journal */
        }
    }
    return 0;
}

/* What one apply_batch call lands with: the state's logs and heads, and its counts, which go
 * to the state's attributes once at the end. */
typedef struct {
    PyObject *logs, *heads;
    Py_ssize_t delta;  /* entries added to the logs (``_size``) */
    Py_ssize_t late;   /* elements that landed before the tail (``out_of_order``) */
} Landing;

static int push_head(PyObject *heads, PyObject *meta, PyObject *key) {
    PyObject *res = PyObject_CallMethodObjArgs(heads, s_push, meta, key, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* DriftingLogs._land for an element (not a tombstone, none pending) of a key with a log: after
 * any equal meta; when that is before the tail, the entries after it are rolled back (values:
 * nothing to undo) to be re-applied. The index it landed at, or -1 on error. */
static Py_ssize_t land_before_tail(const InOrderPath *p, Form *f, Landing *l, PyObject *found, PyObject *meta,
                                   PyObject *payload, PyObject *key) {
    LogFields *log = (LogFields *)found;
    Py_INCREF(found);  /* the lists below must outlive any comparison's Python */
    Py_ssize_t i = bisect_right(log->metas, meta);
    int r = i < 0 || PyList_Insert(log->metas, i, meta) < 0 || PyList_Insert(log->payloads, i, payload) < 0 ||
            PyList_Insert(log->after, i, Py_None) < 0 || PyList_Insert(log->outputs, i, p->no_output) < 0;
    if (!r && i < PyList_GET_SIZE(log->metas) - 1) {
        l->late++;
        if (p->entries)
            r = roll_back_entries(f->overlay, key, log, i + 1) < 0;
    }
    Py_DECREF(found);
    if (r)
        return -1;
    l->delta++;
    if (i == 0 && push_head(l->heads, meta, key) < 0)
        return -1;
    return i;
}

/* DriftingLogs._land for an element (not a tombstone, none pending): the index it landed at in
 * its key's log (0: a new log), or -1 on error; ``*landed``: the log (borrowed from ``logs``). */
static Py_ssize_t land(const InOrderPath *p, Form *f, Landing *l, PyObject *meta, PyObject *payload, PyObject *key,
                       PyObject **landed) {
    PyObject *found = PyDict_GetItemWithError(l->logs, key);
    if (found == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *log = log_of(p, meta, payload);
        if (log == NULL)
            return -1;
        int r = PyDict_SetItem(l->logs, key, log);
        Py_DECREF(log);
        if (r < 0)
            return -1;
        *landed = log;  /* the dict holds it */
        l->delta++;
        return push_head(l->heads, meta, key) < 0 ? -1 : 0;
    }
    *landed = found;
    LogFields *log = as_log(found);
    if (log == NULL)
        return -1;
    Py_ssize_t n = PyList_GET_SIZE(log->metas);
    if (n > 0) {
        PyObject *last = PyList_GET_ITEM(log->metas, n - 1);
        Py_INCREF(last);
        int in_order = PyObject_RichCompareBool(last, meta, Py_LE);
        Py_DECREF(last);
        if (in_order < 0)
            return -1;
        if (!in_order)
            return land_before_tail(p, f, l, found, meta, payload, key);
    }
    Py_INCREF(found);  /* the lists below must outlive any callback */
    int r = PyList_Append(log->metas, meta) < 0 || PyList_Append(log->payloads, payload) < 0 ||
            PyList_Append(log->after, Py_None) < 0 || PyList_Append(log->outputs, p->no_output) < 0;
    Py_DECREF(found);
    if (r)
        return -1;
    l->delta++;
    if (n == 0 && push_head(l->heads, meta, key) < 0)  /* a new head */
        return -1;
    return n;
}

static int is_tombstone(PyObject *meta) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6)
        return 1;  /* not a plain meta: the class's _land says what is wrong */
    return PyObject_IsTrue(PyTuple_GET_ITEM(meta, 5));
}

/* The counts a call kept in locals go to the state (also when it fails: what landed is there). */
static int landing_done(PyObject *state, Landing *l, Emit *e) {
    int rc = add_size(state, l->delta) | add_to(state, s_out_of_order, l->late) | add_to(state, s_tombstones, e->tombstones);
    l->delta = l->late = e->tombstones = 0;
    return rc < 0 ? -1 : 0;
}

/* Lands each item: at the tail of a key not touched yet it is applied now (DriftingLogs.apply_batch);
 * else the earliest index changed per key goes to ``touched`` (in first-touch order). */
static int land_items(InOrderPath *self, PyObject *state, Form *form, Landing *l, PyObject *pending, PyObject *items,
                      PyObject *touched, Emit *e) {
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *meta, *payload, *key;
        if (unpack_item(PySequence_Fast_GET_ITEM(items, k), &meta, &payload, &key) < 0)
            return -1;
        Py_ssize_t i = -2;
        PyObject *landed = NULL;
        if (PyDict_GET_SIZE(pending) == 0) {
            int tomb = is_tombstone(meta);
            if (tomb < 0)
                return -1;
            if (!tomb && (i = land(self, form, l, meta, payload, key, &landed)) == -1)
                return -1;
        }
        if (i == -2) {  /* a tombstone, or tombstones wait: the class's _land decides */
            if (landing_done(state, l, e) < 0)
                return -1;
            PyObject *res = PyObject_CallMethodObjArgs(state, s_land, meta, payload, key, e->out, NULL);
            if (res == NULL)
                return -1;
            i = PyLong_AsSsize_t(res);
            Py_DECREF(res);
            if (i == -1 && PyErr_Occurred())
                return -1;
        }
        if (i < 0)
            continue;
        PyObject *seen = PyDict_GetItemWithError(touched, key);
        if (seen == NULL && PyErr_Occurred())
            return -1;
        if (seen == NULL) {  /* the key's log was all applied: at its tail, the element is applied now */
            int tomb = is_tombstone(meta);
            if (tomb < 0)
                return -1;
            if (!tomb && landed == NULL && (landed = PyDict_GetItemWithError(l->logs, key)) == NULL && PyErr_Occurred())
                return -1;
            LogFields *log = tomb || landed == NULL ? NULL : as_log(landed);
            if (log == NULL && PyErr_Occurred())
                return -1;
            if (log != NULL && i == PyList_GET_SIZE(log->metas) - 1) {
                Py_INCREF(landed);
                Py_INCREF(key);
                int r = self->entries ? replay_entries(state, form, key, landed, i, e) : replay_values(state, form, key, landed, i, e);
                Py_DECREF(key);
                Py_DECREF(landed);
                if (r < 0)
                    return -1;
                continue;
            }
        }
        if (seen == NULL || PyLong_AsSsize_t(seen) > i) {
            PyObject *at = PyLong_FromSsize_t(i);
            int r = at == NULL ? -1 : PyDict_SetItem(touched, key, at);
            Py_XDECREF(at);
            if (r < 0)
                return -1;
        }
    }
    return 0;
}

/* Re-applies each touched key's log from its earliest change. */
static int replay_touched(InOrderPath *self, PyObject *state, Form *form, PyObject *logs, PyObject *touched, Emit *e) {
    Py_ssize_t pos = 0;
    PyObject *key, *at;
    while (PyDict_Next(touched, &pos, &key, &at)) {
        PyObject *found = PyDict_GetItemWithError(logs, key);
        if (found == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        LogFields *log = as_log(found);
        if (log == NULL)
            return -1;
        if (PyList_GET_SIZE(log->metas) == 0) {
            if (PyDict_DelItem(logs, key) < 0)
                return -1;
            continue;
        }
        Py_INCREF(found);
        Py_INCREF(key);
        Py_ssize_t i = PyLong_AsSsize_t(at);
        int r = self->entries ? replay_entries(state, form, key, found, i, e) : replay_values(state, form, key, found, i, e);
        Py_DECREF(key);
        Py_DECREF(found);
        if (r < 0)
            return -1;
    }
    return 0;
}

static PyObject *path_apply_batch(InOrderPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "apply_batch(state, items, triples=False)");
        return NULL;
    }
    if (!path_ready(self))
        return NULL;
    PyObject *state = args[0];
    int triples = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (triples < 0)
        return NULL;
    PyObject *items = PySequence_Fast(args[1], "apply_batch takes a list of items");
    if (items == NULL)
        return NULL;
    Emit e = {PyList_New(0), triples, 0};
    PyObject *touched = PyDict_New();
    Landing l = {NULL, NULL, 0, 0};
    l.logs = PyObject_GetAttr(state, s_logs);
    l.heads = l.logs ? PyObject_GetAttr(state, s_heads) : NULL;
    PyObject *pending = l.heads ? PyObject_GetAttr(state, s_pending) : NULL;
    Form form = {0};
    int loaded = 0;
    if (e.out == NULL || touched == NULL || pending == NULL)
        goto fail;
    if (!PyDict_Check(l.logs) || !PyDict_Check(pending)) {
        PyErr_SetString(PyExc_TypeError, "logs and pending_tombstones must be dicts");
        goto fail;
    }
    if (form_load(state, self, &form, 1) < 0)
        goto fail;
    loaded = 1;
    if (land_items(self, state, &form, &l, pending, items, touched, &e) < 0 || landing_done(state, &l, &e) < 0)
        goto fail;
    if (replay_touched(self, state, &form, l.logs, touched, &e) < 0 || landing_done(state, &l, &e) < 0)
        goto fail;
    if (triples && pairs_to_triples(e.out) < 0)
        goto fail;
    form_release(&form);
    Py_DECREF(items);
    Py_DECREF(touched);
    Py_DECREF(l.logs);
    Py_DECREF(l.heads);
    Py_DECREF(pending);
    return e.out;
fail:
    landing_done(state, &l, &e);
    if (loaded)
        form_release(&form);
    Py_DECREF(items);
    Py_XDECREF(e.out);
    Py_XDECREF(touched);
    Py_XDECREF(l.logs);
    Py_XDECREF(l.heads);
    Py_XDECREF(pending);
    return NULL;
}

static PyObject *path_advance(InOrderPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "advance(state, watermark)");
        return NULL;
    }
    if (!path_ready(self))
        return NULL;
    PyObject *state = args[0], *watermark = args[1];
    PyObject *logs = PyObject_GetAttr(state, s_logs);
    PyObject *heads = logs ? PyObject_GetAttr(state, s_heads) : NULL;
    PyObject *due = heads ? PyObject_CallMethodOneArg(heads, s_pop_below, watermark) : NULL;
    PyObject *it = due ? PyObject_GetIter(due) : NULL;
    PyObject *writes = it ? PyList_New(0) : NULL;  /* entries: what every key folded wrote */
    Py_ssize_t delta = 0;
    Form form = {0};
    int loaded = 0;
    if (writes == NULL)
        goto fail;
    if (!PyDict_Check(logs)) {
        PyErr_SetString(PyExc_TypeError, "logs must be a dict");
        goto fail;
    }
    if (form_load(state, self, &form, 0) < 0)
        goto fail;
    loaded = 1;
    PyObject *key;
    while ((key = PyIter_Next(it)) != NULL) {
        PyObject *found = PyDict_GetItemWithError(logs, key);
        if (found == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred())
                goto fail;
            continue;  /* stale row: the log was folded since */
        }
        LogFields *log = as_log(found);
        if (log == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        Py_INCREF(found);
        int r = -1;
        Py_ssize_t len = PyList_GET_SIZE(log->metas);
        if (len == 0) {
            PyErr_SetString(PyExc_RuntimeError, "an empty log among the heads");
            goto next;
        }
        PyObject *head = PyList_GET_ITEM(log->metas, 0);
        Py_INCREF(head);
        int passed = PyObject_RichCompareBool(head, watermark, Py_LT);
        if (passed == 0) {
            /* Stale row: its head was retracted by a tombstone. Track the new head. */
            PyObject *res = PyObject_CallMethodObjArgs(heads, s_push, head, key, NULL);
            r = res == NULL ? -1 : 0;
            Py_XDECREF(res);
        }
        Py_DECREF(head);
        if (passed <= 0)
            goto next;
        PyObject *last = PyList_GET_ITEM(log->metas, len - 1);
        Py_INCREF(last);
        int all = PyObject_RichCompareBool(last, watermark, Py_LT);
        Py_DECREF(last);
        if (all < 0)
            goto next;
        Py_ssize_t n = all ? len : bisect_left(log->metas, watermark);
        if (n < 0)
            goto next;
        if ((self->entries ? fold_entries(&form, key, log, n, writes, n == len) : fold_values(state, &form, key, log, n)) < 0)
            goto next;
        delta -= n;
        if (n == PyList_GET_SIZE(log->metas)) {  /* all of it (the common case): the log goes whole */
            r = PyDict_DelItem(logs, key);
            goto next;
        }
        if (PyList_SetSlice(log->metas, 0, n, NULL) < 0 || PyList_SetSlice(log->payloads, 0, n, NULL) < 0 ||
            PyList_SetSlice(log->after, 0, n, NULL) < 0 || PyList_SetSlice(log->outputs, 0, n, NULL) < 0)
            goto next;
        PyObject *res = PyObject_CallMethodObjArgs(heads, s_push, PyList_GET_ITEM(log->metas, 0), key, NULL);
        r = res == NULL ? -1 : 0;
        Py_XDECREF(res);
    next:
        Py_DECREF(found);
        Py_DECREF(key);
        if (r < 0)
            goto fail;
    }
    if (PyErr_Occurred())
        goto fail;
    if (add_size(state, delta) < 0) {
        delta = 0;
        goto fail;
    }
    delta = 0;
    if (PyList_GET_SIZE(writes) > 0) {
        PyObject *res = PyObject_CallMethodOneArg(form.backend, s_fold, writes);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
    }
    form_release(&form);
    Py_DECREF(writes);
    Py_DECREF(it);
    Py_DECREF(due);
    Py_DECREF(heads);
    Py_DECREF(logs);
    PyObject *pending = PyObject_GetAttr(state, s_pending);
    if (pending == NULL)
        return NULL;
    int any = PyObject_IsTrue(pending);
    Py_DECREF(pending);
    if (any < 0)
        return NULL;
    if (any)
        return PyObject_CallMethodOneArg(state, s_check_pending, watermark);
    Py_RETURN_NONE;
fail:
    add_size(state, delta);
    if (loaded)
        form_release(&form);
    Py_XDECREF(writes);
    Py_XDECREF(it);
    Py_XDECREF(due);
    Py_XDECREF(heads);
    Py_XDECREF(logs);
    return NULL;
}

static int path_init(InOrderPath *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"keylog", "no_output", "deleted", "size", NULL};
    PyObject *kl, *no, *del = NULL, *size = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|OO", kwlist, &PyType_Type, &kl, &no, &del, &size))
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)kl, &LogFieldsType)) {
        PyErr_SetString(PyExc_TypeError, "keylog must derive from LogFields");
        return -1;
    }
    if (!PyList_CheckExact(no) || PyList_GET_SIZE(no) != 0) {
        PyErr_SetString(PyExc_TypeError, "no_output must be an empty list");
        return -1;
    }
    if ((del == NULL) != (size == NULL)) {
        PyErr_SetString(PyExc_TypeError, "entry state's path takes deleted and size, a value state's neither");
        return -1;
    }
    self->entries = del != NULL;
    Py_INCREF(kl); Py_XSETREF(self->keylog, (PyTypeObject *)kl);
    Py_INCREF(no); Py_XSETREF(self->no_output, no);
    Py_XINCREF(del); Py_XSETREF(self->deleted, del);
    Py_XINCREF(size); Py_XSETREF(self->size_entry, size);
    return 0;
}

static int path_traverse(InOrderPath *self, visitproc visit, void *arg) {
    Py_VISIT(self->keylog);
    Py_VISIT(self->no_output);
    Py_VISIT(self->deleted);
    Py_VISIT(self->size_entry);
    return 0;
}

static int path_clear(InOrderPath *self) {
    Py_CLEAR(self->keylog);
    Py_CLEAR(self->no_output);
    Py_CLEAR(self->deleted);
    Py_CLEAR(self->size_entry);
    return 0;
}

static void path_dealloc(InOrderPath *self) {
    PyObject_GC_UnTrack(self);
    path_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *path_repr(InOrderPath *self) {
    return PyUnicode_FromFormat("InOrderPath(%s)", self->entries ? "entries" : "values");
}

static PyMethodDef path_methods[] = {
    {"apply_batch", (PyCFunction)(void (*)(void))path_apply_batch, METH_FASTCALL,
     "apply_batch(state, items): DriftingLogs.apply_batch of ``state``"},
    {"advance", (PyCFunction)(void (*)(void))path_advance, METH_FASTCALL,
     "advance(state, watermark): DriftingLogs.advance of ``state``"},
    {NULL}
};

static PyTypeObject InOrderPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._drifting.InOrderPath",
    .tp_doc = "apply_batch and advance of one form of drifting keyed state: InOrderPath(KeyLog, NO_OUTPUT) for "
              "DriftingKeyedState, InOrderPath(KeyLog, NO_OUTPUT, DELETED, SIZE) for EntryKeyedState.",
    .tp_basicsize = sizeof(InOrderPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)path_traverse,
    .tp_clear = (inquiry)path_clear,
    .tp_dealloc = (destructor)path_dealloc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)path_init,
    .tp_repr = (reprfunc)path_repr,
    .tp_methods = path_methods,
};

/* ---- the module ---- */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_drifting",
    "Drifting keyed state's in-order path in C (see the source's head comment).", -1, NULL,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__drifting(void) {
    INTERN(s_logs, "logs"); INTERN(s_heads, "_heads"); INTERN(s_pending, "pending_tombstones");
    INTERN(s_size, "_size"); INTERN(s_land, "_land"); INTERN(s_push, "push"); INTERN(s_pop_below, "pop_below");
    INTERN(s_fn, "fn"); INTERN(s_flat, "flat"); INTERN(s_backend, "backend"); INTERN(s_overlay, "overlay");
    INTERN(s_get, "get"); INTERN(s_fold, "fold"); INTERN(s_replay_failed, "_replay_failed"); INTERN(s_not_a_pair, "not_a_state_pair");
    INTERN(s_emit_diff, "_emit_diff"); INTERN(s_diverted, "diverted"); INTERN(s_check_pending, "_check_pending");
    INTERN(s__fold, "_fold"); INTERN(s_read_view, "read_view"); INTERN(s_complete, "complete");
    INTERN(s_out_of_order, "out_of_order"); INTERN(s_tombstones, "tombstones_emitted");
    for (int k = 0; k < 8; k++) {
        PyObject *n = PyLong_FromLong(k);
        if (n == NULL || (small_ints[k] = PyTuple_Pack(1, n)) == NULL)
            return NULL;
        Py_DECREF(n);
    }
    if (PyType_Ready(&LogFieldsType) < 0 || PyType_Ready(&EntryHandleType) < 0 || PyType_Ready(&BackendReaderType) < 0 || PyType_Ready(&InOrderPathType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "LogFields", (PyObject *)&LogFieldsType) < 0 ||
        PyModule_AddObjectRef(m, "EntryHandle", (PyObject *)&EntryHandleType) < 0 ||
        PyModule_AddObjectRef(m, "InOrderPath", (PyObject *)&InOrderPathType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
