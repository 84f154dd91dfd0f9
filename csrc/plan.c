/* The shared-memory plan runner (see plan.h for the instruction set). */
#include "plan.h"
#include "reduce.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
 * also holds on weakly ordered CPUs, where the Python executor fences with MPI_Win_sync instead). */
static int reached(int64_t *const counter, int64_t target)
{
    return __atomic_load_n(counter, __ATOMIC_ACQUIRE) >= target;
}

static int64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Ranks that share cores yield between polls: the peer awaited may be waiting for this core. A wait that
 * has lasted nap_after_ns sleeps instead, because a rank that yields for milliseconds still takes a share of
 * the core from a core-mate that works (Linux's EEVDF scheduler, measured with bench/tree_steps.py: steps
 * over ~3 ms ran 1.4-1.9x slower beside yielding waiters than beside sleeping ones). */
static int wait_for(struct coll_plan_call *call, int64_t *const counter, int64_t target, int64_t polls,
                    int yield_cpu)
{
    for (int64_t i = 0; i < polls; i++) {
        if (reached(counter, target))
            return 1;
        if (!yield_cpu) {
            CPU_RELAX();
            continue;
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
    return reached(counter, target);
}

/* One fused reduction of `n` operands (buffer, offset) pairs read from `w` into dst. */
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
            return -3;
        }
    }
    for (int64_t k = 0; k < n; k++)
        in[k] = call->buffers[w[2 * k]] + w[2 * k + 1];
    int rc = call->kind == COLL_PLAN_NATIVE
                 ? coll_reduce(call->dtype, call->op, dst, in, (size_t)n, (size_t)count)
                 : coll_reduce_half(call->dtype, call->op, dst, 0, in, in_f32, (size_t)n, (size_t)count);
    if (in != stack_in) {
        free(in);
        free(in_f32);
    }
    return rc == 0 ? 0 : -2;
}

int coll_plan_run(struct coll_plan_call *call, int64_t polls, int yield_cpu, int restart)
{
    const int64_t *code = call->code;
    char **buffers = call->buffers;
    int64_t *const *done = call->done, *const *read = call->read;
    const int me = call->me;
    /* A call's state starts with the call, not at ip 0: a program that begins with a wait resumes there. */
    if (restart) {
        call->ip = 0;
        call->base = __atomic_load_n(done[me], __ATOMIC_RELAXED); /* only this rank writes its counters */
        call->events = 0;
        call->wait_since_ns = 0;
    }
    int64_t i = call->ip;
    const int64_t base = call->base;
    for (;;) {
        const int64_t *w = code + i;
        switch (w[0]) {
        case COLL_PLAN_END:
            call->ip = i;
            call->waiting = -1;
            return 0;
        case COLL_PLAN_WAIT_DONE:
        case COLL_PLAN_WAIT_READ: {
            int64_t *const counter = (w[0] == COLL_PLAN_WAIT_DONE ? done : read)[w[1]];
            if (!reached(counter, base + w[2]) && !wait_for(call, counter, base + w[2], polls, yield_cpu)) {
                call->ip = i;
                call->waiting = w[1];
                return 1;
            }
            call->wait_since_ns = 0;
            call->events++;
            i += 3;
            break;
        }
        case COLL_PLAN_COPY:
            memcpy(buffers[w[1]] + w[2], buffers[w[3]] + w[4], (size_t)w[5]);
            i += 6;
            break;
        case COLL_PLAN_REDUCE: {
            int64_t n = w[4];
            int rc = n < 1 ? -1 : reduce(call, buffers[w[1]] + w[2], w + 5, n, w[3]);
            if (rc != 0) {
                call->ip = i;
                return rc;
            }
            i += 5 + 2 * n;
            break;
        }
        case COLL_PLAN_PUBLISH:
            __atomic_store_n(read[me], base + w[1], __ATOMIC_RELEASE);
            __atomic_store_n(done[me], base + w[1], __ATOMIC_RELEASE);
            call->events++;
            i += 2;
            break;
        case COLL_PLAN_SET_READ:
            __atomic_store_n(read[me], base + w[1], __ATOMIC_RELEASE);
            i += 2;
            break;
        default:
            call->ip = i;
            return -1;
        }
    }
}
