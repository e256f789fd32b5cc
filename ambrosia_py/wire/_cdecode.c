/* The C accelerator of two loops over record bodies. Each has one pure-Python reference,
 * the general path, which tests/test_cdecode.py holds it to:
 *
 * decode_calls(mv, pos, end, out) -- the runs of incoming calls (fork, impulse,
 *   async/await) and return values that decoding.decode_messages reads, decoded as its
 *   reference (decoding._decode_messages_py) decodes them: each an IncomingRpc or an
 *   IncomingReturnValue (slots set directly), the arguments or value ``bytes`` of its own
 *   (messages under 8 KiB). It appends them to the list ``out`` and returns where it
 *   stopped (``end``, or the first message it leaves to the reference). It takes only
 *   the common shapes (a size of one or two varint bytes, a method id of at most five, a
 *   sender of at most 63 ASCII bytes, a call seq of at most nine, a value's length of at
 *   most two) and never raises for malformed input: anything doubtful is left to the
 *   reference, which raises the documented errors. Returns -1, having done nothing, for
 *   arguments it is not written for (a memoryview that is not a flat run of unsigned
 *   bytes, a position out of range): the caller then runs the reference alone.
 *
 * count_replayable(body, start=0) -- routing.count_replayable: the number of fork calls in
 *   body[start:] when every message there is a fork or impulse call that decoding would
 *   accept; -1 where its reference (routing._count_replayable_py) returns None; -2 where
 *   it does not decide (a body it is not written for, a message of three size bytes or
 *   more): then run the reference.
 *
 * init(cls, descriptors, rpc_types) -- called once at import: the IncomingRpc class, the
 *   member descriptors of its five slots in field order (method_id, rpc_type, args,
 *   sender, call_seq), and RpcType's members by value (ASYNC_AWAIT, FORK, IMPULSE).
 *
 * init_returns(cls, descriptors, return_types) -- the same for IncomingReturnValue (slots
 *   return_type, sender, call_seq, value) and ReturnType's VALUE, NO_VALUE, EXCEPTION.
 *   Until it is called, decode_calls leaves return values to the Python code.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#define N_SLOTS 5
enum { SLOT_METHOD, SLOT_TYPE, SLOT_ARGS, SLOT_SENDER, SLOT_SEQ };

/* Set by init; strong references. */
static PyTypeObject *rpc_cls = NULL;
static Py_ssize_t slot_offset[N_SLOTS];
static PyObject *rpc_types[3] = {NULL, NULL, NULL};
static PyObject *empty_str = NULL;
static PyObject *zero = NULL;

/* Set by init_returns; strong references. */
#define N_RET_SLOTS 4
enum { RET_TYPE, RET_SENDER, RET_SEQ, RET_VALUE };
static PyTypeObject *ret_cls = NULL;
static Py_ssize_t ret_offset[N_RET_SLOTS];
static PyObject *ret_types[3] = {NULL, NULL, NULL}; /* VALUE, NO_VALUE, EXCEPTION */

/* The offsets of ``n`` writable object slots of ``cls``, from a tuple of its member
 * descriptors (all distinct); -1 with a TypeError for anything else. */
static int
slot_offsets(PyObject *cls, PyObject *descrs, Py_ssize_t n, Py_ssize_t *offsets)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "the class must be a type");
        return -1;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_flags & Py_TPFLAGS_IS_ABSTRACT || tp->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "the class cannot be instantiated");
        return -1;
    }
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != n) {
        PyErr_Format(PyExc_TypeError, "expected a tuple of %zd member descriptors", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "slot %zd is not a member descriptor", i);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        PyTypeObject *owner = PyDescr_TYPE(d);
        if (member->type != T_OBJECT_EX || (member->flags & READONLY) ||
            !PyType_IsSubtype(tp, owner) || member->offset < (Py_ssize_t)sizeof(PyObject) ||
            member->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "slot %zd is not a writable object slot of the class",
                         i);
            return -1;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (offsets[j] == member->offset) {
                PyErr_Format(PyExc_TypeError, "slot %zd repeats slot %zd", i, j);
                return -1;
            }
        }
        offsets[i] = member->offset;
    }
    return 0;
}

/* What init and init_returns share: their three arguments (a class, its slots' member
 * descriptors in field order, three enum members by value) checked, then kept: a strong
 * reference to the class in *cls, its ``n`` slots' offsets in offsets, and strong
 * references to the members in types. -1 with a TypeError, keeping nothing, otherwise. */
static int
keep_class(const char *fn, const char *members, PyObject *const *args, Py_ssize_t nargs,
           Py_ssize_t n, PyTypeObject **cls, Py_ssize_t *offsets, PyObject **types)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s() takes 3 arguments (%zd given)", fn, nargs);
        return -1;
    }
    Py_ssize_t found[N_SLOTS > N_RET_SLOTS ? N_SLOTS : N_RET_SLOTS];
    if (slot_offsets(args[0], args[1], n, found) < 0) {
        return -1;
    }
    if (!PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 3) {
        PyErr_Format(PyExc_TypeError, "%s(): expected a tuple of 3 %s", fn, members);
        return -1;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(*cls, (PyTypeObject *)args[0]);
    memcpy(offsets, found, (size_t)n * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *t = PyTuple_GET_ITEM(args[2], i);
        Py_INCREF(t);
        Py_XSETREF(types[i], t);
    }
    return 0;
}

static PyObject *
cdecode_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    PyObject *empty = PyUnicode_FromStringAndSize("", 0);
    if (empty == NULL) {
        return NULL;
    }
    PyObject *z = PyLong_FromLong(0);
    if (z == NULL) {
        Py_DECREF(empty);
        return NULL;
    }
    if (keep_class("init", "RPC types", args, nargs, N_SLOTS, &rpc_cls, slot_offset,
                   rpc_types) < 0) {
        Py_DECREF(empty);
        Py_DECREF(z);
        return NULL;
    }
    Py_XSETREF(empty_str, empty);
    Py_XSETREF(zero, z);
    Py_RETURN_NONE;
}

static PyObject *
cdecode_init_returns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (keep_class("init_returns", "return types", args, nargs, N_RET_SLOTS, &ret_cls,
                   ret_offset, ret_types) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A flat run of unsigned bytes, indexed as bytes are: mv[i] is buf[i]. */
static int
is_flat_bytes(const Py_buffer *view)
{
    if (view->ndim != 1 || view->itemsize != 1) {
        return 0;
    }
    if (view->format != NULL && strcmp(view->format, "B") != 0) {
        return 0;
    }
    if (view->shape != NULL && view->shape[0] != view->len) {
        return 0;
    }
    if (view->strides != NULL && view->strides[0] != 1) {
        return 0;
    }
    if (view->suboffsets != NULL && view->suboffsets[0] >= 0) {
        return 0;
    }
    return 1;
}

/* Stores ``value`` (a new reference, stolen) in a slot of a fresh object (slot empty). */
static inline void
set_slot(PyObject *obj, int slot, PyObject *value)
{
    *(PyObject **)((char *)obj + slot_offset[slot]) = value;
}

/* The sender's name and a sequence number at b[p:stop], as an async/await call and a
 * return value carry them: a name of at most 63 ASCII bytes (its length one varint byte),
 * then a varint of at most nine bytes. Returns where they end, or -1 for anything else
 * (the reference's to read). */
static Py_ssize_t
caller_at(const unsigned char *b, Py_ssize_t p, Py_ssize_t stop, Py_ssize_t *name_at,
          Py_ssize_t *name_len, long long *seq)
{
    if (p >= stop || b[p] >= 0x80 || (b[p] & 1)) {
        return -1;
    }
    Py_ssize_t n = b[p] >> 1;
    *name_at = p + 1;
    *name_len = n;
    p += 1 + n;
    if (p > stop) {
        return -1;
    }
    for (Py_ssize_t i = *name_at; i < *name_at + n; i++) {
        if (b[i] >= 0x80) {
            return -1;
        }
    }
    uint64_t v = 0;
    for (int shift = 0; p < stop && shift < 63; shift += 7) {
        unsigned int c = b[p++];
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *seq = (long long)(v >> 1) ^ -(long long)(v & 1);
            return p;
        }
    }
    return -1;
}

/* An IncomingReturnValue of kind 1-3 (value, no value, exception) from b[p:stop], after
 * its kind byte: its caller (caller_at), then for a value or an exception a length of one
 * or two varint bytes and exactly that many bytes to the end. NULL with no error set for
 * anything else, NULL with an error set when Python failed. */
static PyObject *
decode_return(const unsigned char *b, Py_ssize_t p, Py_ssize_t stop, unsigned int kind)
{
    Py_ssize_t name_at, name_len;
    long long seq;
    p = caller_at(b, p, stop, &name_at, &name_len, &seq);
    if (p < 0) {
        return NULL;
    }
    Py_ssize_t value_len = 0;
    if (kind != 2) {
        if (p >= stop) {
            return NULL;
        }
        unsigned int v = b[p++];
        if (v >= 0x80) {
            if (p >= stop || b[p] >= 0x80) {
                return NULL;
            }
            v = (v & 0x7F) | ((unsigned int)b[p++] << 7);
        }
        if (v & 1) {
            return NULL;
        }
        value_len = v >> 1;
    }
    if (p + value_len != stop) {
        return NULL;
    }
    PyObject *reply = ret_cls->tp_alloc(ret_cls, 0);
    if (reply == NULL) {
        return NULL;
    }
    PyObject *slots[N_RET_SLOTS];
    slots[RET_TYPE] = ret_types[kind - 1];
    Py_INCREF(slots[RET_TYPE]);
    slots[RET_SENDER] = PyUnicode_DecodeASCII((const char *)b + name_at, name_len, NULL);
    slots[RET_SEQ] = PyLong_FromLongLong(seq);
    /* A copy of its own, as the reference makes it; b"" for no value. */
    slots[RET_VALUE] = PyBytes_FromStringAndSize((const char *)b + p, value_len);
    for (int i = 0; i < N_RET_SLOTS; i++) {
        *(PyObject **)((char *)reply + ret_offset[i]) = slots[i];
    }
    if (slots[RET_SENDER] == NULL || slots[RET_SEQ] == NULL || slots[RET_VALUE] == NULL) {
        Py_DECREF(reply); /* the slots set are released with it; NULL ones are skipped */
        return NULL;
    }
    return reply;
}

static PyObject *
cdecode_decode_calls(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "decode_calls() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    if (rpc_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_calls(): init() was not called");
        return NULL;
    }
    PyObject *mv = args[0], *out = args[3];
    if (!PyMemoryView_Check(mv)) {
        PyErr_SetString(PyExc_TypeError, "decode_calls(): expected a memoryview");
        return NULL;
    }
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "decode_calls(): expected a list to append to");
        return NULL;
    }
    if (!PyLong_Check(args[1]) || !PyLong_Check(args[2])) {
        return PyLong_FromLong(-1);
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if ((pos == -1 || end == -1) && PyErr_Occurred()) {
        PyErr_Clear(); /* out of range: the reference says what that means */
        return PyLong_FromLong(-1);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_FULL_RO) < 0) {
        PyErr_Clear(); /* a released view: the reference raises as it always did */
        return PyLong_FromLong(-1);
    }
    if (!is_flat_bytes(&view) || pos < 0 || end > view.len) {
        PyBuffer_Release(&view);
        return PyLong_FromLong(-1);
    }
    const unsigned char *b = (const unsigned char *)view.buf;
    while (pos < end) {
        /* The size: one or two varint bytes, even (zig-zag: not negative), at least 4. */
        Py_ssize_t raw, at;
        unsigned int b0 = b[pos];
        if (b0 < 0x80) {
            raw = b0;
            at = pos + 1;
        }
        else if (pos + 1 < end && b[pos + 1] < 0x80) {
            raw = (Py_ssize_t)((b0 & 0x7F) | ((unsigned int)b[pos + 1] << 7));
            at = pos + 2;
        }
        else {
            break;
        }
        if ((raw & 1) || raw < 8) {
            break;
        }
        Py_ssize_t stop = at + (raw >> 1);
        /* An RPC (type 0): stop - at >= 4, so its type and kind bytes are inside. A return
         * value (kind 1-3) is built here whole; a call (kind 0) below. */
        if (stop > end || b[at] != 0) {
            break;
        }
        if (b[at + 1] != 0) {
            if (b[at + 1] > 3 || ret_cls == NULL) {
                break;
            }
            PyObject *reply = decode_return(b, at + 2, stop, b[at + 1]);
            if (reply == NULL) {
                if (PyErr_Occurred()) {
                    goto error;
                }
                break;
            }
            int failed = PyList_Append(out, reply);
            Py_DECREF(reply);
            if (failed) {
                goto error;
            }
            pos = stop;
            continue;
        }
        /* The method id: at most five varint bytes, its value within 32 bits. */
        Py_ssize_t q = at + 2;
        uint64_t m = b[q++];
        if (m >= 0x80) {
            m &= 0x7F;
            int shift = 7;
            int closed = 0;
            while (q < stop && shift < 35) {
                unsigned int c = b[q++];
                m |= (uint64_t)(c & 0x7F) << shift;
                shift += 7;
                if (c < 0x80) {
                    closed = 1;
                    break;
                }
            }
            if (!closed) {
                break;
            }
        }
        if (m > 0xFFFFFFFFu || q >= stop) {
            break;
        }
        unsigned int r = b[q];
        if (r > 2) {
            break;
        }
        long long method = (long long)(m >> 1) ^ -(long long)(m & 1);
        /* An async/await call (0) names its sender and numbers itself (caller_at). */
        Py_ssize_t args_at = q + 1;
        Py_ssize_t name_at = 0, name_len = 0;
        long long call_seq = 0;
        if (r == 0) {
            args_at = caller_at(b, q + 1, stop, &name_at, &name_len, &call_seq);
            if (args_at < 0) {
                break;
            }
        }

        PyObject *call = rpc_cls->tp_alloc(rpc_cls, 0);
        if (call == NULL) {
            goto error;
        }
        PyObject *method_obj = PyLong_FromLongLong(method);
        if (method_obj == NULL) {
            Py_DECREF(call);
            goto error;
        }
        set_slot(call, SLOT_METHOD, method_obj);
        /* A copy of its own, as the reference makes it (decoding._COPY_BELOW). */
        PyObject *args_obj = PyBytes_FromStringAndSize((const char *)b + args_at, stop - args_at);
        if (args_obj == NULL) {
            Py_DECREF(call);
            goto error;
        }
        set_slot(call, SLOT_ARGS, args_obj);
        Py_INCREF(rpc_types[r]);
        set_slot(call, SLOT_TYPE, rpc_types[r]);
        PyObject *sender_obj = empty_str, *seq_obj = zero;
        if (r == 0) {
            sender_obj = PyUnicode_DecodeASCII((const char *)b + name_at, name_len, NULL);
            seq_obj = sender_obj == NULL ? NULL : PyLong_FromLongLong(call_seq);
            if (seq_obj == NULL) {
                Py_XDECREF(sender_obj);
                sender_obj = NULL;
            }
        }
        else {
            Py_INCREF(sender_obj);
            Py_INCREF(seq_obj);
        }
        if (sender_obj == NULL) {
            /* the slots not set stay NULL: the object is freed as it is */
            Py_DECREF(call);
            goto error;
        }
        set_slot(call, SLOT_SENDER, sender_obj);
        set_slot(call, SLOT_SEQ, seq_obj);
        int failed = PyList_Append(out, call);
        Py_DECREF(call);
        if (failed) {
            goto error;
        }
        pos = stop;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(pos);

error:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
cdecode_count_replayable(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 1 && nargs != 2) {
        PyErr_Format(PyExc_TypeError, "count_replayable() takes 1 or 2 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    PyObject *body = args[0];
    Py_ssize_t start = 0;
    if (nargs == 2) {
        if (!PyLong_Check(args[1])) {
            return PyLong_FromLong(-2);
        }
        start = PyLong_AsSsize_t(args[1]);
        if (start == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return PyLong_FromLong(-2);
        }
    }
    /* Only types whose items are their bytes (a subclass could index otherwise). */
    if (!PyBytes_CheckExact(body) && !PyByteArray_CheckExact(body) &&
        !PyMemoryView_Check(body)) {
        return PyLong_FromLong(-2);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(body, &view, PyBUF_FULL_RO) < 0) {
        PyErr_Clear(); /* a released view: the reference raises as it always did */
        return PyLong_FromLong(-2);
    }
    if (!is_flat_bytes(&view) || start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        return PyLong_FromLong(-2);
    }
    const unsigned char *b = (const unsigned char *)view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = start, n = 0;
    while (pos < end) {
        Py_ssize_t size, at;
        unsigned int b0 = b[pos];
        if (b0 < 0x80) {
            size = b0;
            at = pos + 1;
        }
        else if (pos + 1 >= end) {
            goto none; /* a size cut short: decoding refuses it */
        }
        else if (b[pos + 1] < 0x80) {
            size = (Py_ssize_t)((b0 & 0x7F) | ((unsigned int)b[pos + 1] << 7));
            at = pos + 2;
        }
        else {
            /* A size of three or more bytes (a message of 8 KiB or more, or a longer
             * encoding): the reference decides. */
            PyBuffer_Release(&view);
            return PyLong_FromLong(-2);
        }
        Py_ssize_t stop = at + (size >> 1);
        /* stop - at >= 2: the type byte and the kind byte are inside. */
        if ((size & 1) || size < 4 || stop > end || b[at] != 0 || b[at + 1] != 0) {
            goto none;
        }
        Py_ssize_t p = at + 2;
        Py_ssize_t last = p + 5 < stop ? p + 5 : stop;
        while (p < last && b[p] >= 0x80) {
            p++;
        }
        if (p >= last || (p - at == 6 && b[p] > 0x0F) || p + 1 >= stop) {
            goto none;
        }
        unsigned int rpc_type = b[p + 1];
        if (rpc_type == 1) { /* FORK */
            n++;
        }
        else if (rpc_type != 2) { /* not IMPULSE: an async/await call */
            goto none;
        }
        pos = stop;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);

none:
    PyBuffer_Release(&view);
    return PyLong_FromLong(-1);
}

static PyMethodDef cdecode_methods[] = {
    {"init", (PyCFunction)(void (*)(void))cdecode_init, METH_FASTCALL,
     "init(cls, descriptors, rpc_types): IncomingRpc, its slots' member descriptors in "
     "field order, RpcType's members by value."},
    {"init_returns", (PyCFunction)(void (*)(void))cdecode_init_returns, METH_FASTCALL,
     "init_returns(cls, descriptors, return_types): IncomingReturnValue, its slots' member "
     "descriptors in field order, ReturnType's VALUE, NO_VALUE and EXCEPTION."},
    {"decode_calls", (PyCFunction)(void (*)(void))cdecode_decode_calls, METH_FASTCALL,
     "decode_calls(mv, pos, end, out) -> int: append the run of fast-path calls at "
     "mv[pos:end] to out; return where it stopped (-1: not handled, nothing done)."},
    {"count_replayable", (PyCFunction)(void (*)(void))cdecode_count_replayable, METH_FASTCALL,
     "count_replayable(body, start=0) -> int: the fork calls in body[start:], a body of fork "
     "and impulse calls; -1 where routing.count_replayable returns None; -2: not decided."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cdecode_module = {
    PyModuleDef_HEAD_INIT,
    "ambrosia_py.wire._cdecode",
    "C accelerators of decoding.decode_messages and routing.count_replayable.",
    -1,
    cdecode_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__cdecode(void)
{
    return PyModule_Create(&cdecode_module);
}
