/*
 * podip.c -- a STAND-IN for pod networking, for the local devstack only.
 *
 * On a real cluster every slurmd pod has its own IP, so every dynamic slurmd (`slurmd -Z`)
 * listens on the one global SlurmdPort and slurmctld reaches it at the address it registered
 * from. On one host several slurmds would collide on that port, and slurmctld records a
 * dynamic node's address from the registration connection's source address (`Port=` is
 * refused in `--conf`). This LD_PRELOAD library gives one process tree its own loopback
 * "pod IP" (environment HEALER_POD_IP, e.g. 127.0.0.10):
 *
 *   bind():    an IPv4 bind to INADDR_ANY or 127.0.0.1 binds to the pod IP instead;
 *   connect(): an IPv4 socket that is still unbound is first bound to the pod IP, so the
 *              peer (slurmctld) sees the pod IP as the source address.
 *
 * Without HEALER_POD_IP both calls behave as usual. Nothing else is changed (no IPv6, no
 * sendto()). Built on demand by healer_dev.devstack.slurm_dynamic.podip_library().
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*sockfn)(int, const struct sockaddr *, socklen_t);

static in_addr_t pod_ip(void) {
    const char *s = getenv("HEALER_POD_IP");
    if (!s || !*s)
        return 0;
    in_addr_t ip = inet_addr(s);
    return ip == INADDR_NONE ? 0 : ip;
}

static sockfn real(const char *name) { return (sockfn)dlsym(RTLD_NEXT, name); }

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    in_addr_t ip = pod_ip();
    if (ip && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in sin = *(const struct sockaddr_in *)addr;
        if (sin.sin_addr.s_addr == htonl(INADDR_ANY)
            || sin.sin_addr.s_addr == htonl(INADDR_LOOPBACK)) {
            sin.sin_addr.s_addr = ip;
            return real("bind")(fd, (const struct sockaddr *)&sin, sizeof sin);
        }
    }
    return real("bind")(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    in_addr_t ip = pod_ip();
    if (ip && addr && addr->sa_family == AF_INET) {
        struct sockaddr_in cur;
        socklen_t cl = sizeof cur;
        if (getsockname(fd, (struct sockaddr *)&cur, &cl) == 0 && cur.sin_family == AF_INET
            && cur.sin_port == 0 && cur.sin_addr.s_addr == htonl(INADDR_ANY)) {
            struct sockaddr_in src = {0};
            src.sin_family = AF_INET;
            src.sin_addr.s_addr = ip;
            int saved = errno;
            real("bind")(fd, (const struct sockaddr *)&src, sizeof src);
            errno = saved;
        }
    }
    return real("connect")(fd, addr, len);
}
