/* The C twin of two hot loops over record bodies (the Python code stays the reference):
 *
 * decode_calls(mv, pos, end, out) -- decoding.decode_messages' fast path: decodes the run
 *   of incoming calls (fork, impulse, async/await) at mv[pos:end] that the pure loop builds by
 *   setting IncomingRpc's slots, appends them to the list ``out``, and returns where it
 *   stopped (``end``, or the first message the pure loop gives to decode_message). It
 *   accepts exactly what that loop accepts and never raises for malformed input: anything
 *   doubtful is left to the Python code, which raises the documented errors. Returns -1,
 *   having done nothing, for arguments the loop is not written for (a memoryview that is
 *   not a flat run of unsigned bytes, a position out of range): the caller then runs the
 *   pure loop.
 *
 * count_replayable(body, start=0) -- routing.count_replayable: the number of fork calls in
 *   body[start:] when every message there is a fork or impulse call that decoding would
 *   accept; -1 where the Python function returns None; -2 for a body it is not written
 *   for (then run the Python one).
 *
 * init(cls, descriptors, rpc_types) -- called once at import: the IncomingRpc class, the
 *   member descriptors of its five slots in field order (method_id, rpc_type, args,
 *   sender, call_seq), and RpcType's members by value (ASYNC_AWAIT, FORK, IMPULSE).
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

static PyObject *
cdecode_init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "init() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *cls = args[0], *descrs = args[1], *types = args[2];
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "init(): the class must be a type");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_flags & Py_TPFLAGS_IS_ABSTRACT || tp->tp_alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "init(): the class cannot be instantiated");
        return NULL;
    }
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != N_SLOTS) {
        PyErr_SetString(PyExc_TypeError, "init(): expected a tuple of 5 member descriptors");
        return NULL;
    }
    if (!PyTuple_Check(types) || PyTuple_GET_SIZE(types) != 3) {
        PyErr_SetString(PyExc_TypeError, "init(): expected a tuple of 3 RPC types");
        return NULL;
    }
    Py_ssize_t offsets[N_SLOTS];
    for (Py_ssize_t i = 0; i < N_SLOTS; i++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, i);
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "init(): slot %zd is not a member descriptor", i);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        PyTypeObject *owner = PyDescr_TYPE(d);
        if (member->type != T_OBJECT_EX || (member->flags & READONLY) ||
            !PyType_IsSubtype(tp, owner) || member->offset < (Py_ssize_t)sizeof(PyObject) ||
            member->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "init(): slot %zd is not a writable object slot "
                         "of the class", i);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (offsets[j] == member->offset) {
                PyErr_Format(PyExc_TypeError, "init(): slot %zd repeats slot %zd", i, j);
                return NULL;
            }
        }
        offsets[i] = member->offset;
    }
    PyObject *empty = PyUnicode_FromStringAndSize("", 0);
    if (empty == NULL) {
        return NULL;
    }
    PyObject *z = PyLong_FromLong(0);
    if (z == NULL) {
        Py_DECREF(empty);
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(rpc_cls, tp);
    memcpy(slot_offset, offsets, sizeof(offsets));
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *t = PyTuple_GET_ITEM(types, i);
        Py_INCREF(t);
        Py_XSETREF(rpc_types[i], t);
    }
    Py_XSETREF(empty_str, empty);
    Py_XSETREF(zero, z);
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
        PyErr_Clear(); /* out of range: the pure loop says what that means */
        return PyLong_FromLong(-1);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_FULL_RO) < 0) {
        PyErr_Clear(); /* a released view: the pure loop raises as it always did */
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
        /* An RPC (type 0), a call (kind 0): stop - at >= 4, so both bytes are inside. */
        if (stop > end || b[at] != 0 || b[at + 1] != 0) {
            break;
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
        /* An async/await call (0) names its sender and numbers itself: a name of at most
         * 63 ASCII bytes (its length one varint byte), then a sequence number of at most
         * nine varint bytes. Anything else there is left to the Python code. */
        Py_ssize_t args_at = q + 1;
        const unsigned char *name = NULL;
        Py_ssize_t name_len = 0;
        long long call_seq = 0;
        if (r == 0) {
            Py_ssize_t p = q + 1;
            if (p >= stop || b[p] >= 0x80 || (b[p] & 1)) {
                break;
            }
            name_len = b[p] >> 1;
            name = b + p + 1;
            p += 1 + name_len;
            if (p > stop) {
                break;
            }
            int ascii = 1;
            for (Py_ssize_t i = 0; i < name_len; i++) {
                if (name[i] >= 0x80) {
                    ascii = 0;
                    break;
                }
            }
            if (!ascii) {
                break;
            }
            uint64_t v = 0;
            int shift = 0;
            int closed = 0;
            while (p < stop && shift < 63) {
                unsigned int c = b[p++];
                v |= (uint64_t)(c & 0x7F) << shift;
                shift += 7;
                if (c < 0x80) {
                    closed = 1;
                    break;
                }
            }
            if (!closed) {
                break;
            }
            call_seq = (long long)(v >> 1) ^ -(long long)(v & 1);
            args_at = p;
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
        /* A copy of its own, as the pure loop makes it (see _decode_messages_py). */
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
            sender_obj = PyUnicode_DecodeASCII((const char *)name, name_len, NULL);
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
        PyErr_Clear(); /* a released view: the Python function raises as it always did */
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
        else if (pos + 1 < end && b[pos + 1] < 0x80) {
            size = (Py_ssize_t)((b0 & 0x7F) | ((unsigned int)b[pos + 1] << 7));
            at = pos + 2;
        }
        else {
            goto none;
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
    {"decode_calls", (PyCFunction)(void (*)(void))cdecode_decode_calls, METH_FASTCALL,
     "decode_calls(mv, pos, end, out) -> int: append the run of fast-path calls at "
     "mv[pos:end] to out; return where it stopped (-1: not handled, nothing done)."},
    {"count_replayable", (PyCFunction)(void (*)(void))cdecode_count_replayable, METH_FASTCALL,
     "count_replayable(body, start=0) -> int: the fork calls in body[start:], a body of fork "
     "and impulse calls; -1 where routing.count_replayable returns None; -2: not handled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cdecode_module = {
    PyModuleDef_HEAD_INIT,
    "ambrosia_py.wire._cdecode",
    "C twins of decoding.decode_messages' fast path and routing.count_replayable.",
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
