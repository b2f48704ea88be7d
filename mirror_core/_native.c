/*
 * mirror_core._native: the writer's inner produce loop in C (see mirror_core/native.py).
 *
 * At 100-byte records the Python loop around Producer.produce() is most of what a record costs: the
 * call's keyword parsing, the bytes slicing of the schema-id rewrite, a delivery report object and a
 * Python callback per record. This module hands a run of records to librdkafka's rd_kafka_producev()
 * from C, with the interpreter lock released while it does (the reader thread of the same process
 * runs meanwhile), and asks for no delivery report: the caller brackets every run with records that
 * do have one, and proves the run's offsets from theirs (native.py explains how).
 *
 * It calls the librdkafka that confluent-kafka already loaded (found with dlopen(RTLD_NOLOAD) on the
 * path native.py finds), through the producer handle of a confluent_kafka.Producer. The few librdkafka
 * declarations it needs are written out below (librdkafka's stable C ABI); nothing here is linked at
 * build time but libdl.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd_kafka_s rd_kafka_t;

/* rd_kafka_vtype_t, in librdkafka's order */
enum { VT_END = 0, VT_TOPIC = 1, VT_RKT = 2, VT_PARTITION = 3, VT_VALUE = 4, VT_KEY = 5, VT_OPAQUE = 6,
       VT_MSGFLAGS = 7, VT_TIMESTAMP = 8 };
#define MSG_F_COPY 0x2
#define ERR_QUEUE_FULL (-184)
#define RD_KAFKA_PRODUCER 0

typedef int (*producev_fn)(rd_kafka_t *, ...);
typedef int (*type_fn)(const rd_kafka_t *);
typedef const char *(*name_fn)(const rd_kafka_t *);
typedef const char *(*err2str_fn)(int);

static producev_fn rk_producev;
static type_fn rk_type;
static name_fn rk_name;
static err2str_fn rk_err2str;

/* confluent_kafka's Producer object: its librdkafka handle is the first member after the object header */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
} HandleHead;

/* what produce() returns in its status */
enum { DONE = 0, QUEUE_FULL = 1, NEEDS_PYTHON = 2 };

typedef struct {
    const char *v, *k;
    Py_ssize_t vlen, klen;
    int64_t ts;
    unsigned char vhead[5], khead[5];
    char vmapped, kmapped;
} Rec;

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
        PyErr_Format(PyExc_ImportError, "librdkafka not loaded from %s: %s", path, dlerror());
        return NULL;
    }
    rk_producev = (producev_fn)dlsym(lib, "rd_kafka_producev");
    rk_type = (type_fn)dlsym(lib, "rd_kafka_type");
    rk_name = (name_fn)dlsym(lib, "rd_kafka_name");
    rk_err2str = (err2str_fn)dlsym(lib, "rd_kafka_err2str");
    if (!rk_producev || !rk_type || !rk_name || !rk_err2str) {
        rk_producev = NULL;
        PyErr_Format(PyExc_ImportError, "%s lacks the librdkafka functions mirror_core._native calls", path);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The producer's librdkafka handle, or NULL (with an exception) if ``producer`` does not look like one. */
static rd_kafka_t *handle_of(PyObject *producer) {
    if (!rk_producev) {
        PyErr_SetString(PyExc_RuntimeError, "mirror_core._native.load() was not called");
        return NULL;
    }
    if (strcmp(Py_TYPE(producer)->tp_name, "cimpl.Producer") != 0) {
        PyErr_Format(PyExc_TypeError, "a confluent_kafka Producer is needed, not %s", Py_TYPE(producer)->tp_name);
        return NULL;
    }
    rd_kafka_t *rk = ((HandleHead *)producer)->rk;
    if (!rk) {
        PyErr_SetString(PyExc_RuntimeError, "the producer is closed");
        return NULL;
    }
    return rk;
}

/* name(producer) -> the librdkafka client name: lets the caller check the handle is the producer's own */
static PyObject *name(PyObject *self, PyObject *producer) {
    rd_kafka_t *rk = handle_of(producer);
    if (!rk)
        return NULL;
    if (rk_type(rk) != RD_KAFKA_PRODUCER) {
        PyErr_SetString(PyExc_TypeError, "the handle is not a producer's");
        return NULL;
    }
    return PyUnicode_FromString(rk_name(rk));
}

/* ``data`` as (pointer, length); 0 for None, -1 for anything but bytes */
static int buffer_of(PyObject *data, const char **p, Py_ssize_t *len) {
    if (data == Py_None) {
        *p = NULL;
        *len = 0;
        return 0;
    }
    if (!PyBytes_CheckExact(data))
        return -1;
    *p = PyBytes_AS_STRING(data);
    *len = PyBytes_GET_SIZE(data);
    return 0;
}

/* One side's (key or value) id map, bytes -> bytes of 5 each (NULL: no rewrite), and its last lookup: a
 * partition's records mostly share one schema. */
typedef struct {
    PyObject *map;
    unsigned char src[5], dst[5];
    int have;
} Mapper;

/* Map the id-framing prefix of ``p`` into ``head``: 1 mapped, 0 nothing to map (no map, or a null key or
 * value), -1 not mapped (too short, or an id not in the map), -2 error (exception set). */
static int map_head(Mapper *m, const char *p, Py_ssize_t len, unsigned char head[5]) {
    if (!m->map || !p)
        return 0;
    if (len < 5)
        return -1;
    if (m->have && memcmp(p, m->src, 5) == 0) {
        memcpy(head, m->dst, 5);
        return 1;
    }
    PyObject *src = PyBytes_FromStringAndSize(p, 5);
    if (!src)
        return -2;
    PyObject *dst = PyDict_GetItemWithError(m->map, src); /* borrowed */
    Py_DECREF(src);
    if (!dst)
        return PyErr_Occurred() ? -2 : -1;
    if (!PyBytes_CheckExact(dst) || PyBytes_GET_SIZE(dst) != 5)
        return -1;
    memcpy(head, PyBytes_AS_STRING(dst), 5);
    memcpy(m->src, p, 5);
    memcpy(m->dst, head, 5);
    m->have = 1;
    return 1;
}

/*
 * produce(producer, topic, partition, values, keys, timestamps, headers, start, stop, value_map, key_map,
 *         limit) -> (index, status, bytes)
 *
 * Produces records [start, stop) of the columns to ``topic``/``partition`` without delivery reports, until
 * one needs Python: a value or key not bytes or None, an id prefix not in ``value_map``/``key_map`` (None:
 * no rewrite), headers (``headers`` None: none at all), a key and value within 128 bytes of ``limit``
 * (negative: no limit), or a produce error. Returns the index reached, DONE (index == stop), QUEUE_FULL
 * (poll and call again from index) or NEEDS_PYTHON (record ``index`` goes the Python way), and the key and
 * value bytes produced.
 */
static PyObject *produce(PyObject *self, PyObject *args) {
    PyObject *producer, *values, *keys, *stamps, *headers, *vmap, *kmap;
    const char *topic;
    int partition;
    Py_ssize_t start, stop;
    long long limit;
    if (!PyArg_ParseTuple(args, "OsiO!O!O!OnnOOL", &producer, &topic, &partition, &PyList_Type, &values,
                          &PyList_Type, &keys, &PyList_Type, &stamps, &headers, &start, &stop, &vmap, &kmap,
                          &limit))
        return NULL;
    rd_kafka_t *rk = handle_of(producer);
    if (!rk)
        return NULL;
    if (headers != Py_None && !PyList_Check(headers)) {
        PyErr_SetString(PyExc_TypeError, "headers: a list or None");
        return NULL;
    }
    if ((vmap != Py_None && !PyDict_Check(vmap)) || (kmap != Py_None && !PyDict_Check(kmap))) {
        PyErr_SetString(PyExc_TypeError, "value_map, key_map: a dict or None");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (start < 0 || stop > n || PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(stamps) != n
            || (headers != Py_None && PyList_GET_SIZE(headers) != n)) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths, or a range outside them");
        return NULL;
    }
    if (stop <= start)
        return Py_BuildValue("(nin)", start, DONE, (Py_ssize_t)0);

    Rec *recs = malloc(sizeof(Rec) * (size_t)(stop - start));
    if (!recs)
        return PyErr_NoMemory();
    /* with the interpreter lock: every record's buffers, mapped heads and timestamp, up to the first
     * record that needs Python */
    Mapper vm = {vmap == Py_None ? NULL : vmap, {0}, {0}, 0}, km = {kmap == Py_None ? NULL : kmap, {0}, {0}, 0};
    int status = DONE;
    Py_ssize_t end = stop, i;
    Py_ssize_t widest = 0;
    for (i = start; i < stop; i++) {
        Rec *r = &recs[i - start];
        if (headers != Py_None) {
            PyObject *h = PyList_GET_ITEM(headers, i);
            if (h != Py_None && PyObject_IsTrue(h)) {
                status = NEEDS_PYTHON;
                break;
            }
        }
        if (buffer_of(PyList_GET_ITEM(values, i), &r->v, &r->vlen) < 0
                || buffer_of(PyList_GET_ITEM(keys, i), &r->k, &r->klen) < 0) {
            status = NEEDS_PYTHON;
            break;
        }
        int vmapped = map_head(&vm, r->v, r->vlen, r->vhead);
        int kmapped = vmapped < 0 ? 0 : map_head(&km, r->k, r->klen, r->khead);
        if (vmapped == -2 || kmapped == -2)
            goto fail;
        if (vmapped < 0 || kmapped < 0) {
            status = NEEDS_PYTHON;
            break;
        }
        r->vmapped = (char)vmapped;
        r->kmapped = (char)kmapped;
        if (limit >= 0 && r->klen + r->vlen + 128 > limit) {
            status = NEEDS_PYTHON;
            break;
        }
        r->ts = PyLong_AsLongLong(PyList_GET_ITEM(stamps, i));
        if (r->ts == -1 && PyErr_Occurred())
            goto fail;
        if (r->vmapped && r->vlen > widest)
            widest = r->vlen;
        if (r->kmapped && r->klen > widest)
            widest = r->klen;
    }
    end = i;

    /* without it: hand the records to librdkafka (it copies them) */
    Py_ssize_t bytes = 0;
    int err = 0;
    char *scratch = widest ? malloc((size_t)widest * 2) : NULL;
    if (widest && !scratch) {
        free(recs);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = start; i < end; i++) {
        Rec *r = &recs[i - start];
        const char *v = r->v, *k = r->k;
        if (r->vmapped) {
            memcpy(scratch, r->vhead, 5);
            memcpy(scratch + 5, r->v + 5, (size_t)r->vlen - 5);
            v = scratch;
        }
        if (r->kmapped) {
            char *kb = scratch + widest;
            memcpy(kb, r->khead, 5);
            memcpy(kb + 5, r->k + 5, (size_t)r->klen - 5);
            k = kb;
        }
        err = rk_producev(rk, VT_TOPIC, topic, VT_PARTITION, (int32_t)partition, VT_VALUE, (void *)v,
                          (size_t)r->vlen, VT_KEY, (const void *)k, (size_t)r->klen, VT_MSGFLAGS, MSG_F_COPY,
                          VT_TIMESTAMP, (int64_t)r->ts, VT_END);
        if (err)
            break;
        bytes += r->vlen + r->klen;
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    free(recs);
    if (err)
        status = err == ERR_QUEUE_FULL ? QUEUE_FULL : NEEDS_PYTHON;
    return Py_BuildValue("(nin)", i, status, bytes);

fail:
    free(recs);
    return NULL;
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(path): bind to the librdkafka loaded from path"},
    {"name", name, METH_O, "name(producer): the librdkafka client name behind a confluent_kafka Producer"},
    {"produce", produce, METH_VARARGS, "produce a run of records without delivery reports (see the source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mirror_core._native",
                                    "The writer's inner produce loop in C (see mirror_core/native.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
