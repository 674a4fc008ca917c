/*
 * A test double of NCCL's C API (the subset railguard-gpu loads), for machines without a
 * GPU fabric. Built by the tests as libnccl.so.2 and loaded by the same dlopen code as the
 * real library. Its collectives really run between the ranks' processes, over TCP: rank 0
 * sums float32 buffers it receives from every other rank and sends the result back. Buffers
 * are host memory (the CUDA double's "device" memory), so streams are synchronous.
 *
 * With NCCL_DEBUG=INFO it prints, on stderr, the lines real NCCL prints about its
 * communicator and its channels, so the log analysis above it runs on the same kind of text:
 *   - nNodes, localRanks and localRank from the ranks' hosts, as NCCL tells hosts apart: by
 *     a hash of NCCL_HOSTID, or of the hostname and the boot id (src/misc/utils.cc,
 *     getHostHashOnce). Two processes on one machine are one node unless NCCL_HOSTID says
 *     otherwise, which is how tests make one machine hold two "nodes".
 *   - each ring hop's transport as NCCL chooses it (src/transport.cc tries P2P, SHM, NET in
 *     that order): another host is NET; on the same host P2P ("direct pointer" within one
 *     process, src/transport/p2p.cc; "IPC" between processes) unless NCCL_P2P_DISABLE is
 *     non-zero, then SHM (src/transport/shm.cc) unless NCCL_SHM_DISABLE is non-zero, then
 *     NET through the NICs (src/graph/paths.cc marks the GPUs' path PATH_NET).
 *   - one channel per HCA of NCCL_IB_HCA; on channel c local rank c % localRanks leaves the
 *     node, through its own HCA (NET/IB/<its local rank % HCAs>[/GDRDMA], or NET/Socket), as
 *     rail-aligned rings do (prober/fixtures/nccl-debug/hgx-h100-roce400-2node-init-gdrdma.txt:
 *     "14[6] -> 5[5] [send] via NET/IB/6/GDRDMA").
 * Environment, read at ncclCommInitRank:
 *   RAILGUARD_NCCL_DOUBLE_BIND   address rank 0 listens on (default 127.0.0.1)
 *   RAILGUARD_NCCL_DOUBLE_NET    "IB" (default) or "Socket": the network the log reports
 *   RAILGUARD_NCCL_DOUBLE_GDR    "0": IB channels without /GDRDMA (default "1")
 *   RAILGUARD_NCCL_DOUBLE_DELAY_US  extra microseconds per all-reduce (a slow rail)
 *   RAILGUARD_NCCL_DOUBLE_SLOW_HCA  with DELAY_US: the delay applies only to communicators
 *                                whose NCCL_IB_HCA names this HCA (one slow rail of a node)
 *   RAILGUARD_NCCL_DOUBLE_CORRUPT   "1": the result's first element is off by one
 *   RAILGUARD_NCCL_DOUBLE_FAIL   "init": ncclCommInitRank fails with ncclSystemError after
 *                                printing NCCL's warning for a failed DMA-BUF registration
 *   RAILGUARD_NCCL_DOUBLE_VERSION  the version it is, X.Y.Z (default 2.21.5): ncclGetVersion
 *                                answers NCCL_VERSION(X,Y,Z) of src/nccl.h.in, X*1000 + Y*100
 *                                + Z up to 2.8 and X*10000 + Y*100 + Z from 2.9 on
 *   RAILGUARD_NCCL_DOUBLE_SYSFS  a sysfs root: HCAs of NCCL_IB_HCA whose port is not ACTIVE
 *                                there are left out, as NCCL leaves them out
 *                                (src/transport/net_ib/init.cc); none left: NET/Socket
 *   RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS  a simulated fabric (when every rank has one): an
 *                                all-reduce is queued on the CUDA double's stream, which
 *                                stays busy as long as one of that bus bandwidth (GB/s,
 *                                nccl-tests' busbw) takes; synchronizing the stream completes
 *                                the queue with one exchange of values (a message must be one
 *                                value, the CUDA double's uniform prefix: cuMemsetD32, with
 *                                RAILGUARD_CUDA_DOUBLE_LAZY no memory is written) and waits.
 *                                One number, or one per path the hops take:
 *                                ib=,ib-nogdr=,socket=,shm=,p2p= (a missing one: ib's); the
 *                                IB figures scale with the share of NCCL_IB_HCA's HCAs found
 * NCCL's own switches, as NCCL reads them: NCCL_P2P_DISABLE, NCCL_SHM_DISABLE (above),
 * NCCL_IB_DISABLE=1 (the socket transport, src/transport/net_ib/init.cc), and
 * NCCL_NET_GDR_LEVEL=LOC (no GPUDirect RDMA: src/graph/paths.cc, ncclTopoCheckGdr).
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

struct railguard_cuda_double_stream;

/* What each rank tells the others at init: where it runs. */
struct rank_info {
    uint64_t host; /* NCCL's host hash */
    int32_t pid;
    int32_t fabric; /* it runs on a simulated fabric (RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS) */
};

struct comm {
    int rank, nranks;
    int *peers; /* rank 0: one socket per other rank; others: peers[0] is rank 0 */
    int corrupt;
    long delay_us;
    struct rank_info *ranks; /* every rank's, by rank */
    /* > 0: every rank runs on the simulated fabric, at this busbw for the path the hops
     * take; its all-reduces are queued on the stream and complete when it is synchronized */
    double busbw_gbps;
    struct queued *queue;
    size_t queued, capacity;
    struct railguard_cuda_double_stream *cuda; /* the stream the queue is on */
};

/* An all-reduce queued on a simulated fabric: its result buffer and this rank's value. */
struct queued {
    unsigned long long recv;
    size_t bytes;
    uint32_t value;
};

/* A CUstream of the CUDA double points to this table (gpu/doubles/libcuda_double.c). */
struct railguard_cuda_double_stream {
    char magic[8]; /* "RGCUDAS1" */
    int dev;
    int (*uniform)(unsigned long long p, size_t n, uint32_t *value, uint32_t *first);
    int (*set_uniform)(unsigned long long p, size_t n, uint32_t value, uint32_t first);
    int (*touch)(unsigned long long p, size_t n, int will_write);
    /* The stream's work ends at this CLOCK_MONOTONIC time (ns); synchronizing waits for it. */
    long long busy_until_ns;
    /* Called first when the stream is synchronized: completes queued work (0: done). */
    int (*flush)(void *ctx);
    void *flush_ctx;
};

/* The CUDA double's table behind a stream, or NULL. Only ever paired with that double: a
 * real CUstream would not be read like this. */
static const struct railguard_cuda_double_stream *cuda_double(void *stream) {
    const struct railguard_cuda_double_stream *t = stream;
    return t && memcmp(t->magic, "RGCUDAS1", 8) == 0 ? t : NULL;
}
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

/* RAILGUARD_NCCL_DOUBLE_VERSION, else 2.21.5. */
static void version_of(int *x, int *y, int *z) {
    const char *v = getenv("RAILGUARD_NCCL_DOUBLE_VERSION");
    if (!v || sscanf(v, "%d.%d.%d", x, y, z) != 3) {
        *x = 2;
        *y = 21;
        *z = 5;
    }
}

ncclResult_t ncclGetVersion(int *v) {
    int x, y, z;
    version_of(&x, &y, &z);
    /* NCCL_VERSION(X,Y,Z) of src/nccl.h.in. */
    *v = (x <= 2 && y <= 8) ? x * 1000 + y * 100 + z : x * 10000 + y * 100 + z;
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

/* FNV-1a: any stable hash will do; NCCL's own is in src/include/utils.h. */
static uint64_t hash_text(const char *t) {
    uint64_t h = 1469598103934665603ull;
    for (; *t; t++) h = (h ^ (unsigned char)*t) * 1099511628211ull;
    return h;
}

/* NCCL_HOSTID, or the hostname followed by the boot id (src/misc/utils.cc). */
static uint64_t host_hash(void) {
    char text[1024] = "";
    const char *id = getenv("NCCL_HOSTID");
    if (id) {
        snprintf(text, sizeof text, "%s", id);
        return hash_text(text);
    }
    gethostname(text, sizeof text - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        size_t at = strlen(text);
        if (fgets(text + at, (int)(sizeof text - at), f)) text[strcspn(text, "\n")] = '\0';
        fclose(f);
    }
    return hash_text(text);
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && atol(v) != 0;
}

/* Whether HCA `hca` (NCCL_IB_HCA's form: name or name:port) has an ACTIVE port under the
 * sysfs root of RAILGUARD_NCCL_DOUBLE_SYSFS (no root: every HCA counts). */
static int port_active(const char *hca) {
    const char *root = getenv("RAILGUARD_NCCL_DOUBLE_SYSFS");
    if (!root || !*root) return 1;
    char name[96];
    snprintf(name, sizeof name, "%s", hca);
    char *colon = strchr(name, ':');
    const char *port = "1";
    if (colon) {
        *colon = '\0';
        port = colon + 1;
    }
    char path[4096], state[64] = "";
    snprintf(path, sizeof path, "%s/sys/class/infiniband/%s/ports/%s/state", root, name, port);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(state, sizeof state, f) && strstr(state, "ACTIVE");
    fclose(f);
    return ok;
}

/* The simulated fabric's bus bandwidth for `path` (ib, ib-nogdr, socket, shm, p2p) from
 * RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS: one number for every path, or path=GB/s pairs with ib's
 * figure for a missing one; 0 without a fabric. */
static double fabric_busbw(const char *path) {
    const char *spec = getenv("RAILGUARD_NCCL_DOUBLE_BUSBW_GBPS");
    if (!spec || !*spec) return 0;
    if (!strchr(spec, '=')) return atof(spec);
    char list[512];
    snprintf(list, sizeof list, "%s", spec);
    double ib = 0, want = -1;
    char *save;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        if (!eq) continue;
        *eq = '\0';
        if (strcmp(t, "ib") == 0) ib = atof(eq + 1);
        if (strcmp(t, path) == 0) want = atof(eq + 1);
    }
    return want >= 0 ? want : ib;
}

/* What the communicator's hops use, as print_network found it. */
struct route {
    int net, shm, socket, gdr;
    int found, requested; /* HCAs of NCCL_IB_HCA NCCL opened, and named */
};

/* Where each rank sits: its host's index (hosts in order of their first rank), its local
 * index on that host, and the rank at (host, local index). */
struct layout {
    int nnodes;
    int *host_of, *local_of, *nlocal;
    int **rank_at;
};

static int layout_of(const struct comm *c, struct layout *l) {
    int n = c->nranks;
    l->nnodes = 0;
    l->host_of = calloc((size_t)n, sizeof(int));
    l->local_of = calloc((size_t)n, sizeof(int));
    l->nlocal = calloc((size_t)n, sizeof(int));
    l->rank_at = calloc((size_t)n, sizeof(int *));
    if (!l->host_of || !l->local_of || !l->nlocal || !l->rank_at) return -1;
    for (int r = 0; r < n; r++) {
        int h = 0;
        while (h < l->nnodes && c->ranks[l->rank_at[h][0]].host != c->ranks[r].host) h++;
        if (h == l->nnodes) {
            l->rank_at[h] = calloc((size_t)n, sizeof(int));
            if (!l->rank_at[h]) return -1;
            l->nnodes++;
        }
        l->host_of[r] = h;
        l->local_of[r] = l->nlocal[h];
        l->rank_at[h][l->nlocal[h]++] = r;
    }
    return 0;
}

static void layout_free(struct layout *l) {
    for (int h = 0; h < l->nnodes; h++) free(l->rank_at[h]);
    free(l->rank_at);
    free(l->host_of);
    free(l->local_of);
    free(l->nlocal);
}

/* The transport of the hop from -> to, or NULL for NET. */
static const char *intra_path(const struct comm *c, int from, int to) {
    if (c->ranks[from].host != c->ranks[to].host) return NULL;
    if (!env_flag("NCCL_P2P_DISABLE"))
        return c->ranks[from].pid == c->ranks[to].pid ? "P2P/direct pointer" : "P2P/IPC";
    if (!env_flag("NCCL_SHM_DISABLE")) return "SHM/direct/direct";
    return NULL;
}

static struct route print_network(const struct comm *c, const struct layout *l) {
    struct route route = {0};
    const char *net = getenv("RAILGUARD_NCCL_DOUBLE_NET");
    if (!net) net = "IB";
    const char *gdr_env = getenv("RAILGUARD_NCCL_DOUBLE_GDR");
    const char *gdr_level = getenv("NCCL_NET_GDR_LEVEL");
    int gdr = !(gdr_env && strcmp(gdr_env, "0") == 0) &&
              !(gdr_level && strcasecmp(gdr_level, "LOC") == 0);
    int socket = strcmp(net, "Socket") == 0 || env_flag("NCCL_IB_DISABLE");
    int rank = c->rank, me = l->local_of[rank], host = l->host_of[rank];
    int local = l->nlocal[host];
    /* The HCAs of NCCL_IB_HCA (exact or prefix form) with an active port, one channel each. */
    int n = 1;
    char using[1024] = "";
    if (!socket) {
        const char *hca = getenv("NCCL_IB_HCA");
        if (!hca || !*hca) hca = "mlx5_0:1";
        while (*hca == '=' || *hca == '^') hca++;
        char list[512];
        snprintf(list, sizeof list, "%s", hca);
        n = 0;
        char *save;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            route.requested++;
            if (!port_active(t)) continue;
            char item[96];
            snprintf(item, sizeof item, "%s[%d]%s%s/RoCE", n ? " " : "", n, t,
                     strchr(t, ':') ? "" : ":1");
            strncat(using, item, sizeof using - strlen(using) - 1);
            n++;
        }
        route.found = n;
        if (n == 0) {
            info(me, "NET/IB : No device found.");
            socket = 1;
            n = 1;
        }
    }
    if (socket) {
        info(me, "NET/Socket : Using [0]lo:127.0.0.1<0>");
        info(me, "Using network Socket");
    } else {
        info(me, "NET/IB : Using %s [RO]; OOB lo:127.0.0.1<0>", using);
        info(me, "Using network IB");
    }
    route.socket = socket;
    route.gdr = gdr && !socket;
    if (c->nranks < 2) {
        info(me, "Channel 00/32 : 0");
        return route;
    }
    int dev = me % n, used_net = 0;
    char via[64];
    if (socket)
        snprintf(via, sizeof via, "NET/Socket/0");
    else
        snprintf(via, sizeof via, "NET/IB/%d%s", dev, gdr ? "/GDRDMA" : "");
    for (int ch = 0; ch < n; ch++) {
        int exit_local = ch % local, entry_local = (ch + 1) % local;
        int to, from;
        if (me == exit_local) {
            int next_host = (host + 1) % l->nnodes;
            to = l->rank_at[next_host][(ch + 1) % l->nlocal[next_host]];
        } else {
            to = l->rank_at[host][(me + 1) % local];
        }
        if (me == entry_local) {
            int prev_host = (host + l->nnodes - 1) % l->nnodes;
            from = l->rank_at[prev_host][ch % l->nlocal[prev_host]];
        } else {
            from = l->rank_at[host][(me + local - 1) % local];
        }
        const char *send = intra_path(c, rank, to);
        if (send && strncmp(send, "SHM", 3) == 0) route.shm = 1;
        if (send) {
            info(me, "Channel %02d/0 : %d[%d] -> %d[%d] via %s", ch, rank, me, to, l->local_of[to],
                 send);
        } else {
            info(me, "Channel %02d/0 : %d[%d] -> %d[%d] [send] via %s", ch, rank, me, to,
                 l->local_of[to], via);
            used_net = 1;
        }
        if (!intra_path(c, from, rank)) {
            info(me, "Channel %02d/0 : %d[%d] -> %d[%d] [receive] via %s", ch, from,
                 l->local_of[from], rank, me, via);
            used_net = 1;
        }
    }
    if (used_net && !socket)
        info(me, "NET/IB : GPU Direct RDMA %s for HCA %d", gdr ? "Enabled" : "Disabled", dev);
    route.net = used_net;
    return route;
}

/* The simulated fabric's bus bandwidth for the hops of `r`; 0 without one. */
static double route_busbw(const struct route *r) {
    if (!r->net) return fabric_busbw(r->shm ? "shm" : "p2p");
    if (r->socket) return fabric_busbw("socket");
    double bw = fabric_busbw(r->gdr ? "ib" : "ib-nogdr");
    /* A missing rail puts two GPUs' hops on one NIC. */
    if (r->requested > 0 && r->found < r->requested) bw = bw * r->found / r->requested;
    return bw;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    if (memcmp(id.internal, MAGIC, 8) != 0) return ncclInvalidArgument;
    int vx, vy, vz;
    version_of(&vx, &vy, &vz);
    info(0, "NCCL version %d.%d.%d+cuda12.4 (railguard test double)", vx, vy, vz);
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
    c->ranks = calloc((size_t)nranks, sizeof(struct rank_info));
    if (!c->peers || !c->ranks) return ncclSystemError;
    struct rank_info mine = {.host = host_hash(),
                             .pid = (int32_t)getpid(),
                             .fabric = fabric_busbw("ib") > 0 || fabric_busbw("p2p") > 0};
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
            struct rank_info where;
            if (fd < 0 || full_io(fd, &peer, sizeof peer, 0) != 0 || peer <= 0 || peer >= nranks ||
                c->peers[peer] || full_io(fd, &where, sizeof where, 0) != 0) {
                close(lfd);
                return ncclRemoteError;
            }
            c->peers[peer] = fd;
            c->ranks[peer] = where;
        }
        close(lfd);
        c->ranks[0] = mine;
        /* Every rank learns where the others run (NCCL's bootstrap allgather). */
        for (int k = 1; k < nranks; k++)
            if (full_io(c->peers[k], c->ranks, (size_t)nranks * sizeof *c->ranks, 1) != 0)
                return ncclRemoteError;
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
        if (fd < 0 || full_io(fd, &rank, sizeof rank, 1) != 0 ||
            full_io(fd, &mine, sizeof mine, 1) != 0 ||
            full_io(fd, c->ranks, (size_t)nranks * sizeof *c->ranks, 0) != 0)
            return ncclRemoteError;
        c->peers[0] = fd;
    }
    for (int i = 0; i < nranks; i++) {
        if (c->peers[i]) {
            int one = 1;
            setsockopt(c->peers[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
    }
    struct layout l;
    if (layout_of(c, &l) != 0) return ncclSystemError;
    int host = l.host_of[rank];
    info(l.local_of[rank], "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL 0",
         (void *)c, rank, nranks, l.nnodes, l.nlocal[host], l.local_of[rank]);
    struct route route = print_network(c, &l);
    /* A fabric every rank simulates, or none: they must all queue, or all exchange data. */
    int fabric = 1;
    for (int r = 0; r < nranks; r++) fabric = fabric && c->ranks[r].fabric;
    if (fabric && nranks > 1) c->busbw_gbps = route_busbw(&route);
    layout_free(&l);
    *out = c;
    return ncclSuccess;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static float as_float(uint32_t w) {
    float f;
    memcpy(&f, &w, 4);
    return f;
}
static uint32_t as_word(float f) {
    uint32_t w;
    memcpy(&w, &f, 4);
    return w;
}

/* Completes a simulated fabric's queued all-reduces: one exchange of every rank's values
 * (each rank's message is one value), the sums written as the results' values. Called by the
 * CUDA double when the stream is synchronized, as a GPU's queued work ends there. */
static int flush_queue(void *ctx) {
    struct comm *c = ctx;
    uint64_t n = c->queued;
    if (n == 0) return 0;
    uint32_t *values = malloc(n * sizeof *values), *sums = malloc(n * sizeof *sums);
    if (!values || !sums) return ncclSystemError;
    for (uint64_t i = 0; i < n; i++) values[i] = c->queue[i].value;
    int rc = 0;
    if (c->rank == 0) {
        float *acc = malloc(n * sizeof *acc);
        if (!acc) return ncclSystemError;
        for (uint64_t i = 0; i < n; i++) acc[i] = as_float(values[i]);
        for (int k = 1; k < c->nranks && !rc; k++) {
            uint64_t theirs = 0;
            if (full_io(c->peers[k], &theirs, sizeof theirs, 0) != 0 || theirs != n ||
                full_io(c->peers[k], sums, n * sizeof *sums, 0) != 0) {
                rc = ncclRemoteError;
                break;
            }
            for (uint64_t i = 0; i < n; i++) acc[i] += as_float(sums[i]);
        }
        for (uint64_t i = 0; i < n; i++) sums[i] = as_word(acc[i]);
        free(acc);
        for (int k = 1; k < c->nranks && !rc; k++)
            if (full_io(c->peers[k], sums, n * sizeof *sums, 1) != 0) rc = ncclRemoteError;
    } else if (full_io(c->peers[0], &n, sizeof n, 1) != 0 ||
               full_io(c->peers[0], values, n * sizeof *values, 1) != 0 ||
               full_io(c->peers[0], sums, n * sizeof *sums, 0) != 0) {
        rc = ncclRemoteError;
    }
    for (uint64_t i = 0; i < n && !rc; i++) {
        struct queued *q = &c->queue[i];
        uint32_t first = c->corrupt ? as_word(as_float(sums[i]) + 1.0f) : sums[i];
        if (!q->recv) continue;
        if (!c->cuda->set_uniform(q->recv, q->bytes, sums[i], first)) rc = ncclInvalidArgument;
    }
    c->queued = 0;
    free(values);
    free(sums);
    return rc;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op,
                           ncclComm_t c, void *stream) {
    if (!c || datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    size_t bytes = count * sizeof(float);
    struct railguard_cuda_double_stream *cuda = (struct railguard_cuda_double_stream *)cuda_double(stream);
    unsigned long long sendp = (unsigned long long)(uintptr_t)send;
    unsigned long long recvp = (unsigned long long)(uintptr_t)recv;
    if (c->busbw_gbps > 0) {
        /* Queued, as on a GPU: the stream is busy for as long as the fabric takes; the
         * result is there once the stream is synchronized. */
        uint32_t value = 0, first = 0;
        if (!cuda || (count && !(cuda->uniform(sendp, bytes, &value, &first) && value == first))) {
            warn(0, "railguard test double",
                 "a simulated fabric moves only messages of one value (cuMemsetD32 of the CUDA double)");
            return ncclInvalidUsage;
        }
        if (c->queued == c->capacity) {
            size_t cap = c->capacity ? 2 * c->capacity : 64;
            struct queued *q = realloc(c->queue, cap * sizeof *q);
            if (!q) return ncclSystemError;
            c->queue = q;
            c->capacity = cap;
        }
        c->queue[c->queued++] = (struct queued){count ? recvp : 0, bytes, value};
        c->cuda = cuda;
        cuda->flush = flush_queue;
        cuda->flush_ctx = c;
        /* busbw = algbw * 2(n-1)/n (nccl-tests src/all_reduce.cu): each rank moves 2(n-1)/n
         * of the message at busbw. */
        double n = c->nranks;
        double seconds = (double)bytes * 2.0 * (n - 1.0) / n / (c->busbw_gbps * 1e9);
        long long start = now_ns();
        if (cuda->busy_until_ns > start) start = cuda->busy_until_ns;
        cuda->busy_until_ns = start + (long long)(seconds * 1e9) + c->delay_us * 1000LL;
        return ncclSuccess;
    }
    if (c->delay_us > 0) {
        struct timespec ts = {c->delay_us / 1000000, (c->delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (cuda) {
        cuda->touch(sendp, bytes, 0);
        cuda->touch(recvp, bytes, 1);
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
    if (c->cuda && c->cuda->flush_ctx == c) {
        /* Nothing may call back into a destroyed communicator. */
        flush_queue(c);
        c->cuda->flush = NULL;
        c->cuda->flush_ctx = NULL;
    }
    free(c->queue);
    for (int i = 0; i < c->nranks; i++)
        if (c->peers[i]) close(c->peers[i]);
    free(c->peers);
    free(c->ranks);
    free(c);
    return ncclSuccess;
}
