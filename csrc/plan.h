/* A shared-memory plan runner: executes a flat instruction stream of copies, fused reductions and waits on
 * peers' counters, so one collective over shared memory runs without returning to Python between rounds.
 *
 * It knows nothing of schedules: the transport (collectives/transport/shm_program.py) compiles a schedule's
 * per-rank shared-memory plan into these instructions; this file only moves bytes, calls the reduction
 * kernels of reduce.c and waits.
 *
 * Instruction words (int64), operands in bytes:
 *   END
 *   WAIT_DONE  q off            until done[q] >= base + off (acquire)
 *   WAIT_READ  q off            until read[q] >= base + off (acquire)
 *   COPY       dst_buf dst_off src_buf src_off nbytes
 *   REDUCE     dst_buf dst_off count n  (buf off) x n      dst = in[0] op ... op in[n-1], one kernel call
 *   PUBLISH    off              read[me] = done[me] = base + off (release)
 *   SET_READ   off              read[me] = base + off (release)
 * `buffers[b]` is the base address of buffer b (the transport numbers them: work, input, peers' windows).
 *
 * The declarations between the CDEF markers are read verbatim by csrc/build_kernels.py as the cffi cdef.
 */
#ifndef COLLECTIVES_PLAN_H
#define COLLECTIVES_PLAN_H

#include <stdint.h>

/* CDEF-BEGIN */
enum coll_plan_opcode {
    COLL_PLAN_END = 0, COLL_PLAN_WAIT_DONE = 1, COLL_PLAN_WAIT_READ = 2, COLL_PLAN_COPY = 3,
    COLL_PLAN_REDUCE = 4, COLL_PLAN_PUBLISH = 5, COLL_PLAN_SET_READ = 6
};
enum coll_plan_kind { COLL_PLAN_NATIVE = 0, COLL_PLAN_HALF = 1 };

/* One call of a program: set up once per runner, then per call only the WORK and SOURCE buffers (and a run with
 * `restart`). */
struct coll_plan_call {
    const int64_t *code;
    char **buffers;        /* buffers[b]: base address of buffer b */
    int64_t *const *done;  /* every rank's counters in the shared control window */
    int64_t *const *read;
    int64_t ip;            /* next instruction word (a run with `restart` sets it to 0) */
    int64_t base;          /* counters' value before the call (read from done[me] by a run with `restart`) */
    int64_t waiting;       /* the peer a returned wait is for, -1 when none */
    int64_t events;        /* waits passed and counters published during this call */
    int64_t nap_after_ns;  /* yielding waits sleep nap_ns per poll once they have lasted this long (0: never) */
    int64_t nap_ns;        /* 0 or less: never sleep */
    int64_t wait_since_ns; /* CLOCK_MONOTONIC when the current wait's first poll yielded, 0 when none */
    int me;
    int kind;              /* COLL_PLAN_NATIVE: coll_reduce(dtype, op); COLL_PLAN_HALF: coll_reduce_half */
    int dtype;
    int op;
};

/* Run the call from call->ip, or start it when `restart` (ip, base, events and the wait clock reset: a call that
 * begins with a wait resumes at ip 0 without restarting). A wait that is not satisfied is polled up to `polls`
 * times (a pause between polls; sched_yield when `yield_cpu`, and once such a wait has lasted nap_after_ns, a
 * nanosleep of nap_ns, so one run can then block for polls x ~20-75 us before returning); then it returns 1
 * with ip at the wait and `waiting` set, so the caller can check its deadline and call again. Returns 0 once
 * END is reached, -1 for a bad instruction, -2 when a reduction kernel refused its dtype/op, -3 when operand
 * arrays could not be allocated. */
int coll_plan_run(struct coll_plan_call *call, int64_t polls, int yield_cpu, int restart);
/* CDEF-END */

#endif
