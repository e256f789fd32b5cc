/* The C twin of a link's per-frame work for small frames (the Python code stays the
 * reference): the flow frame (seed 004: u32 length | u64 XXH3-64 of token + message |
 * token | message) around a link message (payload | 16-byte tag, the tag HMAC-SHA256
 * over the frame's u64 counter, the token's 16 bytes and the payload, cut to 128 bits;
 * link_auth.LinkChannel).
 *
 * No hashing is written here: HMAC-SHA256 is OpenSSL's, its tag compared with
 * CRYPTO_memcmp, and XXH3-64 the system's libxxhash (setup.py links both). What this
 * file adds is the framing: one call checks or builds a whole frame where the Python
 * path takes a dozen (docs/performance.md has the measurements that keep it).
 *
 * The HMAC calls are OpenSSL's HMAC_CTX API, as CPython's hmac module makes them.
 * OpenSSL 3 marks it deprecated in favour of EVP_MAC, which measured 0.3-0.5 us slower
 * per frame inside a coordinator: its final asks the provider for the MAC size each time.
 *
 * mac_state(key) -- a keyed HMAC-SHA256 context for ``key`` (an opaque object, freed
 *   with it), what the other calls take. One object serves one direction of one link:
 *   each use starts again from the keyed state OpenSSL keeps in it.
 *
 * hmac(state, data) -- HMAC-SHA256 of ``data`` under the key of ``state`` (32 bytes).
 *
 * open_frame(data, max_length, state, counter, first, second) -- the payload of ``data``
 *   when ``data`` is exactly one whole frame, its length within 16..max_length, its
 *   checksum right, its token (first, second), and its tag the one for ``counter``; None
 *   for anything else (nothing is raised for bad bytes: the Python path then reads the
 *   same bytes and raises what is wrong, or takes what is not this path's shape).
 *
 * seal_frame(parts, max_length, state, counter, first, second) -- the whole frame (header,
 *   the parts, a tuple of bytes, one after the other, then the tag) for a message to
 *   (first, second); None when it would be longer than max_length (the Python path
 *   raises that) or a part is not bytes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define OPENSSL_SUPPRESS_DEPRECATED /* HMAC_CTX: see above */
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <xxhash.h>

#define TAG_SIZE 16
#define DIGEST_SIZE 32 /* HMAC-SHA256 */
#define HEADER_SIZE 28 /* u32 length, u64 checksum, u64 token first, u64 token second */
#define TOKEN_AT 12 /* the token; also the bytes before what the length counts */
#define MIN_FRAME_LENGTH 16
#define MAC_NAME "ambrosia_py.coordinator._clink.mac_state"

/* --- HMAC-SHA256, OpenSSL's ------------------------------------------------------------ */

/* A RuntimeError naming what failed and OpenSSL's reason; NULL. */
static PyObject *
openssl_error(const char *what)
{
    char reason[256] = "no reason given";
    unsigned long code = ERR_get_error();
    if (code != 0) {
        ERR_error_string_n(code, reason, sizeof reason);
    }
    ERR_clear_error();
    PyErr_Format(PyExc_RuntimeError, "OpenSSL's HMAC-SHA256: %s failed (%s)", what, reason);
    return NULL;
}

static void
mac_free(PyObject *capsule)
{
    HMAC_CTX_free(PyCapsule_GetPointer(capsule, MAC_NAME));
}

/* The context of a ``mac_state`` object; NULL with a TypeError for anything else. */
static HMAC_CTX *
get_mac(PyObject *obj)
{
    if (!PyCapsule_IsValid(obj, MAC_NAME)) {
        PyErr_SetString(PyExc_TypeError, "expected a MAC state (from mac_state)");
        return NULL;
    }
    return PyCapsule_GetPointer(obj, MAC_NAME);
}

static PyObject *
clink_mac_state(PyObject *module, PyObject *key)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len > INT_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "mac_state(): the key is too long");
        return NULL;
    }
    static const unsigned char empty[1] = {0}; /* a NULL key would mean "keep the last" */
    const unsigned char *bytes = view.len ? (const unsigned char *)view.buf : empty;
    HMAC_CTX *ctx = HMAC_CTX_new();
    int ok = ctx != NULL && HMAC_Init_ex(ctx, bytes, (int)view.len, EVP_sha256(), NULL);
    PyBuffer_Release(&view);
    if (!ok) {
        HMAC_CTX_free(ctx);
        return openssl_error("keying");
    }
    PyObject *capsule = PyCapsule_New(ctx, MAC_NAME, mac_free);
    if (capsule == NULL) {
        HMAC_CTX_free(ctx);
    }
    return capsule;
}

/* HMAC-SHA256 over the ``count`` pieces one after the other; 0 with an error set. */
static int
mac_pieces(HMAC_CTX *ctx, const unsigned char *const *pieces, const size_t *sizes,
           int count, unsigned char out[DIGEST_SIZE])
{
    if (!HMAC_Init_ex(ctx, NULL, 0, NULL, NULL)) { /* back to the key's state */
        openssl_error("init");
        return 0;
    }
    for (int i = 0; i < count; i++) {
        if (!HMAC_Update(ctx, pieces[i], sizes[i])) {
            openssl_error("update");
            return 0;
        }
    }
    unsigned int written = 0;
    if (!HMAC_Final(ctx, out, &written) || written != DIGEST_SIZE) {
        openssl_error("final");
        return 0;
    }
    return 1;
}

static PyObject *
clink_hmac(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "hmac() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    HMAC_CTX *ctx = get_mac(args[0]);
    if (ctx == NULL) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *piece = view.buf;
    size_t size = (size_t)view.len;
    unsigned char out[DIGEST_SIZE];
    int ok = mac_pieces(ctx, &piece, &size, 1, out);
    PyBuffer_Release(&view);
    return ok ? PyBytes_FromStringAndSize((const char *)out, DIGEST_SIZE) : NULL;
}

/* --- frames --------------------------------------------------------------------------- */

static inline uint64_t
le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

static inline void
put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* The arguments open_frame and seal_frame share after their first: max_length, state,
 * counter, first, second. -1 with an error set for wrong ones. */
static int
frame_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t *max_length,
           HMAC_CTX **mac, uint64_t *counter, uint64_t *first, uint64_t *second)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "%s() takes 6 arguments (%zd given)", fn, nargs);
        return -1;
    }
    *max_length = PyLong_AsSsize_t(args[1]);
    if (*max_length == -1 && PyErr_Occurred()) {
        return -1;
    }
    if ((*mac = get_mac(args[2])) == NULL) {
        return -1;
    }
    uint64_t *into[3] = {counter, first, second};
    for (int i = 0; i < 3; i++) {
        *into[i] = PyLong_AsUnsignedLongLong(args[3 + i]);
        if (*into[i] == (uint64_t)-1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* The tag of the frame at ``frame`` (its token at TOKEN_AT, its payload of ``payload_len``
 * bytes at HEADER_SIZE) as the ``counter``-th of its direction: HMAC-SHA256 over the
 * counter (u64, little-endian), the token's 16 bytes and the payload. 0 with an error. */
static int
frame_tag(HMAC_CTX *mac, uint64_t counter, const unsigned char *frame, size_t payload_len,
          unsigned char tag[DIGEST_SIZE])
{
    unsigned char counter_bytes[8];
    put_le64(counter_bytes, counter);
    const unsigned char *pieces[3] = {counter_bytes, frame + TOKEN_AT, frame + HEADER_SIZE};
    const size_t sizes[3] = {8, 16, payload_len};
    return mac_pieces(mac, pieces, sizes, 3, tag);
}

static PyObject *
clink_open_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_ssize_t max_length;
    HMAC_CTX *mac;
    uint64_t counter, first, second;
    if (frame_args("open_frame", args, nargs, &max_length, &mac, &counter, &first, &second) <
        0) {
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "open_frame(): expected bytes");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    if (n < HEADER_SIZE + TAG_SIZE) {
        Py_RETURN_NONE;
    }
    uint64_t length = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 |
                      (uint64_t)b[3] << 24;
    if (length + TOKEN_AT != (uint64_t)n || length < MIN_FRAME_LENGTH ||
        length > (uint64_t)max_length) {
        Py_RETURN_NONE;
    }
    if (le64(b + TOKEN_AT) != first || le64(b + TOKEN_AT + 8) != second) {
        Py_RETURN_NONE;
    }
    if (XXH3_64bits(b + TOKEN_AT, (size_t)(n - TOKEN_AT)) != le64(b + 4)) {
        Py_RETURN_NONE;
    }
    const unsigned char *payload = b + HEADER_SIZE;
    size_t payload_len = (size_t)(n - HEADER_SIZE - TAG_SIZE);
    unsigned char tag[DIGEST_SIZE];
    if (!frame_tag(mac, counter, b, payload_len, tag)) {
        return NULL;
    }
    if (CRYPTO_memcmp(tag, payload + payload_len, TAG_SIZE) != 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)payload_len);
}

static PyObject *
clink_seal_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_ssize_t max_length;
    HMAC_CTX *mac;
    uint64_t counter, first, second;
    if (frame_args("seal_frame", args, nargs, &max_length, &mac, &counter, &first, &second) <
        0) {
        return NULL;
    }
    if (!PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "seal_frame(): expected a tuple of parts");
        return NULL;
    }
    PyObject *parts = args[0];
    Py_ssize_t count = PyTuple_GET_SIZE(parts);
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyTuple_GET_ITEM(parts, i);
        if (!PyBytes_Check(part)) {
            Py_RETURN_NONE; /* views and the like: the Python path's */
        }
        size += PyBytes_GET_SIZE(part);
    }
    /* The frame's length (token, message, tag) within the limit; None: Python raises. */
    if (size > max_length - MIN_FRAME_LENGTH - TAG_SIZE) {
        Py_RETURN_NONE;
    }
    PyObject *frame = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + size + TAG_SIZE);
    if (frame == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
    uint64_t length = (uint64_t)(MIN_FRAME_LENGTH + size + TAG_SIZE);
    for (int i = 0; i < 4; i++) {
        out[i] = (unsigned char)(length >> (8 * i));
    }
    put_le64(out + TOKEN_AT, first);
    put_le64(out + TOKEN_AT + 8, second);
    unsigned char *p = out + HEADER_SIZE;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *part = PyTuple_GET_ITEM(parts, i);
        memcpy(p, PyBytes_AS_STRING(part), (size_t)PyBytes_GET_SIZE(part));
        p += PyBytes_GET_SIZE(part);
    }
    unsigned char tag[DIGEST_SIZE];
    if (!frame_tag(mac, counter, out, (size_t)size, tag)) {
        Py_DECREF(frame);
        return NULL;
    }
    memcpy(p, tag, TAG_SIZE);
    put_le64(out + 4, XXH3_64bits(out + TOKEN_AT, (size_t)length));
    return frame;
}

static PyMethodDef clink_methods[] = {
    {"mac_state", (PyCFunction)clink_mac_state, METH_O, "A keyed HMAC-SHA256 context."},
    {"hmac", (PyCFunction)(void (*)(void))clink_hmac, METH_FASTCALL, "HMAC-SHA256 of data."},
    {"open_frame", (PyCFunction)(void (*)(void))clink_open_frame, METH_FASTCALL,
     "The payload of one whole, checked link frame, or None."},
    {"seal_frame", (PyCFunction)(void (*)(void))clink_seal_frame, METH_FASTCALL,
     "A whole link frame for the parts, or None past the length limit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef clink_module = {
    PyModuleDef_HEAD_INIT,
    "ambrosia_py.coordinator._clink",
    "C twin of a link's per-frame work for small frames.",
    -1,
    clink_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__clink(void)
{
    return PyModule_Create(&clink_module);
}
