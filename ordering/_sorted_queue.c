/* SortedQueue in C: the queue of key heads drifting keyed state folds from.
 *
 * ``ordering/sorted_queue.py`` is the reference and says why the queue is a FIFO beside a
 * heap. In Python each item popped cost a generator step and a deque or heapq call, and
 * push a method frame: 5-7% of an inverted-index instance in a backlog (py-spy --gil),
 * where every element is pushed once and popped once. Same algorithm, same order of ties
 * (the FIFO's item first when its t equals the heap's; heap ties by push order), so the C
 * and the Python pop the same sequence; ``tests/ordering/test_sorted_queue.py`` runs both.
 *
 * Costs: push O(1) in order, O(log h) into the heap; each item popped O(1) from the FIFO,
 * O(log h) from the heap; t compared in C (``cmp3``: Python's order of a Meta's tuple).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    PyObject *t, *item;
    uint64_t seq;
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *fifo;          /* a ring: fifo_n items from fifo_at, t non-decreasing */
    Py_ssize_t fifo_at, fifo_n, fifo_cap;
    Entry *heap;          /* a binary heap by (t, seq) */
    Py_ssize_t heap_n, heap_cap;
    uint64_t seq;
} Queue;

static int grow(Entry **arr, Py_ssize_t *cap) {
    Py_ssize_t n = *cap ? *cap * 2 : 64;
    Entry *a = PyMem_Realloc(*arr, n * sizeof(Entry));
    if (a == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *arr = a;
    *cap = n;
    return 0;
}

#define FIFO(q, i) ((q)->fifo[((q)->fifo_at + (i)) % (q)->fifo_cap])

static int fifo_push(Queue *q, PyObject *t, PyObject *item) {
    if (q->fifo_n == q->fifo_cap) {
        Py_ssize_t old = q->fifo_cap;
        if (grow(&q->fifo, &q->fifo_cap) < 0)
            return -1;
        /* unwrap: the items before fifo_at move past the old end */
        for (Py_ssize_t i = 0; i < q->fifo_at; i++)
            q->fifo[old + i] = q->fifo[i];
    }
    Entry *e = &FIFO(q, q->fifo_n);
    Py_INCREF(t);
    Py_INCREF(item);
    e->t = t;
    e->item = item;
    q->fifo_n++;
    return 0;
}

#define CMP_ERROR 2

/* -1, 0 or 1 as x <, == or > y, CMP_ERROR on a comparison's error: Python's order of tuples
 * (the first item that differs decides), with exact ints, floats, bools and tuples compared
 * here. A Meta is (ts, source, partition, offset, child_ids, tombstone); through
 * PyObject_RichCompareBool each comparison of two was a tuple's walk with an object
 * comparison per item, and a heap step made two of them (a < b, then b < a). */
static int cmp3(PyObject *x, PyObject *y) {
    if (x == y)
        return 0;
    PyTypeObject *tx = Py_TYPE(x), *ty = Py_TYPE(y);
    if (tx == ty) {
        if (tx == &PyLong_Type) {
            int ox, oy;
            long long a = PyLong_AsLongLongAndOverflow(x, &ox), b = PyLong_AsLongLongAndOverflow(y, &oy);
            if (!ox && !oy)
                return a < b ? -1 : a > b;
            PyErr_Clear();
        } else if (tx == &PyFloat_Type) {
            double a = PyFloat_AS_DOUBLE(x), b = PyFloat_AS_DOUBLE(y);
            if (a < b)
                return -1;
            if (a > b)
                return 1;
            if (a == b)
                return 0;  /* else a NaN: Python's own comparison below */
        } else if (tx == &PyBool_Type) {
            return x == Py_False ? -1 : 1;  /* distinct bools */
        } else if (tx == &PyTuple_Type) {
            Py_ssize_t nx = PyTuple_GET_SIZE(x), ny = PyTuple_GET_SIZE(y), n = nx < ny ? nx : ny;
            for (Py_ssize_t i = 0; i < n; i++) {
                int c = cmp3(PyTuple_GET_ITEM(x, i), PyTuple_GET_ITEM(y, i));
                if (c != 0)
                    return c;
            }
            return nx < ny ? -1 : nx > ny;
        }
    }
    int eq = PyObject_RichCompareBool(x, y, Py_EQ);
    if (eq != 0)
        return eq < 0 ? CMP_ERROR : 0;
    int lt = PyObject_RichCompareBool(x, y, Py_LT);
    return lt < 0 ? CMP_ERROR : (lt ? -1 : 1);
}

/* x < y (op Py_LT) or x <= y (Py_LE) by cmp3; -1 on a comparison's error */
static int t_below(PyObject *x, PyObject *y, int op) {
    int c = cmp3(x, y);
    if (c == CMP_ERROR)
        return -1;
    return op == Py_LT ? c < 0 : c <= 0;
}

/* a < b by (t, seq); -1 on a comparison's error */
static int heap_less(const Entry *a, const Entry *b) {
    int c = cmp3(a->t, b->t);
    if (c == CMP_ERROR)
        return -1;
    return c ? c < 0 : a->seq < b->seq;
}

static int heap_push(Queue *q, PyObject *t, PyObject *item) {
    if (q->heap_n == q->heap_cap && grow(&q->heap, &q->heap_cap) < 0)
        return -1;
    Py_INCREF(t);
    Py_INCREF(item);
    Entry e = {t, item, q->seq++};
    Py_ssize_t i = q->heap_n++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        int lt = heap_less(&e, &q->heap[parent]);
        if (lt < 0) {
            q->heap[i] = e;  /* kept: the heap stays whole, only out of order here */
            return -1;
        }
        if (!lt)
            break;
        q->heap[i] = q->heap[parent];
        i = parent;
    }
    q->heap[i] = e;
    return 0;
}

/* Take the heap's least entry out (its references pass to *out). */
static int heap_pop(Queue *q, Entry *out) {
    *out = q->heap[0];
    Entry last = q->heap[--q->heap_n];
    Py_ssize_t i = 0, n = q->heap_n;
    if (n == 0)
        return 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n) {
            int lt = heap_less(&q->heap[child + 1], &q->heap[child]);
            if (lt < 0)
                goto fail;
            if (lt)
                child++;
        }
        int lt = heap_less(&q->heap[child], &last);
        if (lt < 0)
            goto fail;
        if (!lt)
            break;
        q->heap[i] = q->heap[child];
        i = child;
    }
    q->heap[i] = last;
    return 0;
fail:
    q->heap[i] = last;
    return -1;
}

static PyObject *queue_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "SortedQueue() takes no arguments");
        return NULL;
    }
    Queue *q = (Queue *)type->tp_alloc(type, 0);
    return (PyObject *)q;
}

static int queue_traverse(Queue *q, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < q->fifo_n; i++) {
        Py_VISIT(FIFO(q, i).t);
        Py_VISIT(FIFO(q, i).item);
    }
    for (Py_ssize_t i = 0; i < q->heap_n; i++) {
        Py_VISIT(q->heap[i].t);
        Py_VISIT(q->heap[i].item);
    }
    return 0;
}

static int queue_clear(Queue *q) {
    Py_ssize_t nf = q->fifo_n, nh = q->heap_n;
    q->fifo_n = q->heap_n = 0;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Py_DECREF(FIFO(q, i).t);
        Py_DECREF(FIFO(q, i).item);
    }
    for (Py_ssize_t i = 0; i < nh; i++) {
        Py_DECREF(q->heap[i].t);
        Py_DECREF(q->heap[i].item);
    }
    q->fifo_at = 0;
    return 0;
}

static void queue_dealloc(Queue *q) {
    PyObject_GC_UnTrack(q);
    queue_clear(q);
    PyMem_Free(q->fifo);
    PyMem_Free(q->heap);
    Py_TYPE(q)->tp_free((PyObject *)q);
}

static Py_ssize_t queue_len(Queue *q) { return q->fifo_n + q->heap_n; }

/* push(t, item): into the FIFO at or after its newest t, else into the heap */
static PyObject *queue_push(Queue *q, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "push(t, item)");
        return NULL;
    }
    int in_order = 1;
    if (q->fifo_n) {
        in_order = t_below(FIFO(q, q->fifo_n - 1).t, args[0], Py_LE);
        if (in_order < 0)
            return NULL;
    }
    if ((in_order ? fifo_push(q, args[0], args[1]) : heap_push(q, args[0], args[1])) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- pop_below's iterator: the items below its bound, each taken out as it is yielded ---- */

typedef struct {
    PyObject_HEAD
    Queue *queue;
    PyObject *bound;
} Popper;

static PyTypeObject PopperType;

static PyObject *queue_pop_below(Queue *q, PyObject *bound) {
    Popper *p = PyObject_GC_New(Popper, &PopperType);
    if (p == NULL)
        return NULL;
    Py_INCREF(q);
    Py_INCREF(bound);
    p->queue = q;
    p->bound = bound;
    PyObject_GC_Track(p);
    return (PyObject *)p;
}

static PyObject *popper_next(Popper *p) {
    Queue *q = p->queue;
    if (q->fifo_n) {
        Entry *front = &FIFO(q, 0);
        int below = t_below(front->t, p->bound, Py_LT);
        if (below < 0)
            return NULL;
        if (below && q->heap_n) {
            below = t_below(front->t, q->heap[0].t, Py_LE);
            if (below < 0)
                return NULL;
        }
        if (below) {
            PyObject *item = front->item;
            Py_DECREF(front->t);
            q->fifo_at = (q->fifo_at + 1) % q->fifo_cap;
            q->fifo_n--;
            return item;  /* the queue's reference passes to the caller */
        }
    }
    if (q->heap_n) {
        int below = t_below(q->heap[0].t, p->bound, Py_LT);
        if (below < 0)
            return NULL;
        if (below) {
            Entry e;
            if (heap_pop(q, &e) < 0) {
                Py_DECREF(e.t);
                Py_DECREF(e.item);
                return NULL;
            }
            Py_DECREF(e.t);
            return e.item;
        }
    }
    return NULL;  /* exhausted: StopIteration */
}

static int popper_traverse(Popper *p, visitproc visit, void *arg) {
    Py_VISIT(p->queue);
    Py_VISIT(p->bound);
    return 0;
}

static void popper_dealloc(Popper *p) {
    PyObject_GC_UnTrack(p);
    Py_XDECREF(p->queue);
    Py_XDECREF(p->bound);
    PyObject_GC_Del(p);
}

static PyTypeObject PopperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._sorted_queue.PopBelow",
    .tp_basicsize = sizeof(Popper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)popper_traverse,
    .tp_dealloc = (destructor)popper_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)popper_next,
};

static PyMethodDef queue_methods[] = {
    {"push", (PyCFunction)(void (*)(void))queue_push, METH_FASTCALL, "push(t, item): queue item at t"},
    {"pop_below", (PyCFunction)queue_pop_below, METH_O,
     "pop_below(bound): an iterator taking out, in t order, every item below bound (pushes while it runs included)"},
    {NULL},
};

static PySequenceMethods queue_sequence = {.sq_length = (lenfunc)queue_len};

static PyTypeObject QueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "driftstream.ordering._sorted_queue.SortedQueue",
    .tp_doc = "(t, item) pairs, popped in t order: ordering/sorted_queue.py's SortedQueue in C",
    .tp_basicsize = sizeof(Queue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = queue_new,
    .tp_traverse = (traverseproc)queue_traverse,
    .tp_clear = (inquiry)queue_clear,
    .tp_dealloc = (destructor)queue_dealloc,
    .tp_methods = queue_methods,
    .tp_as_sequence = &queue_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sorted_queue", "SortedQueue in C (see ordering/sorted_queue.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__sorted_queue(void) {
    if (PyType_Ready(&QueueType) < 0 || PyType_Ready(&PopperType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&QueueType);
    if (PyModule_AddObject(m, "SortedQueue", (PyObject *)&QueueType) < 0) {
        Py_DECREF(&QueueType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
