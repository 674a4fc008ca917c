/*
 * A test double of NCCL's C API (the subset railguard-gpu loads), for machines without a
 * GPU fabric. Built by the tests as libnccl.so.2 and loaded by the same dlopen code as the
 * real library. Its collectives really run between the ranks' processes, over TCP: rank 0
 * sums float32 buffers it receives from every other rank and sends the result back. Buffers
 * are host memory (the CUDA double's "device" memory), so streams are synchronous.
 *
 * With NCCL_DEBUG=INFO it prints, on stderr, the lines real NCCL prints about its network
 * (NET/IB with the HCAs of NCCL_IB_HCA and GDRDMA channels, or NET/Socket), so the log
 * analysis above it runs on the same kind of text. Environment, read at ncclCommInitRank:
 *   RAILGUARD_NCCL_DOUBLE_BIND   address rank 0 listens on (default 127.0.0.1)
 *   RAILGUARD_NCCL_DOUBLE_NET    "IB" (default) or "Socket": the network the log reports
 *   RAILGUARD_NCCL_DOUBLE_GDR    "0": IB channels without /GDRDMA (default "1")
 *   RAILGUARD_NCCL_DOUBLE_DELAY_US  extra microseconds per all-reduce (a slow rail)
 *   RAILGUARD_NCCL_DOUBLE_SLOW_HCA  with DELAY_US: the delay applies only to communicators
 *                                whose NCCL_IB_HCA names this HCA (one slow rail of a node)
 *   RAILGUARD_NCCL_DOUBLE_CORRUPT   "1": the result's first element is off by one
 *   RAILGUARD_NCCL_DOUBLE_FAIL   "init": ncclCommInitRank fails with ncclSystemError after
 *                                printing NCCL's warning for a failed DMA-BUF registration
 *
 * Nothing here is on a production path.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdarg.h>
#include <strings.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
#define ncclSuccess 0
#define ncclUnhandledCudaError 1
#define ncclSystemError 2
#define ncclInternalError 3
#define ncclInvalidArgument 4
#define ncclInvalidUsage 5
#define ncclRemoteError 6

#define ncclFloat32 7
#define ncclSum 0

typedef struct { char internal[128]; } ncclUniqueId;

struct comm {
    int rank, nranks;
    int *peers; /* rank 0: one socket per other rank; others: peers[0] is rank 0 */
    int corrupt;
    long delay_us;
};
typedef struct comm *ncclComm_t;

#define MAGIC "RGNCCLD1"

/* Listening sockets made by ncclGetUniqueId in this process, by port. */
static pthread_mutex_t listeners_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { uint16_t port; int fd; } listeners[64];

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetVersion(int *v) {
    *v = 22105;
    return ncclSuccess;
}

static int debug_info(void) {
    const char *d = getenv("NCCL_DEBUG");
    return d && (strcasecmp(d, "INFO") == 0 || strcasecmp(d, "TRACE") == 0);
}

static void info(int dev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void info(int dev, const char *fmt, ...) {
    if (!debug_info()) return;
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d:%ld [%d] NCCL INFO %s\n", host, getpid(), (long)syscall(SYS_gettid),
            dev, line);
}

static void warn(int dev, const char *where, const char *msg) {
    const char *d = getenv("NCCL_DEBUG");
    if (!d || strcasecmp(d, "VERSION") == 0) return;
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    fprintf(stderr, "%s:%d:%ld [%d] %s NCCL WARN %s\n", host, getpid(), (long)syscall(SYS_gettid),
            dev, where, msg);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    const char *bind_addr = getenv("RAILGUARD_NCCL_DOUBLE_BIND");
    if (!bind_addr) bind_addr = "127.0.0.1";
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    if (inet_pton(AF_INET, bind_addr, &a.sin_addr) != 1) return ncclInvalidArgument;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ncclSystemError;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0) {
        close(fd);
        return ncclSystemError;
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    pthread_mutex_lock(&listeners_lock);
    int slot = -1;
    for (int i = 0; i < 64; i++) {
        if (listeners[i].fd == 0) {
            listeners[i].port = ntohs(a.sin_port);
            listeners[i].fd = fd;
            slot = i;
            break;
        }
    }
    pthread_mutex_unlock(&listeners_lock);
    if (slot < 0) {
        close(fd);
        return ncclInternalError;
    }
    memset(id, 0, sizeof *id);
    memcpy(id->internal, MAGIC, 8);
    memcpy(id->internal + 8, &a.sin_addr, 4);
    memcpy(id->internal + 12, &a.sin_port, 2);
    return ncclSuccess;
}

static int full_io(int fd, void *buf, size_t n, int sending) {
    char *p = buf;
    while (n) {
        ssize_t r = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void print_network(int rank, int nranks) {
    const char *net = getenv("RAILGUARD_NCCL_DOUBLE_NET");
    if (!net) net = "IB";
    const char *gdr_env = getenv("RAILGUARD_NCCL_DOUBLE_GDR");
    int gdr = !(gdr_env && strcmp(gdr_env, "0") == 0);
    int next = (rank + 1) % nranks;
    if (strcmp(net, "Socket") == 0) {
        info(0, "NET/Socket : Using [0]lo:127.0.0.1<0>");
        info(0, "Using network Socket");
        info(0, "Channel 00/0 : %d[0] -> %d[0] [send] via NET/Socket/0", rank, next);
        return;
    }
    /* The HCAs of NCCL_IB_HCA (exact or prefix form), one channel each. */
    const char *hca = getenv("NCCL_IB_HCA");
    if (!hca || !*hca) hca = "mlx5_0:1";
    while (*hca == '=' || *hca == '^') hca++;
    char list[512], using[1024] = "";
    snprintf(list, sizeof list, "%s", hca);
    int n = 0;
    char *save;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save), n++) {
        char item[96];
        snprintf(item, sizeof item, "%s[%d]%s%s/RoCE", n ? " " : "", n, t,
                 strchr(t, ':') ? "" : ":1");
        strncat(using, item, sizeof using - strlen(using) - 1);
    }
    info(0, "NET/IB : Using %s [RO]; OOB lo:127.0.0.1<0>", using);
    info(0, "Using network IB");
    for (int i = 0; i < n; i++) {
        info(0, "NET/IB : GPU Direct RDMA %s for HCA %d", gdr ? "Enabled" : "Disabled", i);
        info(0, "Channel %02d/0 : %d[0] -> %d[0] [send] via NET/IB/%d%s", i, rank, next, i,
             gdr ? "/GDRDMA" : "");
    }
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (memcmp(id.internal, MAGIC, 8) != 0) return ncclInvalidArgument;
    info(0, "NCCL version 2.21.5+cuda12.4 (railguard test double)");
    const char *fail = getenv("RAILGUARD_NCCL_DOUBLE_FAIL");
    if (fail && strcmp(fail, "init") == 0) {
        warn(0, "misc/ibvwrap.cc:288", "Call to ibv_reg_dmabuf_mr failed with error Operation not supported");
        return ncclSystemError;
    }
    struct sockaddr_in a = {.sin_family = AF_INET};
    memcpy(&a.sin_addr, id.internal + 8, 4);
    memcpy(&a.sin_port, id.internal + 12, 2);
    struct comm *c = calloc(1, sizeof *c);
    if (!c) return ncclSystemError;
    c->rank = rank;
    c->nranks = nranks;
    c->peers = calloc((size_t)nranks, sizeof(int));
    const char *corrupt = getenv("RAILGUARD_NCCL_DOUBLE_CORRUPT");
    c->corrupt = corrupt && strcmp(corrupt, "1") == 0;
    const char *delay = getenv("RAILGUARD_NCCL_DOUBLE_DELAY_US");
    c->delay_us = delay ? atol(delay) : 0;
    const char *slow = getenv("RAILGUARD_NCCL_DOUBLE_SLOW_HCA");
    const char *hcas = getenv("NCCL_IB_HCA");
    if (slow && *slow && !(hcas && strstr(hcas, slow))) c->delay_us = 0;
    if (rank == 0) {
        int lfd = -1;
        pthread_mutex_lock(&listeners_lock);
        for (int i = 0; i < 64; i++) {
            if (listeners[i].fd && listeners[i].port == ntohs(a.sin_port)) {
                lfd = listeners[i].fd;
                listeners[i].fd = 0;
                break;
            }
        }
        pthread_mutex_unlock(&listeners_lock);
        if (lfd < 0) {
            warn(0, "bootstrap.cc", "rank 0 must run where ncclGetUniqueId was called");
            return ncclInvalidUsage;
        }
        for (int k = 1; k < nranks; k++) {
            int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            int peer = -1;
            if (fd < 0 || full_io(fd, &peer, sizeof peer, 0) != 0 || peer <= 0 || peer >= nranks ||
                c->peers[peer]) {
                close(lfd);
                return ncclRemoteError;
            }
            c->peers[peer] = fd;
        }
        close(lfd);
    } else {
        int fd = -1;
        /* Rank 0 may not listen yet: retry for 30 s. */
        for (int tries = 0; tries < 300; tries++) {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) break;
            close(fd);
            fd = -1;
            struct timespec ts = {0, 100 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (fd < 0 || full_io(fd, &rank, sizeof rank, 1) != 0) return ncclRemoteError;
        c->peers[0] = fd;
    }
    for (int i = 0; i < nranks; i++) {
        if (c->peers[i]) {
            int one = 1;
            setsockopt(c->peers[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
    }
    info(0, "comm %p rank %d nRanks %d nNodes %d localRanks 1 localRank 0 MNNVL 0", (void *)c, rank,
         nranks, nranks);
    print_network(rank, nranks);
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                           ncclComm_t c, void *stream) {
    (void)stream;
    if (!c || datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    size_t bytes = count * sizeof(float);
    if (c->delay_us > 0) {
        struct timespec ts = {c->delay_us / 1000000, (c->delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (c->rank == 0) {
        float *acc = malloc(bytes ? bytes : 1), *tmp = malloc(bytes ? bytes : 1);
        if (!acc || !tmp) return ncclSystemError;
        memcpy(acc, send, bytes);
        for (int k = 1; k < c->nranks; k++) {
            if (full_io(c->peers[k], tmp, bytes, 0) != 0) return ncclRemoteError;
            for (size_t i = 0; i < count; i++) acc[i] += tmp[i];
        }
        if (c->corrupt && count) acc[0] += 1.0f;
        for (int k = 1; k < c->nranks; k++) {
            if (full_io(c->peers[k], acc, bytes, 1) != 0) return ncclRemoteError;
        }
        memcpy(recv, acc, bytes);
        free(acc);
        free(tmp);
    } else {
        if (full_io(c->peers[0], (void *)send, bytes, 1) != 0) return ncclRemoteError;
        if (full_io(c->peers[0], recv, bytes, 0) != 0) return ncclRemoteError;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    for (int i = 0; i < c->nranks; i++)
        if (c->peers[i]) close(c->peers[i]);
    free(c->peers);
    free(c);
    return ncclSuccess;
}
