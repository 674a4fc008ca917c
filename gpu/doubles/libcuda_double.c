/*
 * A test double of the CUDA driver API (the subset railguard-gpu loads), for machines
 * without a GPU. It is built by the tests as libcuda.so.1 and loaded by the same
 * dlopen code as the real driver, so everything above the driver runs for real.
 *
 * "GPU memory" is host memory: memfd-backed and mmap'ed, so ibv_reg_mr can register it
 * (what nvidia-peermem does for real device memory) and /dev/udmabuf can turn it into a
 * real DMA-BUF (what cuMemGetHandleForAddressRange does on a real GPU).
 *
 * Behaviour is set by environment variables, read at cuInit:
 *   RAILGUARD_CUDA_DOUBLE_PCI     comma list of PCI bus ids, one per GPU (default: the
 *                                 list in railguard-cuda-double.pci next to this library,
 *                                 one id per line, for a container whose environment the
 *                                 test does not set; else "0000:04:00.0,0000:84:00.0")
 *   RAILGUARD_CUDA_DOUBLE_DMABUF  "1": the devices report DMA-BUF support and export
 *                                 through /dev/udmabuf; "memfd": they report support and
 *                                 hand out the allocation's memfd, which is no DMA-BUF (for
 *                                 kernels without udmabuf: an HCA driver without DMA-BUF
 *                                 import, like Soft-RoCE's, refuses before looking at the fd);
 *                                 otherwise export fails with CUDA_ERROR_NOT_SUPPORTED
 *                                 (default "0")
 *   RAILGUARD_CUDA_DOUBLE_PEERMEM "0": device pointers are mapped without access, as real
 *                                 device memory is to the kernel without nvidia-peermem, so
 *                                 ibv_reg_mr on them fails (EFAULT); the double's own copies
 *                                 go through a second, private mapping (default "1")
 *   RAILGUARD_CUDA_DOUBLE_INIT    a CUresult for cuInit to return (e.g. 100, no device)
 *   RAILGUARD_CUDA_DOUBLE_LAZY    "1": cuMemsetD32 over an allocation's start records the
 *                                 value instead of writing it (a simulated node's
 *                                 gigabyte messages cost no host memory); reads through the
 *                                 driver see the value, and the memory is written when
 *                                 anything needs it as memory (default "0")
 *
 * A uniform prefix: an allocation whose first bytes all hold one 32-bit word (its first word
 * may differ), set by cuMemsetD32 and by the NCCL double's simulated fabric through the
 * stream's table (struct railguard_cuda_double_stream below), so a simulated all-reduce can
 * move a message as its value. A CUstream of this double points to that table; the NCCL
 * double checks its magic before using it, queues its simulated all-reduces there, and
 * cuStreamSynchronize completes them and waits as long as they take.
 *
 * Nothing here is on a production path: the prober ships without it and loads
 * libcuda.so.1 from the driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

#define MAX_GPUS 16
#define MAX_ALLOCS 256

static int initialised;
static int n_gpus;
static char pci[MAX_GPUS][32];
static int dmabuf; /* 0: none, 1: udmabuf, 2: the memfd itself */
static int peermem = 1;
static int lazy;
static int ctx_refs[MAX_GPUS];
static __thread int current = -1;

struct alloc {
    CUdeviceptr ptr;
    size_t len;
    int memfd;
    int gpu;
    char *host; /* where the double's copies read and write: ptr itself unless !peermem */
    /* The uniform prefix: uni_bytes bytes of uni_value words, the first one uni_first;
     * stale: the memory does not hold them yet. */
    size_t uni_bytes;
    uint32_t uni_value, uni_first;
    int stale;
};
static struct alloc allocs[MAX_ALLOCS];
/* Several threads (one per rank in the tests) allocate at once. */
static pthread_mutex_t allocs_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *names[][2] = {
    {"0", "CUDA_SUCCESS"},
    {"1", "CUDA_ERROR_INVALID_VALUE"},
    {"2", "CUDA_ERROR_OUT_OF_MEMORY"},
    {"3", "CUDA_ERROR_NOT_INITIALIZED"},
    {"100", "CUDA_ERROR_NO_DEVICE"},
    {"101", "CUDA_ERROR_INVALID_DEVICE"},
    {"201", "CUDA_ERROR_INVALID_CONTEXT"},
    {"801", "CUDA_ERROR_NOT_SUPPORTED"},
    {"999", "CUDA_ERROR_UNKNOWN"},
};

CUresult cuGetErrorName(CUresult error, const char **pStr) {
    char code[16];
    snprintf(code, sizeof code, "%d", error);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(names[i][0], code) == 0) {
            *pStr = names[i][1];
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* The device list of railguard-cuda-double.pci beside this library, as a comma list. */
static int pci_file(char *out, size_t n) {
    Dl_info info;
    if (!dladdr((void *)pci_file, &info) || !info.dli_fname) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (!slash) return 0;
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "railguard-cuda-double.pci");
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t got = fread(out, 1, n - 1, f);
    fclose(f);
    out[got] = 0;
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == ' ') *p = ',';
    return got > 0;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const char *fail = getenv("RAILGUARD_CUDA_DOUBLE_INIT");
    if (fail && *fail) return atoi(fail);
    static char from_file[MAX_GPUS * 32];
    const char *list = getenv("RAILGUARD_CUDA_DOUBLE_PCI");
    if (!list && pci_file(from_file, sizeof from_file)) list = from_file;
    if (!list) list = "0000:04:00.0,0000:84:00.0";
    char buf[MAX_GPUS * 32];
    snprintf(buf, sizeof buf, "%s", list);
    n_gpus = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t && n_gpus < MAX_GPUS;
         t = strtok_r(NULL, ",", &save)) {
        snprintf(pci[n_gpus++], sizeof pci[0], "%s", t);
    }
    const char *d = getenv("RAILGUARD_CUDA_DOUBLE_DMABUF");
    dmabuf = !d ? 0 : strcmp(d, "1") == 0 ? 1 : strcmp(d, "memfd") == 0 ? 2 : 0;
    const char *pm = getenv("RAILGUARD_CUDA_DOUBLE_PEERMEM");
    peermem = !(pm && strcmp(pm, "0") == 0);
    const char *lz = getenv("RAILGUARD_CUDA_DOUBLE_LAZY");
    lazy = lz && strcmp(lz, "1") == 0;
    initialised = 1;
    return n_gpus ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *v) {
    *v = 12040;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *count = n_gpus;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= n_gpus) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

/* Compares bus ids ignoring case and the width of the domain. */
static int same_bus(const char *a, const char *b) {
    const char *ra = strchr(a, ':'), *rb = strchr(b, ':');
    if (ra && strchr(ra + 1, ':')) a = ra + 1;
    if (rb && strchr(rb + 1, ':')) b = rb + 1;
    return strcasecmp(a, b) == 0;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *id) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    for (int i = 0; i < n_gpus; i++) {
        if (same_bus(pci[i], id)) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
    if (dev < 0 || dev >= n_gpus) return CUDA_ERROR_INVALID_DEVICE;
    /* CUDA prints an 8-digit domain, upper case. */
    unsigned dom = 0, bus = 0, d = 0, fn = 0;
    if (sscanf(pci[dev], "%x:%x:%x.%x", &dom, &bus, &d, &fn) != 4) return CUDA_ERROR_UNKNOWN;
    snprintf(out, (size_t)len, "%08X:%02X:%02X.%X", dom, bus, d, fn);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *out, int len, CUdevice dev) {
    if (dev < 0 || dev >= n_gpus) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(out, (size_t)len, "railguard CUDA test double (host memory)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice dev) {
    if (dev < 0 || dev >= n_gpus) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case 116: /* GPU_DIRECT_RDMA_SUPPORTED */
        *v = 1;
        return CUDA_SUCCESS;
    case 124: /* DMA_BUF_SUPPORTED */
        *v = dmabuf != 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev < 0 || dev >= n_gpus) return CUDA_ERROR_INVALID_DEVICE;
    __atomic_fetch_add(&ctx_refs[dev], 1, __ATOMIC_SEQ_CST);
    *ctx = (CUcontext)(intptr_t)(dev + 1);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    if (dev < 0 || dev >= n_gpus || ctx_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    __atomic_fetch_sub(&ctx_refs[dev], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    int dev = (int)(intptr_t)ctx - 1;
    if (dev < 0 || dev >= n_gpus || ctx_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    current = dev;
    return CUDA_SUCCESS;
}

static struct alloc *find(CUdeviceptr p, size_t len) {
    struct alloc *found = NULL;
    pthread_mutex_lock(&allocs_lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].ptr && p >= allocs[i].ptr && p + len <= allocs[i].ptr + allocs[i].len) {
            found = &allocs[i];
            break;
        }
    }
    pthread_mutex_unlock(&allocs_lock);
    return found;
}

CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t len) {
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (len == 0) return CUDA_ERROR_INVALID_VALUE;
    long page = sysconf(_SC_PAGESIZE);
    size_t rounded = (len + (size_t)page - 1) / (size_t)page * (size_t)page;
    int fd = memfd_create("railguard-cuda-double", MFD_ALLOW_SEALING);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)rounded) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = mmap(NULL, rounded, peermem ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *host = p;
    if (!peermem) {
        host = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (host == MAP_FAILED) {
            munmap(p, rounded);
            close(fd);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_lock(&allocs_lock);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].ptr) continue;
        allocs[i] = (struct alloc){(CUdeviceptr)(uintptr_t)p, rounded, fd, current, host};
        *out = allocs[i].ptr;
        pthread_mutex_unlock(&allocs_lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&allocs_lock);
    if (host != p) munmap(host, rounded);
    munmap(p, rounded);
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    struct alloc *a = find(p, 0);
    if (!a || a->ptr != p) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&allocs_lock);
    struct alloc gone = *a;
    memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&allocs_lock);
    if (gone.host != (char *)(uintptr_t)gone.ptr) munmap(gone.host, gone.len);
    munmap((void *)(uintptr_t)gone.ptr, gone.len);
    close(gone.memfd);
    return CUDA_SUCCESS;
}

static char *host_of(struct alloc *a, CUdeviceptr p) { return a->host + (p - a->ptr); }

/* Fills n bytes at dst with the words of a uniform prefix that starts `at` bytes in. */
static void fill_words(char *dst, size_t at, size_t n, uint32_t value, uint32_t first) {
    size_t i = 0;
    /* A range starting inside a word (never done by railguard) is filled byte by byte. */
    for (; i < n && (at + i) % 4; i++) {
        uint32_t w = (at + i) / 4 == 0 ? first : value;
        dst[i] = ((char *)&w)[(at + i) % 4];
    }
    for (; i + 4 <= n; i += 4) {
        uint32_t w = at + i == 0 ? first : value;
        memcpy(dst + i, &w, 4);
    }
    for (; i < n; i++) {
        uint32_t w = (at + i) / 4 == 0 ? first : value;
        dst[i] = ((char *)&w)[(at + i) % 4];
    }
}

/* Writes a stale uniform prefix into the memory. */
static void materialize(struct alloc *a) {
    if (!a->stale) return;
    fill_words(a->host, 0, a->uni_bytes, a->uni_value, a->uni_first);
    a->stale = 0;
}

/* The memory of [p, p + n) is about to be read or written through its address. */
static void touch(struct alloc *a, int will_write) {
    materialize(a);
    if (will_write) a->uni_bytes = 0;
}

/* The table a CUstream of this double points to, for the NCCL double (same layout there). */
struct railguard_cuda_double_stream {
    char magic[8]; /* "RGCUDAS1" */
    int dev;
    /* 1 and the words when [p, p + n) lies in an allocation's uniform prefix. */
    int (*uniform)(CUdeviceptr p, size_t n, uint32_t *value, uint32_t *first);
    /* [p, p + n), at an allocation's start, now holds value words (the first one first). */
    int (*set_uniform)(CUdeviceptr p, size_t n, uint32_t value, uint32_t first);
    /* Makes [p, p + n) memory before it is read (will_write 0) or written through p. */
    int (*touch)(CUdeviceptr p, size_t n, int will_write);
    /* The stream's work ends at this CLOCK_MONOTONIC time (ns); synchronizing waits for it. */
    long long busy_until_ns;
    /* Called first when the stream is synchronized: completes queued work (0: done). */
    int (*flush)(void *ctx);
    void *flush_ctx;
};

static int hook_uniform(CUdeviceptr p, size_t n, uint32_t *value, uint32_t *first) {
    struct alloc *a = find(p, n);
    if (!a || p != a->ptr || n > a->uni_bytes) return 0;
    *value = a->uni_value;
    *first = a->uni_first;
    return 1;
}

static int hook_set_uniform(CUdeviceptr p, size_t n, uint32_t value, uint32_t first) {
    struct alloc *a = find(p, n);
    if (!a || p != a->ptr || n % 4) return 0;
    /* The part of a longer stale prefix past n would otherwise never be written. */
    if (a->stale && a->uni_bytes > n) materialize(a);
    a->uni_bytes = n;
    a->uni_value = value;
    a->uni_first = first;
    a->stale = 1;
    return 1;
}

static int hook_touch(CUdeviceptr p, size_t n, int will_write) {
    struct alloc *a = find(p, n);
    if (!a) return 0;
    touch(a, will_write);
    return 1;
}

/* Streams: the double's copies are synchronous, so a stream is only a handle: the table. */
typedef void *CUstream;
static struct railguard_cuda_double_stream streams[MAX_GPUS];
CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct railguard_cuda_double_stream *t = &streams[current];
    memcpy(t->magic, "RGCUDAS1", 8);
    t->dev = current;
    t->uniform = hook_uniform;
    t->set_uniform = hook_set_uniform;
    t->touch = hook_touch;
    t->busy_until_ns = 0;
    t->flush = NULL;
    t->flush_ctx = NULL;
    *s = t;
    return CUDA_SUCCESS;
}
/* Ends the stream's queued work (the NCCL double's simulated fabric queues all-reduces on
 * it) and waits until the time that work takes has passed, as a GPU's stream does. */
CUresult cuStreamSynchronize(CUstream s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct railguard_cuda_double_stream *t = s;
    if (t->flush && t->flush(t->flush_ctx) != 0) return CUDA_ERROR_UNKNOWN;
    if (t->busy_until_ns > 0) {
        struct timespec until = {(time_t)(t->busy_until_ns / 1000000000LL),
                                 (long)(t->busy_until_ns % 1000000000LL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
        }
    }
    return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) {
    return s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Events: the time the stream reaches them. Work a simulated fabric queued ends at the
 * stream's busy_until_ns, so an event recorded after it takes that time, as a GPU's does
 * when its queued work ends, however late the host wakes up. */
typedef struct event {
    char magic[8]; /* "RGCUDAE1" */
    long long at_ns;
} *CUevent;
CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    if (current < 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct event *ev = calloc(1, sizeof *ev);
    if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(ev->magic, "RGCUDAE1", 8);
    *e = ev;
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e || !s) return CUDA_ERROR_INVALID_VALUE;
    const struct railguard_cuda_double_stream *t = s;
    long long now = now_ns();
    e->at_ns = t->busy_until_ns > now ? t->busy_until_ns : now;
    return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
    *ms = (float)((double)(end->at_ns - start->at_ns) / 1e6);
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    free(e);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
    struct alloc *a = find(p, n);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    touch(a, 1);
    memset(host_of(a, p), v, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned int v, size_t words) {
    if (words > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
    size_t n = words * 4;
    struct alloc *a = find(p, n);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    if (p == a->ptr) {
        if (a->stale && a->uni_bytes > n) materialize(a);
        a->uni_bytes = n;
        a->uni_value = a->uni_first = v;
        a->stale = lazy;
        if (lazy) return CUDA_SUCCESS;
    } else {
        touch(a, 1);
    }
    fill_words(host_of(a, p), 0, n, v, v);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    struct alloc *a = find(dst, n);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    touch(a, 1);
    memcpy(host_of(a, dst), src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    struct alloc *a = find(src, n);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    size_t at = src - a->ptr;
    if (a->stale && at + n <= a->uni_bytes) {
        /* Read as the driver reads: the value, without writing the allocation. */
        fill_words(dst, at, n, a->uni_value, a->uni_first);
        return CUDA_SUCCESS;
    }
    touch(a, 0);
    memcpy(dst, host_of(a, src), n);
    return CUDA_SUCCESS;
}

/* handleType 1 = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type,
                                       unsigned long long flags) {
    if (type != 1 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    struct alloc *a = find(p, n);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    if (!dmabuf) return CUDA_ERROR_NOT_SUPPORTED;
    /* The HCA reads and writes the pages themselves. */
    touch(a, 1);
    if (dmabuf == 2) {
        int fd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) return CUDA_ERROR_UNKNOWN;
        *(int *)handle = fd;
        return CUDA_SUCCESS;
    }
    /* udmabuf needs the memfd sealed against shrinking. */
    if (fcntl(a->memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 && errno != EPERM)
        return CUDA_ERROR_UNKNOWN;
    int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
    if (dev < 0) return CUDA_ERROR_NOT_SUPPORTED;
    struct udmabuf_create create = {
        .memfd = (unsigned)a->memfd,
        .flags = UDMABUF_FLAGS_CLOEXEC,
        .offset = p - a->ptr,
        .size = (n + (size_t)sysconf(_SC_PAGESIZE) - 1) / (size_t)sysconf(_SC_PAGESIZE) *
                (size_t)sysconf(_SC_PAGESIZE),
    };
    int fd = ioctl(dev, UDMABUF_CREATE, &create);
    close(dev);
    if (fd < 0) return CUDA_ERROR_NOT_SUPPORTED;
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}
