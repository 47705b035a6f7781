/* The state cache's two loops over rows, in C: a base's rows marked clean
 * (StateCache.mark_items_written) and a fold's states put (StateCache.put_many).
 *
 * After a base is written, each of its (key, state) becomes clean (droppable: RocksDB holds
 * it) unless it changed since it was taken. In Python that was five dict operations a row
 * and 5-10% of an inverted-index instance in a backlog, where a base holds every entry the
 * last second wrote. ``snapshots/state_cache.py`` keeps the same loop as the reference;
 * ``tests/snapshots/test_state_cache.py`` runs both on the same batches.
 *
 * put_all is put_many's loop: five dict operations a state, 8-9% of an index instance in a
 * backlog (py-spy --gil), where nearly every advance folds one element of a key.
 *
 * Cost: O(rows), no allocation beyond the dicts' growth, one hash of the key a row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Each key is hashed once a row, not once per dict it meets: a record of entry state is a
 * tuple, whose hash CPython does not cache (five dicts a row in put_all and mark_clean). */
#define GET(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))
#define SET(d, k, v, h) _PyDict_SetItem_KnownHash((d), (k), (v), (h))
#define DEL(d, k, h) _PyDict_DelItem_KnownHash((d), (k), (h))

/* 1 if d holds k, 0 if not, -1 on error. */
static int has(PyObject *d, PyObject *k, Py_hash_t h) {
    return GET(d, k, h) != NULL ? 1 : (PyErr_Occurred() ? -1 : 0);
}

/* mark_clean(items, sizes, unwritten, states, clean, mean, removed) -> bytes added to clean
 *
 * For each (key, state) of ``items``: its measured size (popped from ``sizes``, else
 * ``mean``); if the key is not in ``unwritten``, ``states[key] is state`` and it is not in
 * ``clean`` yet: a ``removed`` state leaves ``states``, any other goes into ``clean`` with
 * its size, which the result adds up. */
static PyObject *mark_clean(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mark_clean(items, sizes, unwritten, states, clean, mean, removed)");
        return NULL;
    }
    PyObject *sizes = args[1], *unwritten = args[2], *states = args[3], *clean = args[4], *mean = args[5],
             *removed = args[6];
    if (!PyDict_Check(sizes) || !PyDict_Check(unwritten) || !PyDict_Check(states) || !PyDict_Check(clean)) {
        PyErr_SetString(PyExc_TypeError, "mark_clean: sizes, unwritten, states and clean are dicts");
        return NULL;
    }
    PyObject *items = PySequence_Fast(args[0], "mark_clean takes (key, state) items");
    if (items == NULL)
        return NULL;
    PyObject *added = PyLong_FromLong(0);
    if (added == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "mark_clean takes (key, state) items");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *state = PyTuple_GET_ITEM(item, 1);
        Py_hash_t h = PyObject_Hash(key);
        if (h == -1)
            goto fail;
        PyObject *size = NULL;  /* new ref */
        if (PyDict_GET_SIZE(sizes) > 0) {
            size = GET(sizes, key, h);
            if (size != NULL) {
                Py_INCREF(size);
                if (DEL(sizes, key, h) < 0) {
                    Py_DECREF(size);
                    goto fail;
                }
            } else if (PyErr_Occurred()) {
                goto fail;
            }
        }
        if (size == NULL) {
            size = mean;
            Py_INCREF(size);
        }
        int keep = has(unwritten, key, h);
        if (keep == 0) {
            PyObject *cached = GET(states, key, h);
            if (cached == NULL && PyErr_Occurred())
                keep = -1;
            else if (cached != state)
                keep = 1;
            else
                keep = has(clean, key, h);
        }
        if (keep == 0) {
            if (state == removed) {
                /* RocksDB deleted it: a miss says the same */
                keep = DEL(states, key, h) < 0 ? -1 : 1;
            } else if (SET(clean, key, size, h) < 0) {
                keep = -1;
            } else {
                PyObject *sum = PyNumber_Add(added, size);
                if (sum == NULL)
                    keep = -1;
                else
                    Py_SETREF(added, sum);
            }
        }
        Py_DECREF(size);
        if (keep < 0)
            goto fail;
    }
    Py_DECREF(items);
    return added;
fail:
    Py_XDECREF(added);
    Py_DECREF(items);
    return NULL;
}

/* put_all(pairs, deleted, removed, changed, states, unwritten, clean) -> bytes freed from clean
 *
 * StateCache.put_many's loop once the cache has stopped measuring every state: for each
 * (key, state) of ``pairs`` (``deleted``, the caller's mark of a removed key, becomes
 * ``removed``), the key is recorded in ``changed`` (unless it is None), set in ``states`` and
 * ``unwritten``, and leaves ``clean``, whose sizes the result adds up. Entry state folds every
 * entry the watermark passes through it: two a word of the index. */
static PyObject *put_all(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "put_all(pairs, deleted, removed, changed, states, unwritten, clean)");
        return NULL;
    }
    PyObject *deleted = args[1], *removed = args[2], *changed = args[3], *states = args[4], *unwritten = args[5],
             *clean = args[6];
    if ((changed != Py_None && !PyDict_Check(changed)) || !PyDict_Check(states) || !PyDict_Check(unwritten) ||
        !PyDict_Check(clean)) {
        PyErr_SetString(PyExc_TypeError, "put_all: changed (or None), states, unwritten and clean are dicts");
        return NULL;
    }
    PyObject *pairs = PySequence_Fast(args[0], "put_all takes (key, state) pairs");
    if (pairs == NULL)
        return NULL;
    PyObject *freed = PyLong_FromLong(0);
    if (freed == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(pairs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "put_all takes (key, state) pairs");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(pair, 0), *state = PyTuple_GET_ITEM(pair, 1);
        if (state == deleted)
            state = removed;
        Py_hash_t h = PyObject_Hash(key);
        if (h == -1 || (changed != Py_None && SET(changed, key, Py_None, h) < 0) || SET(states, key, state, h) < 0 ||
            SET(unwritten, key, state, h) < 0)
            goto fail;
        if (PyDict_GET_SIZE(clean) > 0) {
            PyObject *size = GET(clean, key, h);
            if (size != NULL) {
                PyObject *sum = PyNumber_Add(freed, size);
                if (sum == NULL)
                    goto fail;
                Py_SETREF(freed, sum);
                if (DEL(clean, key, h) < 0)
                    goto fail;
            } else if (PyErr_Occurred()) {
                goto fail;
            }
        }
    }
    Py_DECREF(pairs);
    return freed;
fail:
    Py_XDECREF(freed);
    Py_DECREF(pairs);
    return NULL;
}

static PyMethodDef methods[] = {
    {"mark_clean", (PyCFunction)(void (*)(void))mark_clean, METH_FASTCALL,
     "mark_clean(items, sizes, unwritten, states, clean, mean, removed) -> bytes the clean rows add"},
    {"put_all", (PyCFunction)(void (*)(void))put_all, METH_FASTCALL,
     "put_all(pairs, deleted, removed, changed, states, unwritten, clean) -> bytes freed from clean"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_written", "A base's rows marked clean, in C (see the source's head comment).", -1, methods,
};

PyMODINIT_FUNC PyInit__written(void) { return PyModule_Create(&module); }
