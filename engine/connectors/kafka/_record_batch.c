/* A Kafka sink's records and record batches, in C: sink.sink_records and
 * record_batch.encoded_batches, one call a bundle instead of about ten Python calls a record;
 * and a FileSink's JSON lines (json_lines), on the same Meta and payload encoders.
 *
 * The inverted index's sink writes ~50 small records a document; in Python its thread took
 * 18-19% of an index instance's interpreter in a backlog (py-spy --gil): a JSON call for the
 * payload and one for the Meta header, a generator step, a varint lookup per field and a
 * join per record. ``sink.py`` and ``record_batch.py`` keep the Python as the reference;
 * ``tests/engine/connectors/kafka/test_record_batch.py`` checks both give the same bytes.
 *
 * Cost: O(bytes) for both functions, one allocation per record (its value's bytes) and one
 * per batch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* -- CRC-32C (Castagnoli), slice by 8: the batch's checksum (~1-2 GB/s, a batch of 1 MB in
 * well under a millisecond) ------------------------------------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c(const unsigned char *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^ crc_table[2][p[5]] ^ crc_table[1][p[6]] ^
            crc_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n-- > 0)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* -- a growing byte buffer --------------------------------------------------------------- */

typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    unsigned char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Kafka's signed varint (zigzag, 7 bits a byte, low first): its length, and its bytes at p. */
static int varint_len(int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    int k = 1;
    while (z >= 0x80) {
        z >>= 7;
        k++;
    }
    return k;
}

static unsigned char *put_varint(unsigned char *p, int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    while (z >= 0x80) {
        *p++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    return p;
}

static unsigned char *put_be(unsigned char *p, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

/* -- sink_records ------------------------------------------------------------------------ */

/* v in decimal at p (sprintf's "%lld" without its format parsing: a third of a record's
 * encoding); the end of what it wrote. */
static char *put_decimal(char *p, long long v) {
    char tmp[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *p++ = '-';
    while (k)
        *p++ = tmp[--k];
    return p;
}

/* The JSON of a Meta tuple of exact ints (ts, source, partition, offset), a tuple of exact
 * ints (child ids) and a bool (tombstone), as orjson writes it, into out (512 bytes); its
 * length, or -1 for any other shape (the caller then asks the Python encoder). */
static Py_ssize_t meta_json(PyObject *meta, char *out) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) != 6)
        return -1;
    PyObject *children = PyTuple_GET_ITEM(meta, 4), *tomb = PyTuple_GET_ITEM(meta, 5);
    if (!PyTuple_CheckExact(children) || PyTuple_GET_SIZE(children) > 8 || !PyBool_Check(tomb))
        return -1;
    long long v[4 + 8];
    Py_ssize_t nv = 4 + PyTuple_GET_SIZE(children);
    for (Py_ssize_t i = 0; i < nv; i++) {
        PyObject *x = i < 4 ? PyTuple_GET_ITEM(meta, i) : PyTuple_GET_ITEM(children, i - 4);
        if (!PyLong_CheckExact(x))
            return -1;
        int overflow = 0;
        v[i] = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow)
            return -1;
        if (v[i] == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
    }
    char *p = out;
    *p++ = '[';
    for (Py_ssize_t i = 0; i < 4; i++) {
        p = put_decimal(p, v[i]);
        *p++ = ',';
    }
    *p++ = '[';
    for (Py_ssize_t i = 4; i < nv; i++) {
        p = put_decimal(p, v[i]);
        if (i + 1 < nv)
            *p++ = ',';
    }
    const char *end = tomb == Py_True ? "],true]" : "],false]";
    size_t k = strlen(end);
    memcpy(p, end, k);
    p += k;
    return p - out;
}

/* payload's JSON through orjson's dumps (option: its flags), as json_bytes makes it: what
 * orjson refuses (TypeError) or writes with a null in it goes to json_bytes itself (it falls
 * back to json, and refuses NaN). With copy, a copy of orjson's bytes, for the reason
 * json_bytes gives; without (a caller that copies them into its own buffer at once), orjson's. */
static PyObject *fast_json(PyObject *payload, PyObject *dumps, PyObject *option_kw, PyObject *json_bytes, int copy) {
    PyObject *args[2] = {payload, PyTuple_GET_ITEM(option_kw, 1)};
    PyObject *data = PyObject_Vectorcall(dumps, args, 1, PyTuple_GET_ITEM(option_kw, 0));
    if (data == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return NULL;
        PyErr_Clear();
        return PyObject_CallOneArg(json_bytes, payload);
    }
    if (!PyBytes_Check(data)) {
        Py_DECREF(data);
        return PyObject_CallOneArg(json_bytes, payload);
    }
    const char *s = PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    int has_null = memmem(s, n, "null", 4) != NULL;
    if (!has_null && !copy)
        return data;
    PyObject *out = has_null ? PyObject_CallOneArg(json_bytes, payload) : PyBytes_FromStringAndSize(s, n);
    Py_DECREF(data);
    return out;
}

/* (kwnames, option): orjson.dumps(payload, option=option) by vectorcall; the name is
 * interned, as orjson matches its keywords' names by identity. */
static PyObject *option_kwargs(PyObject *option) {
    PyObject *name = PyUnicode_InternFromString("option");
    PyObject *kwnames = name == NULL ? NULL : PyTuple_Pack(1, name);
    Py_XDECREF(name);
    if (kwnames == NULL)
        return NULL;
    PyObject *option_kw = PyTuple_Pack(2, kwnames, option);
    Py_DECREF(kwnames);
    return option_kw;
}

/* sink_records(elements, encode, json_bytes, dumps, option, header) -> [(value, [(header, meta json)])]
 *
 * sink.sink_records of a bundle's (meta, payload) elements: the value is encode(payload), or,
 * with dumps (orjson.dumps, when encode is json_bytes), json_bytes' result made here. Raises
 * what an encoder raised; the caller then runs the Python, whose error names the element. */
static PyObject *sink_records(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "sink_records(elements, encode, json_bytes, dumps, option, header)");
        return NULL;
    }
    PyObject *encode = args[1], *json_bytes = args[2], *dumps = args[3], *header = args[5];
    PyObject *option_kw = NULL, *items = NULL, *out = NULL;
    if (dumps != Py_None && (option_kw = option_kwargs(args[4])) == NULL)
        return NULL;
    items = PySequence_Fast(args[0], "sink_records takes (meta, payload) elements");
    if (items == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    out = PyList_New(n);
    if (out == NULL)
        goto fail;
    char js[512];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "sink_records takes (meta, payload) elements");
            goto fail;
        }
        PyObject *meta = PyTuple_GET_ITEM(item, 0), *payload = PyTuple_GET_ITEM(item, 1);
        PyObject *value = option_kw != NULL ? fast_json(payload, dumps, option_kw, json_bytes, 1)
                                            : PyObject_CallOneArg(encode, payload);
        if (value == NULL)
            goto fail;
        Py_ssize_t jn = meta_json(meta, js);
        PyObject *hval = jn >= 0 ? PyBytes_FromStringAndSize(js, jn) : PyObject_CallOneArg(json_bytes, meta);
        if (hval == NULL) {
            Py_DECREF(value);
            goto fail;
        }
        PyObject *pair = PyTuple_Pack(2, header, hval);
        Py_DECREF(hval);
        PyObject *headers = pair == NULL ? NULL : PyList_New(1);
        if (headers == NULL) {
            Py_XDECREF(pair);
            Py_DECREF(value);
            goto fail;
        }
        PyList_SET_ITEM(headers, 0, pair);
        PyObject *record = PyTuple_New(2);
        if (record == NULL) {
            Py_DECREF(headers);
            Py_DECREF(value);
            goto fail;
        }
        PyTuple_SET_ITEM(record, 0, value);
        PyTuple_SET_ITEM(record, 1, headers);
        PyList_SET_ITEM(out, i, record);
    }
    Py_DECREF(items);
    Py_XDECREF(option_kw);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(items);
    Py_XDECREF(option_kw);
    return NULL;
}

/* -- json_lines -------------------------------------------------------------------------- */

static int buf_put(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

/* json_lines(elements, json_bytes, dumps, option, line) -> bytes
 *
 * A FileSink's lines for a bundle's (meta, payload) elements, one buffer:
 * {"t":<meta>,"value":<payload>}\n each, the bytes json_bytes({"t": meta, "value": payload})
 * gives (orjson writes a nested value as it writes it alone). A meta meta_json does not take,
 * or one that is not an exact tuple (a Meta namedtuple sends orjson's whole record to json),
 * is line(meta, payload)'s, the Python's own. Raises what an encoder raised; the caller then
 * runs the Python, whose error names the sink and the element. */
static PyObject *json_lines(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "json_lines(elements, json_bytes, dumps, option, line)");
        return NULL;
    }
    PyObject *json_bytes = args[1], *dumps = args[2], *line = args[4];
    PyObject *option_kw = option_kwargs(args[3]), *items = NULL, *out = NULL;
    Buf b = {NULL, 0, 0};
    if (option_kw == NULL)
        return NULL;
    items = PySequence_Fast(args[0], "json_lines takes (meta, payload) elements");
    if (items == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    char js[512];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "json_lines takes (meta, payload) elements");
            goto fail;
        }
        PyObject *meta = PyTuple_GET_ITEM(item, 0), *payload = PyTuple_GET_ITEM(item, 1);
        Py_ssize_t jn = PyTuple_CheckExact(meta) ? meta_json(meta, js) : -1;
        PyObject *value = jn >= 0 ? fast_json(payload, dumps, option_kw, json_bytes, 0) : PyObject_CallFunctionObjArgs(line, meta, payload, NULL);
        if (value == NULL)
            goto fail;
        if (!PyBytes_Check(value)) {
            Py_DECREF(value);
            PyErr_SetString(PyExc_TypeError, "json_lines: an encoder returned something other than bytes");
            goto fail;
        }
        int bad = jn >= 0 ? (buf_put(&b, "{\"t\":", 5) < 0 || buf_put(&b, js, jn) < 0 || buf_put(&b, ",\"value\":", 9) < 0 ||
                             buf_put(&b, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value)) < 0 || buf_put(&b, "}\n", 2) < 0)
                          : (buf_put(&b, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value)) < 0 || buf_put(&b, "\n", 1) < 0);
        Py_DECREF(value);
        if (bad)
            goto fail;
    }
    out = PyBytes_FromStringAndSize((const char *)b.data, b.len);
fail:
    PyMem_Free(b.data);
    Py_XDECREF(items);
    Py_DECREF(option_kw);
    return out;
}

/* -- encoded_batches --------------------------------------------------------------------- */

/* bytes of the batch header: baseOffset .. record count (record_batch.HEADER_BYTES) */
#define HEADER_BYTES 61
/* where the CRC sits, and where what it covers starts */
#define CRC_AT 17
#define CRC_FROM 21

/* One record's parts, read from a (value, headers) pair or a keyed sink's (value, headers, key):
 * the buffers stay held until released. */
typedef struct {
    Py_buffer value;
    Py_buffer key;
    int has_key; /* 0: a null key */
    Py_ssize_t nh;
    const char *keys[16];
    Py_ssize_t key_lens[16];
    Py_buffer hvals[16];
} Parts;

static void parts_release(Parts *r) {
    PyBuffer_Release(&r->value);
    if (r->has_key)
        PyBuffer_Release(&r->key);
    r->has_key = 0;
    for (Py_ssize_t h = 0; h < r->nh; h++)
        PyBuffer_Release(&r->hvals[h]);
    r->nh = 0;
}

/* Read ``record``: -1 (an error set) for a shape the Python encodes differently or refuses;
 * more than 16 headers go to the Python too. */
static int parts_read(PyObject *record, Parts *r) {
    r->nh = 0;
    r->has_key = 0;
    if (!PyTuple_Check(record) || (PyTuple_GET_SIZE(record) != 2 && PyTuple_GET_SIZE(record) != 3)) {
        PyErr_SetString(PyExc_TypeError, "encoded_batches takes (value, headers) or (value, headers, key) records");
        return -1;
    }
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(record, 0), &r->value, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyTuple_GET_SIZE(record) == 3 && PyTuple_GET_ITEM(record, 2) != Py_None) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(record, 2), &r->key, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&r->value);
            return -1;
        }
        r->has_key = 1;
    }
    PyObject *hs = PySequence_Fast(PyTuple_GET_ITEM(record, 1), "a record's headers are (str, bytes) pairs");
    if (hs == NULL) {
        parts_release(r);
        return -1;
    }
    Py_ssize_t nh = PySequence_Fast_GET_SIZE(hs);
    if (nh > 16) {
        PyErr_SetString(PyExc_ValueError, "encoded_batches: more than 16 headers");
        goto fail;
    }
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(hs, h);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
            PyErr_SetString(PyExc_TypeError, "a record's headers are (str, bytes) pairs");
            goto fail;
        }
        /* the str's own UTF-8 copy: lives as long as the str, which the record holds */
        r->keys[h] = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &r->key_lens[h]);
        if (r->keys[h] == NULL || PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &r->hvals[h], PyBUF_SIMPLE) < 0)
            goto fail;
        r->nh = h + 1;
    }
    Py_DECREF(hs);
    return 0;
fail:
    Py_DECREF(hs);
    parts_release(r);
    return -1;
}

/* The record's body length at offset delta ``delta`` (record_batch.encode_record's body). */
static Py_ssize_t body_len(const Parts *r, Py_ssize_t delta) {
    Py_ssize_t key = r->has_key ? varint_len(r->key.len) + r->key.len : 1; /* a null key: varint -1 */
    Py_ssize_t n = 2 + varint_len(delta) + key + varint_len(r->value.len) + r->value.len + varint_len(r->nh);
    for (Py_ssize_t h = 0; h < r->nh; h++)
        n += varint_len(r->key_lens[h]) + r->key_lens[h] + varint_len(r->hvals[h].len) + r->hvals[h].len;
    return n;
}

static unsigned char *put_record(unsigned char *p, const Parts *r, Py_ssize_t delta, Py_ssize_t body) {
    p = put_varint(p, body);
    *p++ = 0; /* attributes */
    *p++ = 0; /* timestamp delta: every record of a batch has the batch's time */
    p = put_varint(p, delta);
    if (r->has_key) {
        p = put_varint(p, r->key.len);
        memcpy(p, r->key.buf, r->key.len);
        p += r->key.len;
    } else {
        *p++ = 1; /* a null key: varint -1 */
    }
    p = put_varint(p, r->value.len);
    memcpy(p, r->value.buf, r->value.len);
    p += r->value.len;
    p = put_varint(p, r->nh);
    for (Py_ssize_t h = 0; h < r->nh; h++) {
        p = put_varint(p, r->key_lens[h]);
        memcpy(p, r->keys[h], r->key_lens[h]);
        p += r->key_lens[h];
        p = put_varint(p, r->hvals[h].len);
        memcpy(p, r->hvals[h].buf, r->hvals[h].len);
        p += r->hvals[h].len;
    }
    return p;
}

/* Close the batch in ``b`` (its header's room first, then ``count`` records) onto ``out`` as
 * (bytes, count); ``b`` starts the next one. */
static int close_batch(Buf *b, Py_ssize_t count, int64_t now_ms, PyObject *out) {
    unsigned char *p = b->data;
    p = put_be(p, 0, 8);                            /* baseOffset */
    p = put_be(p, (uint64_t)(b->len - 12), 4);      /* batchLength: from the leader epoch on */
    p = put_be(p, (uint64_t)-1, 4);                 /* partitionLeaderEpoch */
    *p++ = 2;                                       /* magic */
    p += 4;                                         /* crc, below */
    p = put_be(p, 0, 2);                            /* attributes: uncompressed */
    p = put_be(p, (uint64_t)(count - 1), 4);        /* lastOffsetDelta */
    p = put_be(p, (uint64_t)now_ms, 8);             /* baseTimestamp */
    p = put_be(p, (uint64_t)now_ms, 8);             /* maxTimestamp */
    p = put_be(p, (uint64_t)-1, 8);                 /* producerId */
    p = put_be(p, (uint64_t)-1, 2);                 /* producerEpoch */
    p = put_be(p, (uint64_t)-1, 4);                 /* baseSequence */
    p = put_be(p, (uint64_t)count, 4);              /* record count */
    put_be(b->data + CRC_AT, crc32c(b->data + CRC_FROM, b->len - CRC_FROM), 4);
    PyObject *batch = Py_BuildValue("(y#n)", (const char *)b->data, b->len, count);
    if (batch == NULL)
        return -1;
    int err = PyList_Append(out, batch);
    Py_DECREF(batch);
    b->len = HEADER_BYTES;
    return err;
}

/* encoded_batches(records, max_bytes, now_ms) -> [(batch bytes, record count)]
 *
 * record_batch.encoded_batches' batches: a record goes into the batch unless the batch holds
 * one already and would pass max_bytes with it (a record larger than that goes alone). */
static PyObject *encoded_batches(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encoded_batches(records, max_bytes, now_ms)");
        return NULL;
    }
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[1]);
    long long now_ms = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *items = PySequence_Fast(args[0], "encoded_batches takes (value, headers) records");
    if (items == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    Buf b = {NULL, 0, 0};
    if (out == NULL || buf_reserve(&b, HEADER_BYTES) < 0)
        goto fail;
    b.len = HEADER_BYTES;
    Py_ssize_t count = 0, n = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        Parts r;
        if (parts_read(PySequence_Fast_GET_ITEM(items, i), &r) < 0)
            goto fail;
        Py_ssize_t body = body_len(&r, count), size = varint_len(body) + body;
        if (count > 0 && b.len + size > max_bytes) {
            if (close_batch(&b, count, now_ms, out) < 0) {
                parts_release(&r);
                goto fail;
            }
            count = 0;
            body = body_len(&r, 0); /* its offset delta in the new batch */
            size = varint_len(body) + body;
        }
        if (buf_reserve(&b, size) < 0) {
            parts_release(&r);
            goto fail;
        }
        put_record(b.data + b.len, &r, count, body);
        b.len += size;
        count++;
        parts_release(&r);
    }
    if (count > 0 && close_batch(&b, count, now_ms, out) < 0)
        goto fail;
    PyMem_Free(b.data);
    Py_DECREF(items);
    return out;
fail:
    PyMem_Free(b.data);
    Py_XDECREF(out);
    Py_DECREF(items);
    return NULL;
}

/* -- murmur2 -------------------------------------------------------------------------------- */

/* murmur2(data) -> int: partitioner.murmur2 (Kafka's Utils.murmur2, a signed 32-bit int), ~20x
 * faster than the Python: a keyed sink hashes every record's key twice (routing, writing). */
static PyObject *murmur2(PyObject *mod, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *d = b.buf;
    Py_ssize_t len = b.len;
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    Py_ssize_t whole = len & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)d[i] | (uint32_t)d[i + 1] << 8 | (uint32_t)d[i + 2] << 16 | (uint32_t)d[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)d[whole + 2] << 16; /* fall through */
    case 2:
        h ^= (uint32_t)d[whole + 1] << 8; /* fall through */
    case 1:
        h ^= d[whole];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    PyBuffer_Release(&b);
    return PyLong_FromLong((long)(int32_t)h);
}

static PyMethodDef methods[] = {
    {"murmur2", (PyCFunction)murmur2, METH_O, "partitioner.murmur2 of a bytes-like object"},
    {"sink_records", (PyCFunction)(void (*)(void))sink_records, METH_FASTCALL,
     "sink.sink_records of a bundle's elements, in one call"},
    {"json_lines", (PyCFunction)(void (*)(void))json_lines, METH_FASTCALL,
     "file_sink's JSON lines of a bundle's elements, in one buffer"},
    {"encoded_batches", (PyCFunction)(void (*)(void))encoded_batches, METH_FASTCALL,
     "record_batch.encoded_batches of a list of records, in one call"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_batch",
                                    "A Kafka sink's records and record batches, in C (see record_batch.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__record_batch(void) {
    crc_init();
    return PyModule_Create(&module);
}
