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
 *
 * pair_keys is codec.encode_pairs's loop: the stored key of every row a base writes, a
 * ``(word, page)`` entry or a word's size entry, packed here byte for byte as MessagePack's
 * packer packs it (0.4-0.7 us a key in Python, a third of a base row's cost).
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

/* The MessagePack form of a signed 64-bit int, as msgpack's packer writes it (pack_template.h's
 * msgpack_pack_real_int64): the shortest of fixint, int 8/16/32/64 and uint 8/16/32/64. Writes
 * into buf (9 bytes), returns the length. */
static Py_ssize_t pack_int64(long long d, unsigned char *buf) {
    if (d < -(1LL << 5)) {
        if (d < -(1LL << 15)) {
            if (d < -(1LL << 31)) {
                buf[0] = 0xd3;
                for (int i = 0; i < 8; i++) buf[1 + i] = (unsigned char)((unsigned long long)d >> (56 - 8 * i));
                return 9;
            }
            buf[0] = 0xd2;
            for (int i = 0; i < 4; i++) buf[1 + i] = (unsigned char)((unsigned long long)d >> (24 - 8 * i));
            return 5;
        }
        if (d < -(1 << 7)) {
            buf[0] = 0xd1;
            buf[1] = (unsigned char)((unsigned long long)d >> 8);
            buf[2] = (unsigned char)d;
            return 3;
        }
        buf[0] = 0xd0;
        buf[1] = (unsigned char)d;
        return 2;
    }
    if (d < (1 << 7)) {
        buf[0] = (unsigned char)d; /* positive or negative fixint */
        return 1;
    }
    if (d < (1LL << 16)) {
        if (d < (1 << 8)) {
            buf[0] = 0xcc;
            buf[1] = (unsigned char)d;
            return 2;
        }
        buf[0] = 0xcd;
        buf[1] = (unsigned char)(d >> 8);
        buf[2] = (unsigned char)d;
        return 3;
    }
    if (d < (1LL << 32)) {
        buf[0] = 0xce;
        for (int i = 0; i < 4; i++) buf[1 + i] = (unsigned char)(d >> (24 - 8 * i));
        return 5;
    }
    buf[0] = 0xcf;
    for (int i = 0; i < 8; i++) buf[1 + i] = (unsigned char)((unsigned long long)d >> (56 - 8 * i));
    return 9;
}

/* pair_keys(keys, starts, start_of, other, tail_of, heads) -> list of bytes
 *
 * codec.encode_pairs (its docstring says what each argument is; ``tail_of(second)`` packs a
 * second item that is not an int, kept per call in a dict as there). For a key ``(str, int)``
 * whose int fits 64 bits the int is packed here; a longer one goes to ``tail_of`` as any
 * other second item (the same bytes: the big-int extension). */
static PyObject *pair_keys(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "pair_keys(keys, starts, start_of, other, tail_of, heads)");
        return NULL;
    }
    PyObject *starts = args[1], *start_of = args[2], *other = args[3], *tail_of = args[4], *heads = args[5];
    if (!PyDict_Check(starts) || !PyList_Check(heads) || PyList_GET_SIZE(heads) < 256) {
        PyErr_SetString(PyExc_TypeError, "pair_keys: starts is a dict, heads a list of 256 bytes");
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[0], "pair_keys takes a sequence of keys");
    if (keys == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    PyObject *out = PyList_New(n), *tails = PyDict_New();
    if (out == NULL || tails == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(keys, i), *raw = NULL;
        if (PyTuple_CheckExact(key) && PyTuple_GET_SIZE(key) == 2 && PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 0))) {
            PyObject *first = PyTuple_GET_ITEM(key, 0), *second = PyTuple_GET_ITEM(key, 1);
            unsigned char ibuf[9];
            const char *tail = NULL;
            Py_ssize_t tail_n = 0;
            PyObject *tail_obj = NULL; /* borrowed from tails */
            int fits = 0;
            if (PyLong_CheckExact(second)) {
                int overflow = 0;
                long long d = PyLong_AsLongLongAndOverflow(second, &overflow);
                if (d == -1 && PyErr_Occurred())
                    goto fail;
                if (!overflow) {
                    tail_n = pack_int64(d, ibuf);
                    fits = 1;
                } else if (overflow > 0) {
                    unsigned long long u = PyLong_AsUnsignedLongLong(second);
                    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                            goto fail;
                        PyErr_Clear(); /* past 64 bits: the big-int extension, from tail_of */
                    } else {
                        ibuf[0] = 0xcf;
                        for (int b = 0; b < 8; b++) ibuf[1 + b] = (unsigned char)(u >> (56 - 8 * b));
                        tail_n = 9;
                        fits = 1;
                    }
                }
                tail = (const char *)ibuf;
            }
            if (!fits) {
                tail_obj = PyDict_GetItemWithError(tails, second);
                if (tail_obj == NULL) {
                    if (PyErr_Occurred())
                        goto fail;
                    PyObject *made = PyObject_CallOneArg(tail_of, second);
                    if (made == NULL)
                        goto fail;
                    int err = PyDict_SetItem(tails, second, made);
                    Py_DECREF(made); /* tails holds it */
                    if (err < 0)
                        goto fail;
                    tail_obj = made;
                }
                if (!PyBytes_Check(tail_obj)) {
                    PyErr_SetString(PyExc_TypeError, "pair_keys: tail_of returns bytes");
                    goto fail;
                }
                tail = PyBytes_AS_STRING(tail_obj);
                tail_n = PyBytes_GET_SIZE(tail_obj);
            }
            PyObject *cached = PyDict_GetItemWithError(starts, first), *made_start = NULL;
            if (cached == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                cached = made_start = PyObject_CallOneArg(start_of, first);
                if (made_start == NULL)
                    goto fail;
            }
            if (!PyTuple_Check(cached) || PyTuple_GET_SIZE(cached) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(cached, 0)) ||
                !PyBytes_Check(PyTuple_GET_ITEM(cached, 1))) {
                Py_XDECREF(made_start);
                PyErr_SetString(PyExc_TypeError, "pair_keys: a start is a (prefix bytes, start bytes) tuple");
                goto fail;
            }
            PyObject *prefix = PyTuple_GET_ITEM(cached, 0), *start = PyTuple_GET_ITEM(cached, 1);
            Py_ssize_t payload = PyBytes_GET_SIZE(start) + tail_n;
            if (payload < 256) {
                PyObject *head = PyList_GET_ITEM(heads, payload);
                if (!PyBytes_Check(head)) {
                    Py_XDECREF(made_start);
                    PyErr_SetString(PyExc_TypeError, "pair_keys: heads holds bytes");
                    goto fail;
                }
                Py_ssize_t np = PyBytes_GET_SIZE(prefix), nh = PyBytes_GET_SIZE(head), ns = PyBytes_GET_SIZE(start);
                raw = PyBytes_FromStringAndSize(NULL, np + nh + ns + tail_n);
                if (raw != NULL) {
                    char *w = PyBytes_AS_STRING(raw);
                    memcpy(w, PyBytes_AS_STRING(prefix), np);
                    memcpy(w + np, PyBytes_AS_STRING(head), nh);
                    memcpy(w + np + nh, PyBytes_AS_STRING(start), ns);
                    memcpy(w + np + nh + ns, tail, tail_n);
                }
                Py_XDECREF(made_start);
                if (raw == NULL)
                    goto fail;
                PyList_SET_ITEM(out, i, raw);
                continue;
            }
            Py_XDECREF(made_start);
        }
        raw = PyObject_CallOneArg(other, key);
        if (raw == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, raw);
    }
    Py_DECREF(tails);
    Py_DECREF(keys);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(tails);
    Py_DECREF(keys);
    return NULL;
}

static PyMethodDef methods[] = {
    {"mark_clean", (PyCFunction)(void (*)(void))mark_clean, METH_FASTCALL,
     "mark_clean(items, sizes, unwritten, states, clean, mean, removed) -> bytes the clean rows add"},
    {"put_all", (PyCFunction)(void (*)(void))put_all, METH_FASTCALL,
     "put_all(pairs, deleted, removed, changed, states, unwritten, clean) -> bytes freed from clean"},
    {"pair_keys", (PyCFunction)(void (*)(void))pair_keys, METH_FASTCALL,
     "pair_keys(keys, starts, start_of, other, tail_of, heads) -> the stored keys (codec.encode_pairs)"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_written", "A base's rows marked clean, in C (see the source's head comment).", -1, methods,
};

PyMODINIT_FUNC PyInit__written(void) { return PyModule_Create(&module); }
