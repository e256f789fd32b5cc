/* The C twin of a link's per-frame work for small frames (the Python code stays the
 * reference): the flow frame (seed 004: u32 length | u64 XXH3-64 of token + message |
 * token | message) around a link message (payload | 16-byte tag, the tag HMAC-SHA256
 * over the frame's u64 counter, the token's 16 bytes and the payload, cut to 128 bits;
 * link_auth.LinkChannel).
 *
 * mac_state(key) -- HMAC-SHA256's two padded-key states for ``key`` (64 bytes: the inner
 *   then the outer SHA-256 state after one block), what the other calls take.
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
 *
 * init(xxh3_64_intdigest) -- called once at import: the checksum's function (xxhash's).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TAG_SIZE 16
#define HEADER_SIZE 28 /* u32 length, u64 checksum, u64 token first, u64 token second */
#define TOKEN_AT 12 /* the token; also the bytes before what the length counts */
#define MIN_FRAME_LENGTH 16

static PyObject *xxh3 = NULL; /* strong reference, set by init */

/* --- SHA-256 (FIPS 180-4), only what HMAC over a few buffers needs --------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static const uint32_t H256[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

typedef struct {
    uint32_t h[8];
    uint64_t total; /* bytes hashed so far */
    unsigned char block[64];
    size_t used; /* bytes in block */
} sha256;

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void
sha256_compress(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++) {
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    }
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) +
                      K256[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

static void
sha256_update(sha256 *s, const unsigned char *p, size_t n)
{
    s->total += n;
    if (s->used) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used < 64) {
            return;
        }
        sha256_compress(s->h, s->block);
        s->used = 0;
    }
    for (; n >= 64; p += 64, n -= 64) {
        sha256_compress(s->h, p);
    }
    memcpy(s->block, p, n);
    s->used = n;
}

static void
sha256_final(sha256 *s, unsigned char out[32])
{
    uint64_t bits = s->total * 8;
    unsigned char pad[72] = {0x80};
    size_t n = (s->used < 56 ? 56 : 120) - s->used;
    for (int i = 0; i < 8; i++) {
        pad[n + i] = (unsigned char)(bits >> (56 - 8 * i));
    }
    sha256_update(s, pad, n + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

/* --- HMAC-SHA256 from the two padded-key states ---------------------------------------- */

typedef struct {
    uint32_t inner[8];
    uint32_t outer[8];
} mac_states;

static void
hmac_start(sha256 *s, const uint32_t state[8])
{
    memcpy(s->h, state, sizeof s->h);
    s->total = 64; /* the padded key's block */
    s->used = 0;
}

static void
hmac_finish(const mac_states *m, sha256 *inner, unsigned char out[32])
{
    unsigned char digest[32];
    sha256_final(inner, digest);
    sha256 outer;
    hmac_start(&outer, m->outer);
    sha256_update(&outer, digest, 32);
    sha256_final(&outer, out);
}

/* The states of a ``mac_state`` bytes object; -1 with a TypeError for anything else. */
static int
get_states(PyObject *obj, mac_states *m)
{
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != (Py_ssize_t)sizeof *m) {
        PyErr_SetString(PyExc_TypeError, "expected a MAC state (mac_state's 64 bytes)");
        return -1;
    }
    memcpy(m, PyBytes_AS_STRING(obj), sizeof *m);
    return 0;
}

static PyObject *
clink_mac_state(PyObject *module, PyObject *key)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(key, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    unsigned char block[64] = {0};
    if (view.len > 64) { /* RFC 2104: a longer key is hashed first */
        sha256 s;
        memcpy(s.h, H256, sizeof s.h);
        s.total = 0;
        s.used = 0;
        sha256_update(&s, view.buf, (size_t)view.len);
        sha256_final(&s, block);
    }
    else {
        memcpy(block, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    mac_states m;
    unsigned char pad[64];
    for (int i = 0; i < 64; i++) {
        pad[i] = block[i] ^ 0x36;
    }
    memcpy(m.inner, H256, sizeof m.inner);
    sha256_compress(m.inner, pad);
    for (int i = 0; i < 64; i++) {
        pad[i] = block[i] ^ 0x5c;
    }
    memcpy(m.outer, H256, sizeof m.outer);
    sha256_compress(m.outer, pad);
    return PyBytes_FromStringAndSize((const char *)&m, sizeof m);
}

static PyObject *
clink_hmac(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "hmac() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    mac_states m;
    if (get_states(args[0], &m) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    sha256 s;
    hmac_start(&s, m.inner);
    sha256_update(&s, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    unsigned char out[32];
    hmac_finish(&m, &s, out);
    return PyBytes_FromStringAndSize((const char *)out, 32);
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

/* XXH3-64 (seed 0) of p[0:n], by xxhash's function; 0 with *ok = 0 when Python failed. */
static uint64_t
checksum(const unsigned char *p, Py_ssize_t n, int *ok)
{
    *ok = 0;
    PyObject *view = PyMemoryView_FromMemory((char *)p, n, PyBUF_READ);
    if (view == NULL) {
        return 0;
    }
    PyObject *value = PyObject_CallOneArg(xxh3, view);
    Py_DECREF(view);
    if (value == NULL) {
        return 0;
    }
    uint64_t sum = PyLong_AsUnsignedLongLong(value);
    Py_DECREF(value);
    if (sum == (uint64_t)-1 && PyErr_Occurred()) {
        return 0;
    }
    *ok = 1;
    return sum;
}

/* The arguments open_frame and seal_frame share after their first: max_length, state,
 * counter, first, second. -1 with an error set for wrong ones. */
static int
frame_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t *max_length,
           mac_states *m, uint64_t *counter, uint64_t *first, uint64_t *second)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "%s() takes 6 arguments (%zd given)", fn, nargs);
        return -1;
    }
    if (xxh3 == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s(): init() was not called", fn);
        return -1;
    }
    *max_length = PyLong_AsSsize_t(args[1]);
    if (*max_length == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (get_states(args[2], m) < 0) {
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
 * counter (u64, little-endian), the token's 16 bytes and the payload. */
static void
frame_tag(const mac_states *m, uint64_t counter, const unsigned char *frame, size_t payload_len,
          unsigned char tag[32])
{
    unsigned char counter_bytes[8];
    put_le64(counter_bytes, counter);
    sha256 s;
    hmac_start(&s, m->inner);
    sha256_update(&s, counter_bytes, 8);
    sha256_update(&s, frame + TOKEN_AT, 16);
    sha256_update(&s, frame + HEADER_SIZE, payload_len);
    hmac_finish(m, &s, tag);
}

/* Constant-time comparison of n bytes: 1 if equal. */
static int
same_bytes(const unsigned char *a, const unsigned char *b, size_t n)
{
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) {
        diff |= a[i] ^ b[i];
    }
    return diff == 0;
}

static PyObject *
clink_open_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_ssize_t max_length;
    mac_states m;
    uint64_t counter, first, second;
    if (frame_args("open_frame", args, nargs, &max_length, &m, &counter, &first, &second) < 0) {
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
    int ok;
    uint64_t sum = checksum(b + TOKEN_AT, n - TOKEN_AT, &ok);
    if (!ok) {
        return NULL;
    }
    if (sum != le64(b + 4)) {
        Py_RETURN_NONE;
    }
    const unsigned char *payload = b + HEADER_SIZE;
    size_t payload_len = (size_t)(n - HEADER_SIZE - TAG_SIZE);
    unsigned char tag[32];
    frame_tag(&m, counter, b, payload_len, tag);
    if (!same_bytes(tag, payload + payload_len, TAG_SIZE)) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)payload, (Py_ssize_t)payload_len);
}

static PyObject *
clink_seal_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    Py_ssize_t max_length;
    mac_states m;
    uint64_t counter, first, second;
    if (frame_args("seal_frame", args, nargs, &max_length, &m, &counter, &first, &second) < 0) {
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
    unsigned char tag[32];
    frame_tag(&m, counter, out, (size_t)size, tag);
    memcpy(p, tag, TAG_SIZE);
    int ok;
    uint64_t sum = checksum(out + TOKEN_AT, HEADER_SIZE - TOKEN_AT + size + TAG_SIZE, &ok);
    if (!ok) {
        Py_DECREF(frame);
        return NULL;
    }
    put_le64(out + 4, sum);
    return frame;
}

static PyObject *
clink_init(PyObject *module, PyObject *fn)
{
    (void)module;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "init(): expected the checksum function");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XSETREF(xxh3, fn);
    Py_RETURN_NONE;
}

static PyMethodDef clink_methods[] = {
    {"init", (PyCFunction)clink_init, METH_O, "Set the checksum's function (XXH3-64)."},
    {"mac_state", (PyCFunction)clink_mac_state, METH_O, "HMAC-SHA256's padded-key states."},
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
