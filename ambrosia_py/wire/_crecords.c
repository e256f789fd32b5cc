/* Accelerator for reading log records. Its one pure-Python reference is the general path
 * (reader.py's RecordReader._next_raw_pure and _take_calls_pure, records.py).
 *
 * Only *clean* records are handled here: a complete header whose length is in the right
 * form and range, a complete body, (on disk) a complete, well-formed watermark section,
 * the expected committer and sequence id, and matching check bytes. At anything else
 * (too few bytes, a bad length, a bad check, a mismatch, a malformed tail, an invalid
 * name, a record of 64 KiB or more) these functions stop *before* that record and the
 * caller's pure-Python path reads it, so errors, messages and offsets are the reference's.
 *
 * The check bytes are XXH64 (seed 0), the system's libxxhash (setup.py links it).
 *
 * Results are the reference's attrs classes (given once to configure()). They are filled in
 * without running their generated __init__ (allocation, then the slots set through the
 * generic setattr, which a frozen class's __setattr__ does not stand in the way of):
 * these classes have no validators or converters, so the objects are the same, for a
 * fraction of the cost. tests/test_crecords.py holds both paths to equal results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include <xxhash.h>

static inline uint64_t rd64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* ---- configuration: the reference's classes --------------------------------------------- */

static PyTypeObject *T_header, *T_raw, *T_tail, *T_wm, *T_trim;
static PyObject *empty_tail; /* DiskRecordTail((), ()): frozen, so one serves all */
static PyObject *S_committer_id, *S_length, *S_check, *S_seq, *S_header, *S_raw, *S_offset,
    *S_tail, *S_watermarks, *S_trims, *S_name, *S_last_seq, *S_last_replayable_seq;

#define HEADER_SIZE 24
#define HAND_OVER (64 * 1024) /* reader._HAND_OVER: larger records go the pure way */
#define MAX_WATERMARKS (1 << 20)

/* A new instance of ``tp`` with ``n`` slots set; steals the references in ``vals``
 * (all of them, also on failure; a NULL value means an error already set). */
static PyObject *make(PyTypeObject *tp, PyObject *const *names, PyObject **vals, int n)
{
    PyObject *obj = NULL;
    for (int i = 0; i < n; i++)
        if (vals[i] == NULL)
            goto done;
    obj = tp->tp_alloc(tp, 0);
    if (obj == NULL)
        goto done;
    for (int i = 0; i < n; i++) {
        if (PyObject_GenericSetAttr(obj, names[i], vals[i]) < 0) {
            Py_CLEAR(obj);
            goto done;
        }
    }
done:
    for (int i = 0; i < n; i++)
        Py_XDECREF(vals[i]);
    return obj;
}

static int check_class(PyObject *cls, PyTypeObject **slot)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes classes");
        return -1;
    }
    Py_INCREF(cls);
    Py_XSETREF(*slot, (PyTypeObject *)cls);
    return 0;
}

static PyObject *py_configure(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(RecordHeader, RawRecord, DiskRecordTail, Watermark, "
                        "TrimWatermark)");
        return NULL;
    }
    if (check_class(args[0], &T_header) < 0 || check_class(args[1], &T_raw) < 0 ||
        check_class(args[2], &T_tail) < 0 || check_class(args[3], &T_wm) < 0 ||
        check_class(args[4], &T_trim) < 0)
        return NULL;
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL)
        return NULL;
    PyObject *tail = PyObject_CallFunctionObjArgs((PyObject *)T_tail, empty, empty, NULL);
    Py_DECREF(empty);
    if (tail == NULL)
        return NULL;
    Py_XSETREF(empty_tail, tail);
    Py_RETURN_NONE;
}

/* ---- parsing -------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *data;
    Py_ssize_t size;
    long long consumed;
    int on_disk, verify;
    int have_committer;
    int32_t committer;
    int have_next;
    int64_t next_seq;
    long long max_record;
} Ctx;

/* ZigZagInt at *pos (the reference's decode_zigzag_int); 0 on any failure. */
static int zigzag_int(const unsigned char *d, Py_ssize_t size, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t at = *pos;
    uint64_t n = 0;
    for (int i = 0; i < 5; i++) {
        if (at >= size)
            return 0;
        unsigned char b = d[at++];
        n |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            if (n > 0xFFFFFFFFULL)
                return 0;
            *out = (int64_t)(n >> 1) ^ -(int64_t)(n & 1);
            *pos = at;
            return 1;
        }
    }
    return 0;
}

static inline int64_t rd_i64(const unsigned char *p) { return (int64_t)rd64(p); }

/* ``count`` entries at *at, each a name and ``n_ints`` int64s (a watermark: two, a trim
 * watermark: one), as a tuple of ``tp`` objects with the fields ``names`` (new
 * reference), advancing *at. NULL and no error: not clean (the reference reads them); NULL
 * and an error: a real failure (memory). */
static PyObject *parse_entries(const unsigned char *d, Py_ssize_t size, Py_ssize_t *at,
                               int64_t count, int n_ints, PyTypeObject *tp,
                               PyObject *const *names)
{
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    if (out == NULL)
        return NULL;
    for (int64_t i = 0; i < count; i++) {
        int64_t n;
        if (!zigzag_int(d, size, at, &n) || n < 0 || n > size - *at ||
            size - *at - n < 8 * n_ints)
            goto fail;
        PyObject *vals[3];
        vals[0] = PyUnicode_DecodeUTF8((const char *)d + *at, (Py_ssize_t)n, NULL);
        if (vals[0] == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                PyErr_Clear(); /* not UTF-8: not clean */
            goto fail;
        }
        *at += n;
        for (int k = 1; k <= n_ints; k++, *at += 8)
            vals[k] = PyLong_FromLongLong(rd_i64(d + *at));
        PyObject *entry = make(tp, names, vals, 1 + n_ints);
        if (entry == NULL)
            goto fail;
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, entry);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The watermark sections at *pos as a DiskRecordTail (new reference). Returns NULL with
 * no error set if they are not clean (the reference reads them), NULL with an error set on
 * a real failure (memory). */
static PyObject *parse_tail(const Ctx *c, Py_ssize_t *pos)
{
    const unsigned char *d = c->data;
    Py_ssize_t size = c->size, at = *pos;
    int64_t count, tcount;

    if (!zigzag_int(d, size, &at, &count) || count < 0 || count > MAX_WATERMARKS)
        return NULL;
    if (count == 0 && at < size && d[at] == 0) { /* the common case: no watermarks */
        *pos = at + 1;
        Py_INCREF(empty_tail);
        return empty_tail;
    }
    if (count * 17 > size - at) /* each entry takes at least 17 bytes */
        return NULL;
    PyObject *wm_names[3] = {S_name, S_last_seq, S_last_replayable_seq};
    PyObject *wms = parse_entries(d, size, &at, count, 2, T_wm, wm_names);
    if (wms == NULL)
        return NULL;
    if (!zigzag_int(d, size, &at, &tcount) || tcount < 0 || tcount > MAX_WATERMARKS ||
        tcount * 9 > size - at) {
        Py_DECREF(wms);
        return NULL;
    }
    PyObject *trim_names[2] = {S_name, S_seq};
    PyObject *trims = parse_entries(d, size, &at, tcount, 1, T_trim, trim_names);
    if (trims == NULL) {
        Py_DECREF(wms);
        return NULL;
    }
    *pos = at;
    PyObject *vals[2] = {wms, trims};
    PyObject *names[2] = {S_watermarks, S_trims};
    return make(T_tail, names, vals, 2);
}

/* Whether the record at ``at`` is clean up to the end of its body: a complete header
 * with a length in the right form and range, the expected committer and sequence id, and
 * (when verifying) matching check bytes. Fills in its fields (``length`` as a positive
 * count of bytes, header included); never raises. */
typedef struct {
    int32_t committer;
    int64_t length;
    uint64_t check;
    int64_t seq;
} Head;

static int clean_head(const Ctx *c, Py_ssize_t at, Head *r)
{
    const unsigned char *d = c->data;
    if (c->size - at < HEADER_SIZE)
        return 0;
    const unsigned char *h = d + at;
    int32_t committer = (int32_t)rd32(h);
    int64_t length = (int32_t)rd32(h + 4);
    uint64_t check = rd64(h + 8);
    int64_t seq = rd_i64(h + 16);
    if (c->on_disk) {
        if (length >= 0)
            return 0;
        length = -length - 1;
    }
    if (length < HEADER_SIZE || length > c->max_record || length >= HAND_OVER ||
        length > c->size - at)
        return 0;
    if (c->have_committer && committer != c->committer)
        return 0;
    if (seq == INT64_MAX) /* its successor does not fit: the reference's business */
        return 0;
    if (seq < 0) {
        if (c->on_disk || (seq != -1 && seq != -2))
            return 0;
    }
    else if (c->have_next && seq != c->next_seq)
        return 0;
    if (c->verify) {
        if (seq == -2) {
            if (check != 0)
                return 0;
        }
        else if (XXH64(h + HEADER_SIZE, (size_t)(length - HEADER_SIZE), 0) != check)
            return 0;
    }
    r->committer = committer;
    r->length = length;
    r->check = check;
    r->seq = seq;
    return 1;
}

/* A clean record was taken: the next must carry its committer and (logged) the next seq. */
static void took(Ctx *c, const Head *r)
{
    c->have_committer = 1;
    c->committer = r->committer;
    if (r->seq >= 0) {
        c->have_next = 1;
        c->next_seq = r->seq + 1;
    }
}

/* The clean record at *pos as a RawRecord (new reference), advancing *pos and the
 * context's committer and next seq. NULL and no error: not clean, or incomplete (the
 * reference reads it); NULL and an error: a real failure. */
static PyObject *parse_one(Ctx *c, Py_ssize_t *pos)
{
    Py_ssize_t at = *pos;
    Head r;
    if (!clean_head(c, at, &r))
        return NULL;
    const unsigned char *h = c->data + at;
    Py_ssize_t end = at + (Py_ssize_t)r.length;
    PyObject *tail;
    if (c->on_disk) {
        tail = parse_tail(c, &end);
        if (tail == NULL)
            return NULL;
        if (end - at >= HAND_OVER) {
            Py_DECREF(tail);
            return NULL;
        }
    }
    else {
        tail = Py_None;
        Py_INCREF(tail);
    }
    PyObject *hvals[4] = {PyLong_FromLong(r.committer), PyLong_FromLongLong(r.length),
                          PyLong_FromUnsignedLongLong(r.check), PyLong_FromLongLong(r.seq)};
    PyObject *hnames[4] = {S_committer_id, S_length, S_check, S_seq};
    PyObject *rvals[4] = {make(T_header, hnames, hvals, 4),
                          PyBytes_FromStringAndSize((const char *)h, end - at),
                          PyLong_FromLongLong(c->consumed + (long long)at), tail};
    PyObject *rnames[4] = {S_header, S_raw, S_offset, S_tail};
    PyObject *rec = make(T_raw, rnames, rvals, 4);
    if (rec == NULL)
        return NULL;
    *pos = end;
    took(c, &r);
    return rec;
}

/* The first eight arguments of take_raws:
 * (data, pos, consumed, on_disk, verify, committer, next_seq, max_record).
 * Returns 1 ready, 0 when the input cannot be handled here (the caller falls back), -1
 * on error. ``view`` must be released by the caller when 1 was returned. */
static int parse_args(PyObject *const *args, Ctx *c, Py_buffer *view, Py_ssize_t *pos)
{
    if (T_raw == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_crecords.configure() was not called");
        return -1;
    }
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    c->consumed = PyLong_AsLongLong(args[2]);
    if (c->consumed == -1 && PyErr_Occurred())
        return -1;
    c->on_disk = PyObject_IsTrue(args[3]);
    c->verify = PyObject_IsTrue(args[4]);
    if (c->on_disk < 0 || c->verify < 0)
        return -1;
    int overflow = 0;
    c->have_committer = args[5] != Py_None;
    if (c->have_committer) {
        long long v = PyLong_AsLongLongAndOverflow(args[5], &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (overflow || v < INT32_MIN || v > INT32_MAX)
            return 0; /* no record can match: the reference says so */
        c->committer = (int32_t)v;
    }
    c->have_next = args[6] != Py_None;
    if (c->have_next) {
        long long v = PyLong_AsLongLongAndOverflow(args[6], &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (overflow || v == INT64_MAX)
            return 0;
        c->next_seq = v;
    }
    c->max_record = PyLong_AsLongLongAndOverflow(args[7], &overflow);
    if (c->max_record == -1 && PyErr_Occurred())
        return -1;
    if (overflow)
        c->max_record = overflow > 0 ? LLONG_MAX : -1;
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0)
        return -1;
    c->data = (const unsigned char *)view->buf;
    c->size = view->len;
    if (*pos < 0 || *pos > c->size) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* The state after taking records from ``start`` to ``pos``: (pos, committer, next_seq),
 * or the caller's own (args 1, 5, 6) when nothing was taken. */
static PyObject *state_after(PyObject *const *args, const Ctx *c, Py_ssize_t start,
                             Py_ssize_t pos)
{
    if (pos == start) /* nothing taken: the caller's state stands */
        return PyTuple_Pack(3, args[1], args[5], args[6]);
    PyObject *next = c->have_next ? PyLong_FromLongLong(c->next_seq) : Py_NewRef(Py_None);
    if (next == NULL)
        return NULL;
    return Py_BuildValue("(niN)", pos, (int)c->committer, next);
}

static PyObject *py_take_raws(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyList_Check(args[9])) {
        PyErr_SetString(PyExc_TypeError, "take_raws() takes 9 arguments and a list");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[8]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *out = args[9];
    Ctx c;
    Py_buffer view;
    Py_ssize_t pos;
    int ok = parse_args(args, &c, &view, &pos);
    if (ok < 0)
        return NULL;
    Py_ssize_t start = pos;
    if (ok > 0) {
        while (PyList_GET_SIZE(out) < limit) {
            PyObject *rec = parse_one(&c, &pos);
            if (rec == NULL) {
                if (PyErr_Occurred()) {
                    PyBuffer_Release(&view);
                    return NULL;
                }
                break;
            }
            int err = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (err < 0) {
                PyBuffer_Release(&view);
                return NULL;
            }
        }
        PyBuffer_Release(&view);
    }
    return state_after(args, &c, start, pos);
}

/* take_calls: the clean logged records (wire form, sequence id 0 or more) whose bodies
 * ``decode`` (decoding's C loop over incoming calls) reads to the end, each as
 * (seq, [calls]) appended to ``out``. It stops *before* any other record, which the
 * caller reads the general way (RecordReader.next_record); each record taken is copied
 * out once, and decoded from that copy. */
static PyObject *py_take_calls(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11 || !PyCallable_Check(args[9]) || !PyList_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError, "take_calls() takes 9 arguments, a decoder and a list");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[8]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *decode = args[9], *out = args[10];
    Ctx c;
    Py_buffer view;
    Py_ssize_t pos;
    int ok = parse_args(args, &c, &view, &pos);
    if (ok < 0)
        return NULL;
    Py_ssize_t start = pos;
    if (ok > 0 && c.on_disk) {
        PyBuffer_Release(&view);
        ok = 0; /* the wire form only */
    }
    if (ok > 0) {
        PyObject *header_size = PyLong_FromLong(HEADER_SIZE);
        if (header_size == NULL) {
            PyBuffer_Release(&view);
            return NULL;
        }
        int failed = 0;
        Head r;
        while (PyList_GET_SIZE(out) < limit && clean_head(&c, pos, &r) && r.seq >= 0) {
            PyObject *record = NULL, *mv = NULL, *calls = NULL, *end = NULL, *at = NULL;
            PyObject *item = NULL, *seq = NULL;
            int taken = 0;
            record = PyBytes_FromStringAndSize((const char *)c.data + pos, (Py_ssize_t)r.length);
            mv = record == NULL ? NULL : PyMemoryView_FromObject(record);
            calls = PyList_New(0);
            end = PyLong_FromLongLong(r.length);
            if (mv == NULL || calls == NULL || end == NULL)
                goto next;
            PyObject *call_args[4] = {mv, header_size, end, calls};
            at = PyObject_Vectorcall(decode, call_args, 4, NULL);
            if (at == NULL)
                goto next;
            int whole = PyObject_RichCompareBool(at, end, Py_EQ);
            if (whole <= 0) /* -1: an error; 0: not only calls, left for the caller */
                goto next;
            seq = PyLong_FromLongLong(r.seq);
            item = seq == NULL ? NULL : PyTuple_Pack(2, seq, calls);
            if (item == NULL || PyList_Append(out, item) < 0)
                goto next;
            taken = 1;
        next:
            Py_XDECREF(item);
            Py_XDECREF(seq);
            Py_XDECREF(at);
            Py_XDECREF(end);
            Py_XDECREF(calls);
            Py_XDECREF(mv);
            Py_XDECREF(record);
            if (!taken) {
                failed = PyErr_Occurred() != NULL;
                break;
            }
            pos += (Py_ssize_t)r.length;
            took(&c, &r);
        }
        Py_DECREF(header_size);
        PyBuffer_Release(&view);
        if (failed)
            return NULL;
    }
    return state_after(args, &c, start, pos);
}

static PyObject *py_disk_to_wire(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "disk_to_wire(raw, length)");
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[1]);
    if (length == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (length < HEADER_SIZE || length > view.len || length > INT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "length outside the record");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, length);
    if (out != NULL) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        memcpy(o, view.buf, (size_t)length);
        uint32_t v = (uint32_t)length;
        o[4] = (unsigned char)v;
        o[5] = (unsigned char)(v >> 8);
        o[6] = (unsigned char)(v >> 16);
        o[7] = (unsigned char)(v >> 24);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))py_configure, METH_FASTCALL,
     "configure(RecordHeader, RawRecord, DiskRecordTail, Watermark, TrimWatermark)"},
    {"take_raws", (PyCFunction)(void (*)(void))py_take_raws, METH_FASTCALL,
     "take_raws(data, pos, consumed, on_disk, verify, committer, next_seq, max_record, "
     "limit, out)\nAppend the clean records from pos to out (until it holds limit); "
     "return (pos, committer, next_seq) after them."},
    {"take_calls", (PyCFunction)(void (*)(void))py_take_calls, METH_FASTCALL,
     "take_calls(data, pos, consumed, on_disk, verify, committer, next_seq, max_record, "
     "limit, decode, out)\nAppend (seq, calls) for each clean logged record from pos whose "
     "body decode(view, 24, length, calls) reads to the end, until out holds limit; stop "
     "before any other record; return (pos, committer, next_seq) after those taken."},
    {"disk_to_wire", (PyCFunction)(void (*)(void))py_disk_to_wire, METH_FASTCALL,
     "disk_to_wire(raw, length): the wire form of an on-disk record's first length bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_crecords", "C accelerator for reading log records.", -1, methods,
};

PyMODINIT_FUNC PyInit__crecords(void)
{
#define INTERN(var, s)                                                                     \
    if ((var = PyUnicode_InternFromString(s)) == NULL)                                     \
        return NULL;
    INTERN(S_committer_id, "committer_id");
    INTERN(S_length, "length");
    INTERN(S_check, "check");
    INTERN(S_seq, "seq");
    INTERN(S_header, "header");
    INTERN(S_raw, "raw");
    INTERN(S_offset, "offset");
    INTERN(S_tail, "tail");
    INTERN(S_watermarks, "watermarks");
    INTERN(S_trims, "trims");
    INTERN(S_name, "name");
    INTERN(S_last_seq, "last_seq");
    INTERN(S_last_replayable_seq, "last_replayable_seq");
#undef INTERN
    return PyModule_Create(&module);
}
