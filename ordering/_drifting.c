/* Drifting keyed state's in-order path in C: what every element of a backlog pays.
 *
 * ``keyed_state.DriftingLogs`` and its two forms (``DriftingKeyedState``: a value per key;
 * ``entry_state.EntryKeyedState``: a map of entries per key) are the reference, in Python.
 * This module runs the same steps for the common case and calls back into those classes
 * for everything else, so there is one definition of each rare case:
 *
 *   - apply_batch: an element that lands at the tail of its key's log (or starts one) is
 *     appended here; a tombstone, an element while tombstones wait for their invalidee, and
 *     an element that lands before the tail go to the class's ``_land``.
 *   - replay: the user's function is called here with the state (a value, or an
 *     ``EntryHandle``: MapState's protocol over the overlay), and its output recorded; an
 *     element whose function raises goes to the class's ``_replay_failed``; an output that
 *     replaces an earlier one (after a late arrival) to its ``_emit_diff``.
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
    *s__fold, *s_read_view, *s_complete;

/* ---- small helpers ---- */

/* A record (key, entry) is a tuple, whose hash CPython does not cache: the entry path hashes
 * each record once and meets the overlay and the cache's states with that hash. */
#define GET_H(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))

/* state._size += delta; keeps an exception that is being raised. */
static int add_size(PyObject *state, Py_ssize_t delta) {
    if (delta == 0)
        return 0;
    PyObject *etype, *evalue, *etb;
    PyErr_Fetch(&etype, &evalue, &etb);
    int rc = -1;
    PyObject *old = PyObject_GetAttr(state, s_size);
    if (old != NULL) {
        PyObject *d = PyLong_FromSsize_t(delta);
        PyObject *now = d ? PyNumber_Add(old, d) : NULL;
        if (now != NULL)
            rc = PyObject_SetAttr(state, s_size, now);
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
    PyObject *ids = PySequence_Concat(PyTuple_GET_ITEM(meta, 4), suffix);
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

/* DriftingLogs._record: entry j produced ``result``; emit what changed. 0 or -1. */
static int record(const InOrderPath *p, PyObject *state, LogFields *log, Py_ssize_t j, PyObject *result, int flat, PyObject *out) {
    PyObject *new;
    if (flat)
        new = result == Py_None ? (Py_INCREF(p->no_output), p->no_output) : PySequence_List(result);
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
            PyObject *res = PyObject_CallMethodObjArgs(state, s_emit_diff, meta, old, new, out, NULL);
            r = res == NULL ? -1 : 0;
            Py_XDECREF(res);
        } else if (flat) {
            r = 0;
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(new) && r == 0; k++) {
                PyObject *child = child_meta(meta, k);
                r = child == NULL ? -1 : append_pair(out, child, PyList_GET_ITEM(new, k));
                Py_XDECREF(child);
            }
        } else {
            r = append_pair(out, meta, result);
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
        PyObject *c = PyObject_GetAttr(r->cache, s_complete);
        int complete = c == NULL ? -1 : PyObject_IsTrue(c);
        Py_XDECREF(c);
        if (complete < 0)
            return NULL;
        if (complete) {
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
    PyObject *journal;  /* list: the entries this element wrote */
} EntryHandle;

static int handle_traverse(EntryHandle *self, visitproc visit, void *arg) {
    Py_VISIT(self->path);
    Py_VISIT(self->overlay);
    Py_VISIT(self->reader);
    Py_VISIT(self->key);
    Py_VISIT(self->journal);
    return 0;
}

static int handle_clear(EntryHandle *self) {
    Py_CLEAR(self->path);
    Py_CLEAR(self->overlay);
    Py_CLEAR(self->reader);
    Py_CLEAR(self->key);
    Py_CLEAR(self->journal);
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

static PyObject *handle_read(EntryHandle *self, PyObject *entry) {
    PyObject *record = PyTuple_Pack(2, self->key, entry);
    if (record == NULL)
        return NULL;
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
        size_record = PyTuple_Pack(2, self->key, self->path->size_entry);
        if (size_record == NULL)
            goto done;
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

/* EntryKeyedState._replay */
static int replay_entries(PyObject *state, Form *f, PyObject *key, PyObject *logobj, Py_ssize_t i, PyObject *out) {
    LogFields *log = (LogFields *)logobj;
    Py_ssize_t n = PyList_GET_SIZE(log->metas);
    for (Py_ssize_t j = i; j < n && j < PyList_GET_SIZE(log->after); j++) {
        PyObject *journal = PyList_New(0);
        if (journal == NULL)
            return -1;
        Py_INCREF(journal);
        PyList_SetItem(log->after, j, journal);
        PyObject *handle = handle_new(f->path, f->overlay, f->reader, key, journal);
        Py_DECREF(journal);
        if (handle == NULL)
            return -1;
        PyObject *payload = PyList_GET_ITEM(log->payloads, j);
        Py_INCREF(payload);
        PyObject *result = PyObject_CallFunctionObjArgs(f->fn, handle, payload, NULL);
        Py_DECREF(payload);
        Py_DECREF(handle);
        int ok = result != NULL && record(f->path, state, log, j, result, f->flat, out) == 0;
        Py_XDECREF(result);
        if (!ok && replay_failed(state, key, logobj, j, out) < 0)
            return -1;
    }
    return 0;
}

/* DriftingKeyedState._replay */
static int replay_values(PyObject *state, Form *f, PyObject *key, PyObject *logobj, Py_ssize_t i, PyObject *out) {
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
        PyObject *payload = PyList_GET_ITEM(log->payloads, j);
        Py_INCREF(payload);
        PyObject *pair = PyObject_CallFunctionObjArgs(f->fn, current, payload, NULL);
        Py_DECREF(payload);
        PyObject *new = NULL;
        int ok = 0;
        if (pair != NULL) {
            if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
                new = PyTuple_GET_ITEM(pair, 0);
                Py_INCREF(new);
                ok = record(f->path, state, log, j, PyTuple_GET_ITEM(pair, 1), f->flat, out) == 0;
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
            if (replay_failed(state, key, logobj, j, out) < 0)
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
 * backend takes those of every key an advance folds in one call). */
static int fold_entries(Form *f, PyObject *key, LogFields *log, Py_ssize_t n, PyObject *writes) {
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
                if (!PyErr_Occurred())
                    PyErr_SetObject(PyExc_KeyError, record);
                Py_DECREF(record);
                return -1;
            }
            Py_INCREF(stack);
            int bad = !PyList_Check(stack) || PyList_GET_SIZE(stack) == 0;
            if (bad)
                PyErr_SetString(PyExc_TypeError, "an overlay stack is a non-empty list");
            int r = bad ? -1 : append_pair(writes, record, PyList_GET_ITEM(stack, 0));
            if (r == 0) {
                if (PyList_GET_SIZE(stack) > 1)  /* the older value leaves; the rest stay */
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

/* The tail of key's log, or a new log: the index landed at, or -2 when the class's _land must decide. */
static Py_ssize_t land_in_order(const InOrderPath *p, PyObject *logs, PyObject *heads, PyObject *meta, PyObject *payload, PyObject *key,
                                Py_ssize_t *delta) {
    PyObject *found = PyDict_GetItemWithError(logs, key);
    if (found == NULL) {
        if (PyErr_Occurred())
            return -1;
        PyObject *log = log_of(p, meta, payload);
        if (log == NULL)
            return -1;
        int r = PyDict_SetItem(logs, key, log);
        Py_DECREF(log);
        if (r < 0)
            return -1;
        *delta += 1;
        PyObject *res = PyObject_CallMethodObjArgs(heads, s_push, meta, key, NULL);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
        return 0;
    }
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
            return -2;
    }
    Py_INCREF(found);  /* the lists below must outlive any callback */
    int r = PyList_Append(log->metas, meta) < 0 || PyList_Append(log->payloads, payload) < 0 ||
            PyList_Append(log->after, Py_None) < 0 || PyList_Append(log->outputs, p->no_output) < 0;
    Py_DECREF(found);
    if (r)
        return -1;
    *delta += 1;
    if (n == 0) {  /* a new head */
        PyObject *res = PyObject_CallMethodObjArgs(heads, s_push, meta, key, NULL);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return n;
}

static int is_tombstone(PyObject *meta) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6)
        return 1;  /* not a plain meta: the class's _land says what is wrong */
    return PyObject_IsTrue(PyTuple_GET_ITEM(meta, 5));
}

static PyObject *path_apply_batch(InOrderPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "apply_batch(state, items)");
        return NULL;
    }
    if (!path_ready(self))
        return NULL;
    PyObject *state = args[0];
    PyObject *items = PySequence_Fast(args[1], "apply_batch takes a list of items");
    if (items == NULL)
        return NULL;
    PyObject *out = PyList_New(0), *touched = PyDict_New();
    PyObject *logs = PyObject_GetAttr(state, s_logs);
    PyObject *heads = logs ? PyObject_GetAttr(state, s_heads) : NULL;
    PyObject *pending = heads ? PyObject_GetAttr(state, s_pending) : NULL;
    Py_ssize_t delta = 0;
    Form form = {0};
    int loaded = 0;
    if (out == NULL || touched == NULL || pending == NULL)
        goto fail;
    if (!PyDict_Check(logs) || !PyDict_Check(pending)) {
        PyErr_SetString(PyExc_TypeError, "logs and pending_tombstones must be dicts");
        goto fail;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *meta, *payload, *key;
        if (unpack_item(PySequence_Fast_GET_ITEM(items, k), &meta, &payload, &key) < 0)
            goto fail;
        Py_ssize_t i = -2;
        if (PyDict_GET_SIZE(pending) == 0) {
            int tomb = is_tombstone(meta);
            if (tomb < 0)
                goto fail;
            if (!tomb) {
                i = land_in_order(self, logs, heads, meta, payload, key, &delta);
                if (i == -1)
                    goto fail;
            }
        }
        if (i == -2) {
            if (add_size(state, delta) < 0)
                goto fail;
            delta = 0;
            PyObject *res = PyObject_CallMethodObjArgs(state, s_land, meta, payload, key, out, NULL);
            if (res == NULL)
                goto fail;
            i = PyLong_AsSsize_t(res);
            Py_DECREF(res);
            if (i == -1 && PyErr_Occurred())
                goto fail;
        }
        if (i >= 0) {
            PyObject *seen = PyDict_GetItemWithError(touched, key);
            if (seen == NULL && PyErr_Occurred())
                goto fail;
            if (seen == NULL || PyLong_AsSsize_t(seen) > i) {
                PyObject *at = PyLong_FromSsize_t(i);
                int r = at == NULL ? -1 : PyDict_SetItem(touched, key, at);
                Py_XDECREF(at);
                if (r < 0)
                    goto fail;
            }
        }
    }
    if (add_size(state, delta) < 0)
        goto fail;
    delta = 0;
    if (form_load(state, self, &form, 1) < 0)
        goto fail;
    loaded = 1;
    Py_ssize_t pos = 0;
    PyObject *key, *at;
    while (PyDict_Next(touched, &pos, &key, &at)) {
        PyObject *found = PyDict_GetItemWithError(logs, key);
        if (found == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        LogFields *log = as_log(found);
        if (log == NULL)
            goto fail;
        if (PyList_GET_SIZE(log->metas) == 0) {
            if (PyDict_DelItem(logs, key) < 0)
                goto fail;
            continue;
        }
        Py_INCREF(found);
        Py_INCREF(key);
        Py_ssize_t i = PyLong_AsSsize_t(at);
        int r = self->entries ? replay_entries(state, &form, key, found, i, out)
                              : replay_values(state, &form, key, found, i, out);
        Py_DECREF(key);
        Py_DECREF(found);
        if (r < 0)
            goto fail;
    }
    form_release(&form);
    Py_DECREF(items);
    Py_DECREF(touched);
    Py_DECREF(logs);
    Py_DECREF(heads);
    Py_DECREF(pending);
    return out;
fail:
    add_size(state, delta);
    if (loaded)
        form_release(&form);
    Py_DECREF(items);
    Py_XDECREF(out);
    Py_XDECREF(touched);
    Py_XDECREF(logs);
    Py_XDECREF(heads);
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
        if ((self->entries ? fold_entries(&form, key, log, n, writes) : fold_values(state, &form, key, log, n)) < 0)
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
