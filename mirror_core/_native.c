/*
 * mirror_core._native: the writer's inner produce loop, and the direct reader's consume loop, in C (see
 * mirror_core/native.py).
 *
 * At 100-byte records the Python loop around Producer.produce() is most of what a record costs: the
 * call's keyword parsing, the bytes slicing of the schema-id rewrite, a delivery report object and a
 * Python callback per record. This module hands a run of records to librdkafka's rd_kafka_producev()
 * from C, with the interpreter lock released while it does (the reader thread of the same process
 * runs meanwhile), and asks for no delivery report: the caller brackets every run with records that
 * do have one, and proves the run's offsets from theirs (native.py explains how).
 *
 * On the read side the cost is a Message object per record and the Python calls that take its offset,
 * key, value, timestamp and headers apart again. consume() returns what Consumer.consume() would, as
 * columns: one list per field for each run of a partition's records.
 *
 * It calls the librdkafka that confluent-kafka already loaded (found with dlopen(RTLD_NOLOAD) on the
 * path native.py finds), through the handle of a confluent_kafka.Producer or Consumer. The few librdkafka
 * declarations it needs are written out below (librdkafka's stable C ABI); nothing here is linked at
 * build time but libdl.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;

typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;

/* rd_kafka_topic_partition_t and its list, as librdkafka lays them out */
typedef struct {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    int err;
    void *_private;
} TopicPartition;
typedef struct {
    int cnt;
    int size;
    TopicPartition *elems;
} TopicPartitionList;

/* rd_kafka_message_t, as librdkafka lays it out */
typedef struct {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} Message;

/* rd_kafka_vtype_t, in librdkafka's order */
enum { VT_END = 0, VT_TOPIC = 1, VT_RKT = 2, VT_PARTITION = 3, VT_VALUE = 4, VT_KEY = 5, VT_OPAQUE = 6,
       VT_MSGFLAGS = 7, VT_TIMESTAMP = 8 };
#define MSG_F_COPY 0x2
#define ERR_QUEUE_FULL (-184)
#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_CONSUMER 1

typedef int (*producev_fn)(rd_kafka_t *, ...);
typedef int (*type_fn)(const rd_kafka_t *);
typedef const char *(*name_fn)(const rd_kafka_t *);
typedef const char *(*err2str_fn)(int);

static producev_fn rk_producev;
static type_fn rk_type;
static name_fn rk_name;
static err2str_fn rk_err2str;
static const char *(*rk_err2name)(int);
static rd_kafka_queue_t *(*rk_queue_get_consumer)(rd_kafka_t *);
static void (*rk_queue_destroy)(rd_kafka_queue_t *);
static ssize_t (*rk_consume_batch_queue)(rd_kafka_queue_t *, int, Message **, size_t);
static void (*rk_message_destroy)(Message *);
static const char *(*rk_topic_name)(const rd_kafka_topic_t *);
static int64_t (*rk_message_timestamp)(const Message *, int *);
static int (*rk_message_headers)(const Message *, rd_kafka_headers_t **);
static size_t (*rk_header_cnt)(const rd_kafka_headers_t *);
static int (*rk_header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **, size_t *);
static rd_kafka_conf_t *(*rk_conf_new)(void);
static int (*rk_conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
static void (*rk_conf_destroy)(rd_kafka_conf_t *);
static void (*rk_conf_set_opaque)(rd_kafka_conf_t *, void *);
static void (*rk_conf_set_log_cb)(rd_kafka_conf_t *, void (*)(const rd_kafka_t *, int, const char *, const char *));
static void *(*rk_opaque)(const rd_kafka_t *);
static rd_kafka_t *(*rk_new)(int, rd_kafka_conf_t *, char *, size_t);
static int (*rk_poll_set_consumer)(rd_kafka_t *);
static int (*rk_consumer_close)(rd_kafka_t *);
static void (*rk_destroy)(rd_kafka_t *);
static TopicPartitionList *(*rk_tpl_new)(int);
static TopicPartition *(*rk_tpl_add)(TopicPartitionList *, const char *, int32_t);
static void (*rk_tpl_destroy)(TopicPartitionList *);
static rd_kafka_error_t *(*rk_incremental_assign)(rd_kafka_t *, const TopicPartitionList *);
static rd_kafka_error_t *(*rk_incremental_unassign)(rd_kafka_t *, const TopicPartitionList *);
static const char *(*rk_error_string)(const rd_kafka_error_t *);
static void (*rk_error_destroy)(rd_kafka_error_t *);
static int (*rk_pause_partitions)(rd_kafka_t *, TopicPartitionList *);
static int (*rk_resume_partitions)(rd_kafka_t *, TopicPartitionList *);
static int (*rk_assignment)(rd_kafka_t *, TopicPartitionList **);

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
    *(void **)&rk_err2name = dlsym(lib, "rd_kafka_err2name");
    *(void **)&rk_queue_get_consumer = dlsym(lib, "rd_kafka_queue_get_consumer");
    *(void **)&rk_queue_destroy = dlsym(lib, "rd_kafka_queue_destroy");
    *(void **)&rk_consume_batch_queue = dlsym(lib, "rd_kafka_consume_batch_queue");
    *(void **)&rk_message_destroy = dlsym(lib, "rd_kafka_message_destroy");
    *(void **)&rk_topic_name = dlsym(lib, "rd_kafka_topic_name");
    *(void **)&rk_message_timestamp = dlsym(lib, "rd_kafka_message_timestamp");
    *(void **)&rk_message_headers = dlsym(lib, "rd_kafka_message_headers");
    *(void **)&rk_header_cnt = dlsym(lib, "rd_kafka_header_cnt");
    *(void **)&rk_header_get_all = dlsym(lib, "rd_kafka_header_get_all");
    *(void **)&rk_conf_new = dlsym(lib, "rd_kafka_conf_new");
    *(void **)&rk_conf_set = dlsym(lib, "rd_kafka_conf_set");
    *(void **)&rk_conf_destroy = dlsym(lib, "rd_kafka_conf_destroy");
    *(void **)&rk_conf_set_opaque = dlsym(lib, "rd_kafka_conf_set_opaque");
    *(void **)&rk_conf_set_log_cb = dlsym(lib, "rd_kafka_conf_set_log_cb");
    *(void **)&rk_opaque = dlsym(lib, "rd_kafka_opaque");
    *(void **)&rk_new = dlsym(lib, "rd_kafka_new");
    *(void **)&rk_poll_set_consumer = dlsym(lib, "rd_kafka_poll_set_consumer");
    *(void **)&rk_consumer_close = dlsym(lib, "rd_kafka_consumer_close");
    *(void **)&rk_destroy = dlsym(lib, "rd_kafka_destroy");
    *(void **)&rk_tpl_new = dlsym(lib, "rd_kafka_topic_partition_list_new");
    *(void **)&rk_tpl_add = dlsym(lib, "rd_kafka_topic_partition_list_add");
    *(void **)&rk_tpl_destroy = dlsym(lib, "rd_kafka_topic_partition_list_destroy");
    *(void **)&rk_incremental_assign = dlsym(lib, "rd_kafka_incremental_assign");
    *(void **)&rk_incremental_unassign = dlsym(lib, "rd_kafka_incremental_unassign");
    *(void **)&rk_error_string = dlsym(lib, "rd_kafka_error_string");
    *(void **)&rk_error_destroy = dlsym(lib, "rd_kafka_error_destroy");
    *(void **)&rk_pause_partitions = dlsym(lib, "rd_kafka_pause_partitions");
    *(void **)&rk_resume_partitions = dlsym(lib, "rd_kafka_resume_partitions");
    *(void **)&rk_assignment = dlsym(lib, "rd_kafka_assignment");
    if (!rk_producev || !rk_type || !rk_name || !rk_err2str || !rk_err2name || !rk_queue_get_consumer
            || !rk_queue_destroy || !rk_consume_batch_queue || !rk_message_destroy || !rk_topic_name
            || !rk_message_timestamp || !rk_message_headers || !rk_header_cnt || !rk_header_get_all
            || !rk_conf_new || !rk_conf_set || !rk_conf_destroy || !rk_conf_set_opaque || !rk_conf_set_log_cb || !rk_opaque || !rk_new
            || !rk_poll_set_consumer || !rk_consumer_close || !rk_destroy || !rk_tpl_new || !rk_tpl_add || !rk_tpl_destroy || !rk_incremental_assign
            || !rk_incremental_unassign || !rk_error_string || !rk_error_destroy || !rk_pause_partitions || !rk_resume_partitions || !rk_assignment) {
        rk_producev = NULL;
        PyErr_Format(PyExc_ImportError, "%s lacks the librdkafka functions mirror_core._native calls", path);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The librdkafka handle of a confluent_kafka client of type ``kind`` ("Producer" or "Consumer"), or NULL
 * (with an exception) if ``client`` does not look like one. */
static rd_kafka_t *client_handle(PyObject *client, const char *kind, int type) {
    char want[32];
    if (!rk_producev) {
        PyErr_SetString(PyExc_RuntimeError, "mirror_core._native.load() was not called");
        return NULL;
    }
    snprintf(want, sizeof want, "cimpl.%s", kind);
    if (strcmp(Py_TYPE(client)->tp_name, want) != 0) {
        PyErr_Format(PyExc_TypeError, "a confluent_kafka %s is needed, not %s", kind, Py_TYPE(client)->tp_name);
        return NULL;
    }
    rd_kafka_t *rk = ((HandleHead *)client)->rk;
    if (!rk) {
        PyErr_Format(PyExc_RuntimeError, "the %s is closed", kind);
        return NULL;
    }
    if (rk_type(rk) != type) {
        PyErr_Format(PyExc_TypeError, "the handle is not a %s's", kind);
        return NULL;
    }
    return rk;
}

static rd_kafka_t *handle_of(PyObject *producer) { return client_handle(producer, "Producer", RD_KAFKA_PRODUCER); }

/* name(producer) -> the librdkafka client name: lets the caller check the handle is the producer's own */
static PyObject *name(PyObject *self, PyObject *producer) {
    rd_kafka_t *rk = handle_of(producer);
    if (!rk)
        return NULL;
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


/* A message's headers as a tuple of (name, value) pairs (value None for a null one); NULL with an exception */
static PyObject *headers_of(const Message *m) {
    rd_kafka_headers_t *hdrs = NULL;
    if (rk_message_headers(m, &hdrs) != 0 || !hdrs)
        return PyTuple_New(0);
    size_t cnt = rk_header_cnt(hdrs);
    PyObject *out = PyTuple_New((Py_ssize_t)cnt);
    if (!out)
        return NULL;
    for (size_t i = 0; i < cnt; i++) {
        const char *hname;
        const void *val;
        size_t size;
        if (rk_header_get_all(hdrs, i, &hname, &val, &size) != 0) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_RuntimeError, "a header librdkafka counted is not there");
            return NULL;
        }
        PyObject *v = val ? PyBytes_FromStringAndSize((const char *)val, (Py_ssize_t)size) : Py_NewRef(Py_None);
        PyObject *pair = v ? Py_BuildValue("(sN)", hname, v) : NULL;
        if (!pair) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, pair);
    }
    return out;
}

static PyObject *bytes_or_none(const void *p, size_t len) {
    return p ? PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)len) : Py_NewRef(Py_None);
}

/* One run of records of one partition, msgs[0..n), as (0, topic, partition, offsets, keys, values,
 * timestamps, headers or None) */
static PyObject *run_of(Message **msgs, Py_ssize_t n) {
    PyObject *offs = PyList_New(n), *keys = PyList_New(n), *vals = PyList_New(n), *stamps = PyList_New(n);
    PyObject *hdrs = NULL, *out = NULL;
    if (!offs || !keys || !vals || !stamps)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Message *m = msgs[i];
        int tstype;
        PyObject *o = PyLong_FromLongLong(m->offset), *k = bytes_or_none(m->key, m->key_len),
                 *v = bytes_or_none(m->payload, m->len),
                 *t = PyLong_FromLongLong(rk_message_timestamp(m, &tstype));
        PyList_SET_ITEM(offs, i, o);
        PyList_SET_ITEM(keys, i, k);
        PyList_SET_ITEM(vals, i, v);
        PyList_SET_ITEM(stamps, i, t);
        if (!o || !k || !v || !t)
            goto done;
        rd_kafka_headers_t *h = NULL;
        if (!hdrs && rk_message_headers(m, &h) == 0 && h && rk_header_cnt(h) > 0) {
            /* the first record with headers: the run gets a headers column, () for the records before */
            if (!(hdrs = PyList_New(n)))
                goto done;
            for (Py_ssize_t j = 0; j < n; j++) {
                PyObject *none = PyTuple_New(0);
                if (!none)
                    goto done;
                PyList_SET_ITEM(hdrs, j, none);
            }
        }
        if (hdrs) {
            PyObject *tuple = headers_of(m);
            if (!tuple || PyList_SetItem(hdrs, i, tuple) < 0)
                goto done;
        }
    }
    out = Py_BuildValue("(isiOOOOO)", 0, rk_topic_name(msgs[0]->rkt), (int)msgs[0]->partition, offs, keys, vals,
                        stamps, hdrs ? hdrs : Py_None);
done:
    Py_XDECREF(offs);
    Py_XDECREF(keys);
    Py_XDECREF(vals);
    Py_XDECREF(stamps);
    Py_XDECREF(hdrs);
    return out;
}

/* An event (an error or a partition's end) as (1, topic or None, partition, offset, code, name, text) */
static PyObject *event_of(const Message *m) {
    PyObject *text = m->payload ? PyUnicode_DecodeUTF8((const char *)m->payload, (Py_ssize_t)m->len, "replace")
                                : PyUnicode_FromString(rk_err2str(m->err));
    if (!text)
        return NULL;
    if (m->rkt)
        return Py_BuildValue("(isiLisN)", 1, rk_topic_name(m->rkt), (int)m->partition, (long long)m->offset,
                             m->err, rk_err2name(m->err), text);
    return Py_BuildValue("(iOiLisN)", 1, Py_None, (int)m->partition, (long long)m->offset, m->err,
                         rk_err2name(m->err), text);
}

/*
 * Reader: a librdkafka consumer of this module's own, for the direct reader (mirror_core/direct.py).
 *
 * Not a confluent_kafka.Consumer: confluent-kafka registers its error and throttle callbacks on every client
 * it makes, and librdkafka calls them inside whichever call serves the consumer's queue; called from here,
 * outside confluent-kafka's own calls, they abort the process. This consumer has no callback but a log
 * callback that only copies the line into a small buffer (Python takes the lines with logs()), so every
 * other event reaches consume() as an event. It is assigned partitions, never subscribed, and never commits.
 */

#define LOG_LINES 64

typedef struct {
    int level;
    char fac[32];
    char text[480];
} LogLine;

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    pthread_mutex_t lock;
    LogLine lines[LOG_LINES];
    int nlines;
    long dropped;
} Reader;

static void reader_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    Reader *r = rk_opaque(rk);
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    if (r->nlines < LOG_LINES) {
        LogLine *l = &r->lines[r->nlines++];
        l->level = level;
        snprintf(l->fac, sizeof l->fac, "%s", fac);
        snprintf(l->text, sizeof l->text, "%s", buf);
    } else {
        r->dropped++;
    }
    pthread_mutex_unlock(&r->lock);
}

/* Reader(config): config a list of (name, value) strings, librdkafka's consumer properties */
static int reader_init(Reader *self, PyObject *args, PyObject *kwargs) {
    PyObject *props;
    char errstr[512];
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &props))
        return -1;
    if (!rk_producev) {
        PyErr_SetString(PyExc_RuntimeError, "mirror_core._native.load() was not called");
        return -1;
    }
    if (self->rk) {
        PyErr_SetString(PyExc_RuntimeError, "a Reader is made once");
        return -1;
    }
    rd_kafka_conf_t *conf = rk_conf_new();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(props); i++) {
        const char *name, *value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(props, i), "ss", &name, &value)) {
            rk_conf_destroy(conf);
            return -1;
        }
        if (rk_conf_set(conf, name, value, errstr, sizeof errstr) != 0) {
            rk_conf_destroy(conf);
            /* librdkafka's own text may quote the value, which may be a secret */
            PyErr_Format(PyExc_ValueError, "librdkafka refused the consumer property %s", name);
            return -1;
        }
    }
    rk_conf_set_opaque(conf, self);
    rk_conf_set_log_cb(conf, reader_log);
    rd_kafka_t *rk = rk_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
    if (!rk) {
        rk_conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "%s", errstr);
        return -1;
    }
    rk_poll_set_consumer(rk);
    self->queue = rk_queue_get_consumer(rk);
    self->rk = rk;
    return 0;
}

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    Reader *self = (Reader *)type->tp_alloc(type, 0);
    if (self)
        pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

static void reader_shut(Reader *self) {
    rd_kafka_t *rk = self->rk;
    rd_kafka_queue_t *q = self->queue;
    self->rk = NULL;
    self->queue = NULL;
    if (!rk)
        return;
    Py_BEGIN_ALLOW_THREADS
    rk_consumer_close(rk);
    if (q)
        rk_queue_destroy(q);
    rk_destroy(rk);
    Py_END_ALLOW_THREADS
}

static void reader_dealloc(Reader *self) {
    reader_shut(self);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static rd_kafka_t *reader_rk(Reader *self) {
    if (!self->rk)
        PyErr_SetString(PyExc_RuntimeError, "the reader is closed");
    return self->rk;
}

/* a list of (topic, partition[, offset]) as librdkafka's list */
static TopicPartitionList *tpl_of(PyObject *parts) {
    if (!PyList_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "partitions: a list of (topic, partition[, offset])");
        return NULL;
    }
    TopicPartitionList *l = rk_tpl_new((int)PyList_GET_SIZE(parts));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parts); i++) {
        const char *topic;
        int partition;
        long long offset = -1001; /* RD_KAFKA_OFFSET_INVALID: where the consumer stands */
        if (!PyArg_ParseTuple(PyList_GET_ITEM(parts, i), "si|L", &topic, &partition, &offset)) {
            rk_tpl_destroy(l);
            return NULL;
        }
        rk_tpl_add(l, topic, partition)->offset = offset;
    }
    return l;
}

static PyObject *reader_assign_or_not(Reader *self, PyObject *parts, int assign) {
    rd_kafka_t *rk = reader_rk(self);
    if (!rk)
        return NULL;
    TopicPartitionList *l = tpl_of(parts);
    if (!l)
        return NULL;
    rd_kafka_error_t *err = (assign ? rk_incremental_assign : rk_incremental_unassign)(rk, l);
    rk_tpl_destroy(l);
    if (err) {
        PyErr_Format(PyExc_RuntimeError, "%s", rk_error_string(err));
        rk_error_destroy(err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *reader_assign(Reader *self, PyObject *parts) { return reader_assign_or_not(self, parts, 1); }
static PyObject *reader_unassign(Reader *self, PyObject *parts) { return reader_assign_or_not(self, parts, 0); }

static PyObject *reader_pause_or_resume(Reader *self, PyObject *parts, int pause) {
    rd_kafka_t *rk = reader_rk(self);
    if (!rk)
        return NULL;
    TopicPartitionList *l = tpl_of(parts);
    if (!l)
        return NULL;
    int err = (pause ? rk_pause_partitions : rk_resume_partitions)(rk, l);
    rk_tpl_destroy(l);
    if (err) {
        PyErr_Format(PyExc_RuntimeError, "%s", rk_err2str(err));
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *reader_pause(Reader *self, PyObject *parts) { return reader_pause_or_resume(self, parts, 1); }
static PyObject *reader_resume(Reader *self, PyObject *parts) { return reader_pause_or_resume(self, parts, 0); }

static PyObject *reader_assignment(Reader *self, PyObject *unused) {
    rd_kafka_t *rk = reader_rk(self);
    if (!rk)
        return NULL;
    TopicPartitionList *l = NULL;
    int err = rk_assignment(rk, &l);
    if (err) {
        PyErr_Format(PyExc_RuntimeError, "%s", rk_err2str(err));
        return NULL;
    }
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < l->cnt; i++) {
        PyObject *tp = Py_BuildValue("(si)", l->elems[i].topic, (int)l->elems[i].partition);
        if (!tp || PyList_Append(out, tp) < 0)
            Py_CLEAR(out);
        Py_XDECREF(tp);
    }
    rk_tpl_destroy(l);
    return out;
}

/* logs() -> ([(syslog level, facility, text)], lines dropped since the last call) */
static PyObject *reader_logs(Reader *self, PyObject *unused) {
    LogLine lines[LOG_LINES];
    int n;
    long dropped;
    pthread_mutex_lock(&self->lock);
    n = self->nlines;
    memcpy(lines, self->lines, sizeof(LogLine) * (size_t)n);
    dropped = self->dropped;
    self->nlines = 0;
    self->dropped = 0;
    pthread_mutex_unlock(&self->lock);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        PyObject *line = Py_BuildValue("(isN)", lines[i].level, lines[i].fac,
                                       PyUnicode_DecodeUTF8(lines[i].text, (Py_ssize_t)strlen(lines[i].text), "replace"));
        if (!line)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, line);
    }
    return out ? Py_BuildValue("(Nl)", out, dropped) : NULL;
}

/*
 * consume(count, timeout_ms) -> list
 *
 * What Consumer.consume(count, timeout) returns, column by column instead of one Message object per
 * record: each run of records of one partition as (0, topic, partition, offsets, keys, values, timestamps,
 * headers), headers None when none of the run's records has any (else a tuple of (name, value) pairs per
 * record), and each error or end-of-partition event as (1, topic or None, partition, offset, code, name,
 * text), in the order librdkafka returned them.
 */
static PyObject *reader_consume(Reader *self, PyObject *args) {
    Py_ssize_t count;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &count, &timeout_ms))
        return NULL;
    if (!reader_rk(self))
        return NULL;
    if (count < 1 || count > 1000000) {
        PyErr_SetString(PyExc_ValueError, "count: 1 to 1,000,000");
        return NULL;
    }
    Message **msgs = malloc(sizeof(Message *) * (size_t)count);
    if (!msgs)
        return PyErr_NoMemory();
    ssize_t n;
    rd_kafka_queue_t *q = self->queue;
    Py_BEGIN_ALLOW_THREADS
    n = rk_consume_batch_queue(q, timeout_ms, msgs, (size_t)count);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        free(msgs);
        PyErr_SetString(PyExc_RuntimeError, "librdkafka could not consume from the consumer's queue");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    ssize_t i = 0;
    while (out && i < n) {
        PyObject *item;
        ssize_t j = i + 1;
        if (msgs[i]->err) {
            item = event_of(msgs[i]);
        } else {
            while (j < n && !msgs[j]->err && msgs[j]->rkt == msgs[i]->rkt && msgs[j]->partition == msgs[i]->partition)
                j++;
            item = run_of(msgs + i, (Py_ssize_t)(j - i));
        }
        if (!item || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
        i = j;
    }
    for (i = 0; i < n; i++)
        rk_message_destroy(msgs[i]);
    free(msgs);
    return out;
}

static PyObject *reader_close(Reader *self, PyObject *unused) {
    reader_shut(self);
    Py_RETURN_NONE;
}

static PyMethodDef reader_methods[] = {
    {"assign", (PyCFunction)reader_assign, METH_O, "assign([(topic, partition, offset)]): add to the assignment"},
    {"unassign", (PyCFunction)reader_unassign, METH_O, "unassign([(topic, partition)]): take out of it"},
    {"pause", (PyCFunction)reader_pause, METH_O, "pause([(topic, partition)])"},
    {"resume", (PyCFunction)reader_resume, METH_O, "resume([(topic, partition)])"},
    {"assignment", (PyCFunction)reader_assignment, METH_NOARGS, "assignment() -> [(topic, partition)]"},
    {"consume", (PyCFunction)reader_consume, METH_VARARGS, "consume(count, timeout_ms): runs and events"},
    {"logs", (PyCFunction)reader_logs, METH_NOARGS, "logs() -> ([(level, facility, text)], dropped)"},
    {"close", (PyCFunction)reader_close, METH_NOARGS, "close the consumer (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mirror_core._native.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A librdkafka consumer whose records come as columns (see the source).",
    .tp_new = reader_new,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, "load(path): bind to the librdkafka loaded from path"},
    {"name", name, METH_O, "name(producer): the librdkafka client name behind a confluent_kafka Producer"},
    {"produce", produce, METH_VARARGS, "produce a run of records without delivery reports (see the source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "mirror_core._native",
                                    "The writer's inner produce loop in C (see mirror_core/native.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0)
        Py_CLEAR(m);
    return m;
}
