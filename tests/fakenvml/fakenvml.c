/*
 * fakenvml: a test double for NVIDIA's libnvidia-ml.so.1.
 *
 * Build:  gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fakenvml.c -lpthread
 * Use:    put the directory holding the built library on LD_LIBRARY_PATH of the process that
 *         loads NVML (pynvml does CDLL("libnvidia-ml.so.1")) and point FAKENVML_SCENARIO at a
 *         scenario file. The format is described in README.md next to this file.
 *
 * The scenario file is re-read whenever it changes (inode, size or mtime differ), checked on
 * every call. nvmlEventSetWait_v2 sleeps on inotify (the directory of the scenario file), so an
 * event appended by a running test is delivered within milliseconds, independent of the wait's
 * timeout. Events are identified by their position among the `event` lines: the Nth event line is
 * delivered once; append new events, do not reorder or remove old ones.
 *
 * Every entry point is thread-safe (one mutex; the wait blocks outside it).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_LINKS 36
#define NVLINK_COUNTERS 5
#define MAX_FAILS 32
#define MAX_EVENTS 4096
#define FN_LEN 64

#define EVENT_XID 0x8ULL
#define DEFAULT_SUPPORTED_EVENTS 0xE9FULL /* SBE DBE PState Xid Clock PowerSource SBEStorm Dram* */
#define TEMPERATURE_V1 0x100000CU

static const struct {
    const char *name;
    int code;
    const char *text;
} ERRORS[] = {
    {"SUCCESS", NVML_SUCCESS, "Success"},
    {"UNINITIALIZED", NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {"INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {"NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {"NO_PERMISSION", NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {"ALREADY_INITIALIZED", NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"},
    {"NOT_FOUND", NVML_ERROR_NOT_FOUND, "Not Found"},
    {"INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {"INSUFFICIENT_POWER", NVML_ERROR_INSUFFICIENT_POWER, "Insufficient External Power"},
    {"DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {"TIMEOUT", NVML_ERROR_TIMEOUT, "Timeout"},
    {"IRQ_ISSUE", NVML_ERROR_IRQ_ISSUE, "Interrupt Request Issue"},
    {"LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {"CORRUPTED_INFOROM", NVML_ERROR_CORRUPTED_INFOROM, "Corrupted infoROM"},
    {"GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {"RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED, "GPU requires restart"},
    {"OPERATING_SYSTEM", NVML_ERROR_OPERATING_SYSTEM,
     "The operating system has blocked the request."},
    {"LIB_RM_VERSION_MISMATCH", NVML_ERROR_LIB_RM_VERSION_MISMATCH,
     "RM has detected an NVML/RM version mismatch."},
    {"IN_USE", NVML_ERROR_IN_USE, "In use"},
    {"MEMORY", NVML_ERROR_MEMORY, "Insufficient Memory"},
    {"NO_DATA", NVML_ERROR_NO_DATA, "No data"},
    {"ARGUMENT_VERSION_MISMATCH", NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
     "Argument version mismatch"},
    {"UNKNOWN", NVML_ERROR_UNKNOWN, "Unknown Error"},
};

struct fail {
    char fn[FN_LEN];
    int code;
};

struct gpu_cfg {
    char uuid[96], serial[32], name[96], pci[32];
    int lost;
    unsigned long long ecc[2][2]; /* [corrected=0|uncorrected=1][volatile=0|aggregate=1] */
    unsigned retired[2];          /* pages retired for cause 0 (multiple SBE) and 1 (DBE) */
    int retired_pending;
    unsigned remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned nvlinks;
    unsigned char link_down[MAX_LINKS];
    unsigned long long link_err[MAX_LINKS][NVLINK_COUNTERS];
    unsigned pcie_replay;
    int temperature;
    unsigned power_mw;
    unsigned long long clocks_reasons;
    unsigned long long supported_events;
    struct fail fails[MAX_FAILS];
    int nfails;
};

struct event_cfg {
    int gpu;
    int lost; /* the wait returns NVML_ERROR_GPU_IS_LOST instead of an event */
    unsigned long long type, data;
    unsigned delay_ms;
};

struct scenario {
    char driver[80];
    int init_error;
    int gpu_count;
    struct fail fails[MAX_FAILS];
    int nfails;
    struct gpu_cfg gpus[MAX_GPUS];
    struct event_cfg events[MAX_EVENTS];
    int nevents;
};

struct fake_device {
    int index;
};

struct fake_event_set {
    unsigned long long mask[MAX_GPUS];
    int ifd;
};

typedef struct fake_device *nvmlDevice_t;
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct scenario cur, next;
static struct fake_device devices[MAX_GPUS];
static int loaded;
static struct stat loaded_st;
static int init_refcount;
static int delivered;  /* events consumed so far (delivered or dropped) */
static int seen_count; /* events whose arrival time is recorded in seen_at */
static double seen_at[MAX_EVENTS];
static double last_delivered_at;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fakenvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void trace(const char *fn) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *v = getenv("FAKENVML_TRACE");
        enabled = v != NULL && *v != '\0' && strcmp(v, "0") != 0;
    }
    if (enabled) warn("call %s", fn);
}

static void gpu_defaults(struct gpu_cfg *g, int i) {
    memset(g, 0, sizeof *g);
    snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e%04x-0000-4000-8000-%012x", i, i);
    snprintf(g->serial, sizeof g->serial, "1650%09d", 100 + i);
    snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
    snprintf(g->pci, sizeof g->pci, "00000000:%02X:00.0", (0x18 + 0x10 * i) & 0xff);
    g->nvlinks = 18;
    g->temperature = 40;
    g->power_mw = 100000;
    g->supported_events = DEFAULT_SUPPORTED_EVENTS;
}

static void scenario_defaults(struct scenario *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->driver, sizeof s->driver, "550.54.15");
    s->gpu_count = -1;
    for (int i = 0; i < MAX_GPUS; i++) gpu_defaults(&s->gpus[i], i);
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

static int parse_u64(const char *v, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno != 0 || end == v || *trim(end) != '\0') return -1;
    *out = x;
    return 0;
}

static int parse_uint(const char *v, unsigned *out) {
    unsigned long long x;
    if (parse_u64(v, &x) != 0 || x > 0xffffffffULL) return -1;
    *out = (unsigned)x;
    return 0;
}

static int parse_int(const char *v, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 0);
    if (errno != 0 || end == v || *trim(end) != '\0') return -1;
    *out = (int)x;
    return 0;
}

static int parse_code(const char *v, int *out) {
    if (strncmp(v, "NVML_ERROR_", 11) == 0) v += 11;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (strcmp(v, ERRORS[i].name) == 0) {
            *out = ERRORS[i].code;
            return 0;
        }
    }
    return parse_int(v, out);
}

static int add_fail(struct fail *fails, int *n, const char *fn, const char *v) {
    int code;
    if (parse_code(v, &code) != 0 || strlen(fn) >= FN_LEN) return -1;
    for (int i = 0; i < *n; i++) {
        if (strcmp(fails[i].fn, fn) == 0) {
            fails[i].code = code;
            return 0;
        }
    }
    if (*n >= MAX_FAILS) return -1;
    snprintf(fails[*n].fn, FN_LEN, "%s", fn);
    fails[*n].code = code;
    (*n)++;
    return 0;
}

static int find_fail(const struct fail *fails, int n, const char *fn) {
    for (int i = 0; i < n; i++)
        if (strcmp(fails[i].fn, fn) == 0) return fails[i].code;
    return NVML_SUCCESS;
}

static const char *const NVLINK_COUNTER_NAMES[NVLINK_COUNTERS] = {
    "replay", "recovery", "crc_flit", "crc_data", "ecc_data"};

static int set_gpu_key(struct gpu_cfg *g, const char *k, const char *v) {
    unsigned long long *ecc = NULL;
    if (strcmp(k, "uuid") == 0) return snprintf(g->uuid, sizeof g->uuid, "%s", v) < 0;
    if (strcmp(k, "serial") == 0) return snprintf(g->serial, sizeof g->serial, "%s", v) < 0;
    if (strcmp(k, "name") == 0) return snprintf(g->name, sizeof g->name, "%s", v) < 0;
    if (strcmp(k, "pci") == 0) return snprintf(g->pci, sizeof g->pci, "%s", v) < 0;
    if (strcmp(k, "lost") == 0) return parse_int(v, &g->lost);
    if (strncmp(k, "fail.", 5) == 0) return add_fail(g->fails, &g->nfails, k + 5, v);
    if (strcmp(k, "ecc.volatile.corrected") == 0) ecc = &g->ecc[0][0];
    if (strcmp(k, "ecc.aggregate.corrected") == 0) ecc = &g->ecc[0][1];
    if (strcmp(k, "ecc.volatile.uncorrected") == 0) ecc = &g->ecc[1][0];
    if (strcmp(k, "ecc.aggregate.uncorrected") == 0) ecc = &g->ecc[1][1];
    if (ecc != NULL) return parse_u64(v, ecc);
    if (strcmp(k, "retired.sbe") == 0) return parse_uint(v, &g->retired[0]);
    if (strcmp(k, "retired.dbe") == 0) return parse_uint(v, &g->retired[1]);
    if (strcmp(k, "retired.pending") == 0) return parse_int(v, &g->retired_pending);
    if (strcmp(k, "remap.correctable") == 0) return parse_uint(v, &g->remap_corr);
    if (strcmp(k, "remap.uncorrectable") == 0) return parse_uint(v, &g->remap_unc);
    if (strcmp(k, "remap.pending") == 0) return parse_uint(v, &g->remap_pending);
    if (strcmp(k, "remap.failure") == 0) return parse_uint(v, &g->remap_failure);
    if (strcmp(k, "pcie.replay") == 0) return parse_uint(v, &g->pcie_replay);
    if (strcmp(k, "temperature") == 0) return parse_int(v, &g->temperature);
    if (strcmp(k, "power_mw") == 0) return parse_uint(v, &g->power_mw);
    if (strcmp(k, "clocks_event_reasons") == 0) return parse_u64(v, &g->clocks_reasons);
    if (strcmp(k, "supported_events") == 0) return parse_u64(v, &g->supported_events);
    if (strcmp(k, "nvlink.links") == 0) {
        if (parse_uint(v, &g->nvlinks) != 0 || g->nvlinks > MAX_LINKS) return -1;
        return 0;
    }
    if (strncmp(k, "nvlink.", 7) == 0) {
        char *end;
        unsigned long link = strtoul(k + 7, &end, 10);
        if (end == k + 7 || *end != '.' || link >= MAX_LINKS) return -1;
        const char *what = end + 1;
        if (strcmp(what, "active") == 0) {
            int active;
            if (parse_int(v, &active) != 0) return -1;
            g->link_down[link] = active == 0;
            return 0;
        }
        for (int c = 0; c < NVLINK_COUNTERS; c++)
            if (strcmp(what, NVLINK_COUNTER_NAMES[c]) == 0)
                return parse_u64(v, &g->link_err[link][c]);
        return -1;
    }
    return -1;
}

/* event <gpu> <xid|lost> [<delay_ms> [<event type mask>]] */
static int parse_event(struct scenario *s, char *v) {
    if (s->nevents >= MAX_EVENTS) return -1;
    struct event_cfg *e = &s->events[s->nevents];
    memset(e, 0, sizeof *e);
    e->type = EVENT_XID;
    char *save = NULL;
    char *tok[4] = {0};
    int n = 0;
    for (char *t = strtok_r(v, " \t", &save); t != NULL; t = strtok_r(NULL, " \t", &save)) {
        if (n == 4) return -1;
        tok[n++] = t;
    }
    if (n < 2 || parse_int(tok[0], &e->gpu) != 0 || e->gpu < 0 || e->gpu >= MAX_GPUS) return -1;
    if (strcmp(tok[1], "lost") == 0) {
        e->lost = 1;
    } else if (parse_u64(tok[1], &e->data) != 0) {
        return -1;
    }
    if (n > 2 && parse_uint(tok[2], &e->delay_ms) != 0) return -1;
    if (n > 3 && parse_u64(tok[3], &e->type) != 0) return -1;
    s->nevents++;
    return 0;
}

static int parse_line(struct scenario *s, char *key, char *v) {
    if (strcmp(key, "driver") == 0) return snprintf(s->driver, sizeof s->driver, "%s", v) < 0;
    if (strcmp(key, "init.error") == 0) return parse_code(v, &s->init_error);
    if (strcmp(key, "gpus") == 0) {
        if (parse_int(v, &s->gpu_count) != 0 || s->gpu_count < 0 || s->gpu_count > MAX_GPUS)
            return -1;
        return 0;
    }
    if (strncmp(key, "fail.", 5) == 0) return add_fail(s->fails, &s->nfails, key + 5, v);
    if (strcmp(key, "event") == 0) return parse_event(s, v);
    if (strncmp(key, "gpu.", 4) == 0) {
        char *end;
        unsigned long i = strtoul(key + 4, &end, 10);
        if (end == key + 4 || *end != '.' || i >= MAX_GPUS) return -1;
        return set_gpu_key(&s->gpus[i], end + 1, v);
    }
    return -1;
}

/* Parse `path` into `next`; 0 on success. Bad lines are reported on stderr and skipped. */
static int parse_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    scenario_defaults(&next);
    int max_index = -1;
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        for (char *c = line; *c != '\0'; c++) { /* `#` at the start or after a blank: comment */
            if (*c == '#' && (c == line || isspace((unsigned char)c[-1]))) {
                *c = '\0';
                break;
            }
        }
        char *s = trim(line);
        if (*s == '\0') continue;
        char *v = s;
        while (*v != '\0' && !isspace((unsigned char)*v)) v++;
        if (*v != '\0') *v++ = '\0';
        v = trim(v);
        if (parse_line(&next, s, v) != 0) {
            warn("%s:%d: cannot use `%s %s`", path, lineno, s, v);
            continue;
        }
        if (strncmp(s, "gpu.", 4) == 0) {
            int i = (int)strtoul(s + 4, NULL, 10);
            if (i > max_index) max_index = i;
        }
    }
    free(line);
    fclose(f);
    if (next.gpu_count < 0) next.gpu_count = max_index >= 0 ? max_index + 1 : 1;
    return 0;
}

/* With the mutex held: make `cur` reflect the scenario file. */
static void reload_locked(void) {
    const char *path = getenv("FAKENVML_SCENARIO");
    struct stat st;
    if (path == NULL || *path == '\0' || stat(path, &st) != 0) {
        if (!loaded) {
            if (path != NULL && *path != '\0') warn("%s: %s", path, strerror(errno));
            scenario_defaults(&cur);
            cur.gpu_count = 1;
            loaded = 1;
        }
        return;
    }
    if (loaded && st.st_ino == loaded_st.st_ino && st.st_dev == loaded_st.st_dev &&
        st.st_size == loaded_st.st_size && st.st_mtim.tv_sec == loaded_st.st_mtim.tv_sec &&
        st.st_mtim.tv_nsec == loaded_st.st_mtim.tv_nsec)
        return;
    if (parse_file(path) != 0) {
        warn("%s: %s", path, strerror(errno));
        if (!loaded) {
            scenario_defaults(&cur);
            cur.gpu_count = 1;
            loaded = 1;
        }
        return;
    }
    memcpy(&cur, &next, sizeof cur);
    loaded_st = st;
    loaded = 1;
    double now = now_ms();
    for (; seen_count < cur.nevents; seen_count++) seen_at[seen_count] = now;
}

static int enter_locked(const char *fn) {
    trace(fn);
    reload_locked();
    if (init_refcount <= 0) return NVML_ERROR_UNINITIALIZED;
    return find_fail(cur.fails, cur.nfails, fn);
}

static int device_index(nvmlDevice_t dev) {
    if (dev < &devices[0] || dev >= &devices[MAX_GPUS]) return -1;
    int i = (int)(dev - &devices[0]);
    return i < cur.gpu_count ? i : -1;
}

/* Common prologue of the per-device calls; takes the mutex, returns with it held on success. */
static int device_enter(nvmlDevice_t dev, const char *fn, struct gpu_cfg **g) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(fn);
    if (rc == NVML_SUCCESS) {
        int i = device_index(dev);
        if (i < 0) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *g = &cur.gpus[i];
            rc = find_fail((*g)->fails, (*g)->nfails, fn);
            if (rc == NVML_SUCCESS && (*g)->lost) rc = NVML_ERROR_GPU_IS_LOST;
        }
    }
    if (rc != NVML_SUCCESS) pthread_mutex_unlock(&mu);
    return rc;
}

#define DEVICE_CALL(dev, g)                              \
    struct gpu_cfg *g = NULL;                            \
    do {                                                 \
        int rc_ = device_enter((dev), __func__, &g);     \
        if (rc_ != NVML_SUCCESS) return rc_;             \
    } while (0)

#define DONE(rc)                        \
    do {                                \
        pthread_mutex_unlock(&mu);      \
        return (rc);                    \
    } while (0)

static int copy_string(char *dst, unsigned len, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------------------------------- */
/* init, shutdown, errors, system                                                           */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&mu);
    trace(__func__);
    const char *path = getenv("FAKENVML_SCENARIO");
    reload_locked();
    if (path != NULL && *path != '\0' && access(path, R_OK) != 0) DONE(NVML_ERROR_UNKNOWN);
    if (cur.init_error != NVML_SUCCESS) DONE(cur.init_error);
    int rc = find_fail(cur.fails, cur.nfails, "nvmlInitWithFlags");
    if (rc != NVML_SUCCESS) DONE(rc);
    init_refcount++;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    init_refcount--;
    DONE(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == result) return ERRORS[i].text;
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    DONE(copy_string(version, length, cur.driver));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    DONE(copy_string(version, length, "12.550.54.15"));
}

/* ---------------------------------------------------------------------------------------- */
/* enumeration and identity                                                                 */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    if (count == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)cur.gpu_count;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device, const char *fn) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(fn);
    if (rc != NVML_SUCCESS) DONE(rc);
    if (device == NULL || index >= (unsigned)cur.gpu_count) DONE(NVML_ERROR_INVALID_ARGUMENT);
    rc = find_fail(cur.gpus[index].fails, cur.gpus[index].nfails, fn);
    if (rc != NVML_SUCCESS) DONE(rc);
    devices[index].index = (int)index;
    *device = &devices[index];
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index(index, device, __func__);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    if (uuid == NULL || device == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < cur.gpu_count; i++) {
        if (strcmp(cur.gpus[i].uuid, uuid) == 0) {
            devices[i].index = i;
            *device = &devices[i];
            DONE(NVML_SUCCESS);
        }
    }
    DONE(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEVICE_CALL(device, g);
    if (index == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)(g - &cur.gpus[0]);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL(device, g);
    DONE(copy_string(uuid, length, g->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    DEVICE_CALL(device, g);
    DONE(copy_string(serial, length, g->serial));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device, g);
    DONE(copy_string(name, length, g->name));
}

static void fill_pci(const struct gpu_cfg *g, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->pci, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xffff,
             bus, dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010DE; /* H100 SXM */
    pci->pciSubSystemId = 0x16C110DE;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(device, g);
    if (pci == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(g, pci);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(device, g);
    if (pci == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(g, pci);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE_CALL(device, g);
    if (pci == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(g, pci);
    DONE(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------- */
/* memory health                                                                            */

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType,
                                                int counterType, unsigned long long *eccCounts) {
    DEVICE_CALL(device, g);
    if (eccCounts == NULL || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        DONE(NVML_ERROR_INVALID_ARGUMENT);
    *eccCounts = g->ecc[errorType][counterType];
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t retired_pages(struct gpu_cfg *g, int cause, unsigned int *count,
                                  unsigned long long *addresses, unsigned long long *timestamps) {
    if (count == NULL || cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned have = g->retired[cause];
    if (addresses == NULL || *count < have) {
        /* size query (pynvml's first call) or a buffer that is too small */
        *count = have;
        return have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < have; i++) {
        addresses[i] = 0x100000ULL * (unsigned long long)(cause + 1) + 0x1000ULL * i;
        if (timestamps != NULL) timestamps[i] = 1700000000ULL + i;
    }
    *count = have;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    DEVICE_CALL(device, g);
    DONE(retired_pages(g, cause, count, addresses, NULL));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause,
                                                 unsigned int *count,
                                                 unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    DEVICE_CALL(device, g);
    DONE(retired_pages(g, cause, count, addresses, timestamps));
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending) {
    DEVICE_CALL(device, g);
    if (isPending == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *isPending = g->retired_pending != 0;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred) {
    DEVICE_CALL(device, g);
    if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
        DONE(NVML_ERROR_INVALID_ARGUMENT);
    *corrRows = g->remap_corr;
    *uncRows = g->remap_unc;
    *isPending = g->remap_pending != 0;
    *failureOccurred = g->remap_failure != 0;
    DONE(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------- */
/* NVLink, PCIe                                                                             */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             int *isActive) {
    DEVICE_CALL(device, g);
    if (g->nvlinks == 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    if (isActive == NULL || link >= g->nvlinks) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = !g->link_down[link];
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                                    int counter, unsigned long long *value) {
    DEVICE_CALL(device, g);
    if (g->nvlinks == 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    if (value == NULL || link >= g->nvlinks || counter < 0 || counter >= NVLINK_COUNTERS)
        DONE(NVML_ERROR_INVALID_ARGUMENT);
    *value = g->link_err[link][counter];
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    DEVICE_CALL(device, g);
    if (value == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *value = g->pcie_replay;
    DONE(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------- */
/* thermal, power, clocks                                                                   */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType,
                                             unsigned int *temp) {
    DEVICE_CALL(device, g);
    if (temp == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    if (sensorType != 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    *temp = (unsigned)g->temperature;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    DEVICE_CALL(device, g);
    if (temperature == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != TEMPERATURE_V1) DONE(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != 0) DONE(NVML_ERROR_NOT_SUPPORTED);
    temperature->temperature = g->temperature;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_CALL(device, g);
    if (power == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *power = g->power_mw;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    DEVICE_CALL(device, g);
    if (reasons == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clocks_reasons;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    DEVICE_CALL(device, g);
    if (reasons == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clocks_reasons;
    DONE(NVML_SUCCESS);
}

/* ---------------------------------------------------------------------------------------- */
/* events                                                                                   */

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    if (set == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    struct fake_event_set *s = calloc(1, sizeof *s);
    if (s == NULL) DONE(NVML_ERROR_MEMORY);
    s->ifd = -1;
    const char *path = getenv("FAKENVML_SCENARIO");
    if (path != NULL && *path != '\0') {
        /* watch the directory: an atomic replace (rename) changes the file's inode */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash == NULL)
            snprintf(dir, sizeof dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        s->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (s->ifd >= 0 &&
            inotify_add_watch(s->ifd, dir,
                              IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_MODIFY | IN_ATTRIB) < 0) {
            warn("inotify on %s: %s (falling back to polling every 5 ms)", dir, strerror(errno));
            close(s->ifd);
            s->ifd = -1;
        }
    }
    *set = s;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&mu);
    int rc = enter_locked(__func__);
    if (rc != NVML_SUCCESS) DONE(rc);
    if (set == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    if (set->ifd >= 0) close(set->ifd);
    free(set);
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *eventTypes) {
    DEVICE_CALL(device, g);
    if (eventTypes == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    *eventTypes = g->supported_events;
    DONE(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set) {
    DEVICE_CALL(device, g);
    if (set == NULL) DONE(NVML_ERROR_INVALID_ARGUMENT);
    if (eventTypes & ~g->supported_events) DONE(NVML_ERROR_NOT_SUPPORTED);
    set->mask[g - &cur.gpus[0]] |= eventTypes;
    DONE(NVML_SUCCESS);
}

static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms,
                               const char *fn) {
    if (set == NULL || data == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    double deadline = now_ms() + timeoutms;
    for (;;) {
        pthread_mutex_lock(&mu);
        int rc = enter_locked(fn);
        if (rc == NVML_SUCCESS) rc = find_fail(cur.fails, cur.nfails, "nvmlEventSetWait_v2");
        if (rc != NVML_SUCCESS) DONE(rc);
        double now = now_ms();
        double next_due = -1;
        while (delivered < cur.nevents && delivered < seen_count) {
            const struct event_cfg *e = &cur.events[delivered];
            double base = seen_at[delivered];
            if (last_delivered_at > base) base = last_delivered_at;
            double due = base + e->delay_ms;
            if (now < due) {
                next_due = due;
                break;
            }
            delivered++;
            last_delivered_at = now;
            if (e->gpu >= cur.gpu_count) continue;
            if (e->lost) DONE(NVML_ERROR_GPU_IS_LOST);
            if ((set->mask[e->gpu] & e->type) == 0) continue; /* not registered: dropped */
            memset(data, 0, sizeof *data);
            devices[e->gpu].index = e->gpu;
            data->device = &devices[e->gpu];
            data->eventType = e->type;
            data->eventData = e->data;
            data->gpuInstanceId = 0xFFFFFFFFU;
            data->computeInstanceId = 0xFFFFFFFFU;
            DONE(NVML_SUCCESS);
        }
        pthread_mutex_unlock(&mu);
        if (now >= deadline) return NVML_ERROR_TIMEOUT;
        double sleep = deadline - now;
        if (next_due >= 0 && next_due - now < sleep) sleep = next_due - now;
        int ms = (int)sleep + 1;
        if (set->ifd >= 0) {
            struct pollfd p = {.fd = set->ifd, .events = POLLIN};
            if (poll(&p, 1, ms) > 0) {
                char buf[4096];
                while (read(set->ifd, buf, sizeof buf) > 0) {
                }
            }
        } else {
            poll(NULL, 0, ms < 5 ? ms : 5);
        }
    }
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms) {
    return event_wait(set, data, timeoutms, __func__);
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms) {
    return event_wait(set, data, timeoutms, __func__);
}
