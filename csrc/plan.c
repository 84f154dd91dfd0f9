/* The shared-memory plan runner (see plan.h for the instruction set and the call agreement). */
#define _GNU_SOURCE /* process_vm_readv */
#include "plan.h"
#include "reduce.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/uio.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() do { } while (0)
#endif

#define MAX_STACK_OPERANDS 64

/* Counters live in MPI shared windows written by other processes: acquire loads pair with the writers'
 * release stores, so every byte a peer stored before publishing a counter is visible once we see it (this
 * also holds on weakly ordered CPUs). */
static int64_t load(const int64_t *word)
{
    return __atomic_load_n(word, __ATOMIC_ACQUIRE);
}

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void coll_ctrl_sign(int64_t *ctrl, int64_t seq, int64_t signature)
{
    const int slot = (int)(seq & 1) * 2;
    /* the hash first, then the call number (release): a reader that sees the number sees its hash */
    __atomic_store_n(&ctrl[COLL_CTRL_SIG_HASH + slot], signature, __ATOMIC_RELAXED);
    __atomic_store_n(&ctrl[COLL_CTRL_SIG_SEQ + slot], seq, __ATOMIC_RELEASE);
}

void coll_ctrl_poison(int64_t *ctrl, int64_t seq)
{
    __atomic_store_n(&ctrl[COLL_CTRL_POISON], seq, __ATOMIC_RELEASE);
}

int coll_ctrl_compare(const int64_t *ctrl_q, int64_t seq, int64_t signature)
{
    const int slot = (int)(seq & 1) * 2;
    if (load(&ctrl_q[COLL_CTRL_POISON]) == seq)
        return -2;
    /* The slot of this call's parity holds an older number until the peer starts this call, then this call's.
     * A later number means the peer has finished this call (a rank signs a call only once its previous calls
     * are over): it compared its signature with this rank's before it did, or poisoned this call (read above;
     * a rank that poisons joins the mismatch report, which waits for this rank, so the word is still there).
     * That happens when calls that sign nothing let the peer run ahead: with check="off", calls that move no
     * data, and MPI's own collectives after a signature's first call. */
    const int64_t its_seq = load(&ctrl_q[COLL_CTRL_SIG_SEQ + slot]);
    if (its_seq != seq)
        return its_seq > seq ? 1 : 0;
    return load(&ctrl_q[COLL_CTRL_SIG_HASH + slot]) == signature ? 1 : -1;
}

void coll_ctrl_sign_flag(int64_t *ctrl, int64_t seq, int64_t signature, int64_t flag)
{
    /* before the slot's release store: a peer that sees this call's number sees the flag */
    __atomic_store_n(&ctrl[COLL_CTRL_FLAG + (int)(seq & 1)], 2 * seq + (flag ? 1 : 0), __ATOMIC_RELAXED);
    coll_ctrl_sign(ctrl, seq, signature);
}

int coll_ctrl_agree(int64_t *const *ctrl, int nranks, int me, int64_t seq, int64_t signature, int64_t *out)
{
    int64_t flags = 1;
    for (int q = 0; q < nranks; q++) {
        if (q == me)
            continue;
        const int state = coll_ctrl_compare(ctrl[q], seq, signature);
        if (state != 1) {
            *out = q;
            return state == 0 ? 0 : -1;
        }
        /* a peer cannot overwrite this word (by signing seq + 2) before this rank has signed seq + 1 */
        const int64_t word = load(&ctrl[q][COLL_CTRL_FLAG + (int)(seq & 1)]);
        flags &= (word >> 1) == seq ? (word & 1) : 0;
    }
    *out = flags;
    return 1;
}

/* -1 when rank q shows a mismatch of this call (a -1 or -2 from coll_ctrl_compare), else 0; marks q checked
 * once it has started the call with the same signature. */
static int check_peer(struct coll_plan_call *call, int q)
{
    if (!call->check)
        return 0;
    if (call->checked[q]) { /* the same call as ours: it can only have found a mismatch elsewhere since */
        if (load(&call->ctrl[q][COLL_CTRL_POISON]) != call->seq)
            return 0;
        call->waiting = q;
        call->poisoned = 1;
        return -1;
    }
    const int state = coll_ctrl_compare(call->ctrl[q], call->seq, call->signature);
    if (state == 1) {
        call->checked[q] = 1;
        return 0;
    }
    if (state < 0) {
        call->waiting = q;
        call->poisoned = state == -2;
        return -1;
    }
    return 0;
}

/* Ranks that share cores yield between polls: the peer awaited may be waiting for this core. A wait that
 * has lasted nap_after_ns sleeps instead, because a rank that yields for milliseconds still takes a share of
 * the core from a core-mate that works (Linux's EEVDF scheduler). */
static void pause_between_polls(struct coll_plan_call *call, int yield_cpu)
{
    if (!yield_cpu) {
        CPU_RELAX();
        return;
    }
    const int64_t now = monotonic_ns();
    if (call->wait_since_ns == 0)
        call->wait_since_ns = now;
    if (call->nap_after_ns > 0 && call->nap_ns > 0 && now - call->wait_since_ns >= call->nap_after_ns) {
        const struct timespec nap = {call->nap_ns / 1000000000, call->nap_ns % 1000000000};
        nanosleep(&nap, NULL);
    } else
        sched_yield();
}

/* 1: the counter reached target; 0: not within `polls` polls; -1: a mismatch (call->waiting says who). A wait
 * for this call's progress (`checked_wait`) also watches the peer's signature slot and poison word, which sit
 * in the cache line it polls anyway. */
static int wait_for(struct coll_plan_call *call, int q, const int64_t *counter, int64_t target, int checked_wait,
                    int64_t polls, int yield_cpu)
{
    for (int64_t i = 0;; i++) {
        if (load(counter) >= target) {
            /* the peer published progress of this call, so it wrote its signature slot before */
            if (checked_wait && check_peer(call, q))
                return -1;
            return 1;
        }
        if (checked_wait && check_peer(call, q))
            return -1;
        if (i >= polls)
            return 0;
        pause_between_polls(call, yield_cpu);
    }
}

/* One fused reduction of `n` operands (buffer, offset) pairs read from `w` into dst. */
/* Where byte `off` of buffer b lies for this call: windows at the call's half. */
static char *address(const struct coll_plan_call *call, int64_t b, int64_t off)
{
    return call->buffers[b] + off + (b >= call->first_window ? call->shift : 0);
}

static int reduce(const struct coll_plan_call *call, void *dst, const int64_t *w, int64_t n, int64_t count)
{
    const void *stack_in[MAX_STACK_OPERANDS];
    unsigned char stack_f32[MAX_STACK_OPERANDS] = {0};
    const void **in = stack_in;
    unsigned char *in_f32 = stack_f32;
    if (n > MAX_STACK_OPERANDS) { /* more ranks on one host than fit on the stack */
        in = malloc((size_t)n * sizeof *in);
        in_f32 = calloc((size_t)n, 1);
        if (in == NULL || in_f32 == NULL) {
            free(in);
            free(in_f32);
            return COLL_PLAN_NO_MEMORY;
        }
    }
    for (int64_t k = 0; k < n; k++)
        in[k] = address(call, w[2 * k], w[2 * k + 1]);
    int rc = call->kind == COLL_PLAN_NATIVE
                 ? coll_reduce(call->dtype, call->op, dst, in, (size_t)n, (size_t)count)
                 : coll_reduce_half(call->dtype, call->op, dst, 0, in, in_f32, (size_t)n, (size_t)count);
    if (in != stack_in) {
        free(in);
        free(in_f32);
    }
    return rc == 0 ? 0 : COLL_PLAN_KERNEL_REFUSED;
}

int coll_peer_read(int64_t pid, void *dst, int64_t address, int64_t nbytes)
{
#ifdef __linux__
    char *to = dst;
    while (nbytes > 0) { /* a read may stop short (e.g. at a page it could not pin): go on from there */
        struct iovec local = {to, (size_t)nbytes};
        struct iovec remote = {(void *)(uintptr_t)address, (size_t)nbytes};
        const ssize_t got = process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            return EFAULT;
        to += got;
        address += got;
        nbytes -= got;
    }
    return 0;
#else
    (void)pid; (void)dst; (void)address; (void)nbytes;
    return ENOSYS;
#endif
}

int coll_allow_peer_reads(void)
{
#if defined(__linux__) && defined(PR_SET_PTRACER)
    return prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0 || errno == EINVAL ? 0 : errno;
#else
    return 0;
#endif
}

static int stop_at(struct coll_plan_call *call, int64_t i, int status)
{
    call->ip = i;
    if (status == COLL_PLAN_MISMATCH)
        coll_ctrl_poison(call->ctrl[call->me], call->seq); /* peers blocked on this rank learn it too */
    return status;
}

int coll_plan_run(struct coll_plan_call *call, int64_t polls, int yield_cpu, int restart)
{
    const int64_t *code = call->code;
    int64_t *const *ctrl = call->ctrl;
    const int me = call->me;
    int64_t *const mine = ctrl[me];
    /* A call's state starts with the call, not at ip 0: a program that begins with a wait resumes there. */
    if (restart) {
        call->ip = 0;
        call->base = __atomic_load_n(&mine[COLL_CTRL_DONE], __ATOMIC_RELAXED); /* only this rank writes it */
        call->events = 0;
        call->wait_since_ns = 0;
        call->waiting = -1;
        call->poisoned = 0;
        /* the window part this call writes, and the readers it must wait for before writing it (the private
         * `reuse` words: only this rank reads and writes them, so relaxed) */
        int64_t *reuse = &mine[COLL_CTRL_REUSE];
        const int64_t end = call->base + call->steps;
        if (call->half_bytes > 0) {
            const int h = (int)(call->seq & 1);
            call->shift = h * call->half_bytes;
            call->reuse = __atomic_load_n(&reuse[h], __ATOMIC_RELAXED);
            __atomic_store_n(&reuse[h], end, __ATOMIC_RELAXED);
        } else {
            const int64_t r0 = __atomic_load_n(&reuse[0], __ATOMIC_RELAXED);
            const int64_t r1 = __atomic_load_n(&reuse[1], __ATOMIC_RELAXED);
            call->shift = 0;
            call->reuse = r0 > r1 ? r0 : r1;
            __atomic_store_n(&reuse[0], end, __ATOMIC_RELAXED);
            __atomic_store_n(&reuse[1], end, __ATOMIC_RELAXED);
        }
        /* where peers' PEER_READs find this call's node state: published by the release stores that follow */
        __atomic_store_n(&mine[COLL_CTRL_ORIGIN],
                         (int64_t)((uintptr_t)call->buffers[call->origin_buf] - (uintptr_t)call->origin_shift),
                         __ATOMIC_RELAXED);
        if (call->check) {
            memset(call->checked, 0, (size_t)call->nranks);
            call->checked[me] = 1;
            coll_ctrl_sign(mine, call->seq, call->signature);
        }
    }
    int64_t i = call->ip;
    const int64_t base = call->base;
    for (;;) {
        const int64_t *w = code + i;
        switch (w[0]) {
        case COLL_PLAN_END:
            call->waiting = -1;
            return stop_at(call, i, COLL_PLAN_DONE);
        case COLL_PLAN_WAIT_DONE:
        case COLL_PLAN_WAIT_READ: {
            const int q = (int)w[1];
            const int64_t *counter = &ctrl[q][w[0] == COLL_PLAN_WAIT_DONE ? COLL_CTRL_DONE : COLL_CTRL_READ];
            /* a wait at offset 0 is for earlier calls (their readers are done with this call's part of the
             * window: `reuse`): no signature of ours yet */
            const int64_t target = w[2] == 0 && w[0] == COLL_PLAN_WAIT_READ ? call->reuse : base + w[2];
            const int rc = wait_for(call, q, counter, target, w[2] > 0, polls, yield_cpu);
            if (rc < 0)
                return stop_at(call, i, COLL_PLAN_MISMATCH);
            if (rc == 0) {
                call->waiting = q;
                return stop_at(call, i, COLL_PLAN_WAITING);
            }
            call->wait_since_ns = 0;
            call->events++;
            i += 3;
            break;
        }
        case COLL_PLAN_CHECK_ALL:
            for (int q = 0; call->check && q < call->nranks; q++) {
                if (call->checked[q])
                    continue;
                const int rc = wait_for(call, q, &ctrl[q][COLL_CTRL_SIG_SEQ + (int)(call->seq & 1) * 2],
                                        call->seq, 1, polls, yield_cpu);
                if (rc < 0)
                    return stop_at(call, i, COLL_PLAN_MISMATCH);
                if (rc == 0 || !call->checked[q]) { /* not started yet (or a stale slot number): wait on */
                    call->waiting = q;
                    return stop_at(call, i, COLL_PLAN_WAITING);
                }
                call->wait_since_ns = 0;
            }
            i += 1;
            break;
        case COLL_PLAN_COPY:
            memcpy(address(call, w[1], w[2]), address(call, w[3], w[4]), (size_t)w[5]);
            i += 6;
            break;
        case COLL_PLAN_PEER_READ: {
            const int64_t *peer = ctrl[w[3]]; /* its PID and ORIGIN: visible since the wait on its done */
            const int rc = coll_peer_read(load(&peer[COLL_CTRL_PID]), address(call, w[1], w[2]),
                                          load(&peer[COLL_CTRL_ORIGIN]) + w[4], w[5]);
            if (rc != 0) {
                call->error = rc;
                call->waiting = w[3];
                return stop_at(call, i, COLL_PLAN_PEER_READ_FAILED);
            }
            i += 6;
            break;
        }
        case COLL_PLAN_REDUCE: {
            const int64_t n = w[4];
            const int rc = n < 1 ? COLL_PLAN_BAD_CODE : reduce(call, address(call, w[1], w[2]), w + 5, n, w[3]);
            if (rc != 0)
                return stop_at(call, i, rc);
            i += 5 + 2 * n;
            break;
        }
        case COLL_PLAN_PUBLISH:
            __atomic_store_n(&mine[COLL_CTRL_READ], base + w[1], __ATOMIC_RELEASE);
            __atomic_store_n(&mine[COLL_CTRL_DONE], base + w[1], __ATOMIC_RELEASE);
            call->events++;
            i += 2;
            break;
        case COLL_PLAN_SET_READ:
            __atomic_store_n(&mine[COLL_CTRL_READ], base + w[1], __ATOMIC_RELEASE);
            i += 2;
            break;
        default:
            return stop_at(call, i, COLL_PLAN_BAD_CODE);
        }
    }
}
