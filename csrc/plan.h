/* A shared-memory plan runner: executes a flat instruction stream of copies, fused reductions and waits on
 * peers' counters, so one collective over shared memory runs without returning to Python between rounds.
 *
 * It knows nothing of schedules: the transport (collectives/transport/shm/program.py) compiles a schedule's
 * per-rank shared-memory plan into these instructions; this file only moves bytes, calls the reduction
 * kernels of reduce.c, waits, and checks that every rank runs the same call (below).
 *
 * Instruction words (int64), operands in bytes:
 *   END
 *   WAIT_DONE  q off            until done[q] >= base + off (acquire)
 *   WAIT_READ  q off            until read[q] >= base + off (acquire)
 *   COPY       dst_buf dst_off src_buf src_off nbytes
 *   REDUCE     dst_buf dst_off count n  (buf off) x n      dst = in[0] op ... op in[n-1], one kernel call
 *   PUBLISH    off              read[me] = done[me] = base + off (release)
 *   SET_READ   off              read[me] = base + off (release)
 *   CHECK_ALL                   every peer not yet checked in this call has started it with this signature
 *   PEER_READ  dst_buf dst_off q src_off nbytes
 *                               copy nbytes of rank q's node state from byte src_off, in q's own memory (its
 *                               `origin` for this call: its input where the state still lies there, else its
 *                               work buffer), one copy instead of two through q's window (Linux cross-memory
 *                               attach, process_vm_readv). The program waits on q's `done` first, which q
 *                               publishes after its origin; q waits for this rank's last `read` before its
 *                               call returns, so the memory stays valid and unchanged while it is read.
 * `buffers[b]` is the base address of buffer b (the transport numbers them: work, input, output, peers' windows).
 *
 * Double-buffered windows: a call whose window part fits in half of every window (`half_bytes`) uses half
 * (seq & 1), so a rank may write call k + 1 while its peers still read call k. WAIT_READ at offset 0 (the
 * first write of a call into its window) then waits for the peers to be done with the last call that wrote
 * that half (`reuse`), not with the previous call; a call that does not fit uses the whole window and waits for
 * both halves. Every rank decides alike (same seq, window size and call), so readers read the half written.
 *
 * Control block of rank q (COLL_CTRL_WORDS int64 in shared memory, `ctrl[q]`): its `done` counter, two
 * signature slots (call number, signature hash; slot = call number & 1), a poison word and two flag words (one
 * per slot: 2 x call number + a bit, written by the Python agreement before it signs; the runner ignores them),
 * in one cache line, then its `read` counter in the next, and two private words (`reuse`, one per window half:
 * the `read` value at which the peers are done with the last call that wrote that half), then for PEER_READ its process
 * id, its `origin` for the call in flight (written by a restart) and its control block's own address (what the
 * transport's probe reads at setup). The call agreement rides on the waits a call makes anyway: a run writes
 * its signature slot first; every wait on a peer for this call (target above the call's base) also reads the
 * peer's slot, in the line it polls: a peer that has started the same call number with another signature is a
 * mismatch, and so is a peer whose poison word names this call (it found a mismatch: it propagates); CHECK_ALL
 * waits for the peers this call never waited on to start it, and compares. Every rank so compares its signature
 * with every peer's before its call returns, and a mismatch is reported by every rank (it sets its own poison
 * word so that a peer blocked on it learns too) instead of a hang or wrong data.
 *
 * The declarations between the CDEF markers are read verbatim by csrc/build_kernels.py as the cffi cdef.
 */
#ifndef COLLECTIVES_PLAN_H
#define COLLECTIVES_PLAN_H

#include <stdint.h>

/* CDEF-BEGIN */
enum coll_plan_opcode {
    COLL_PLAN_END = 0, COLL_PLAN_WAIT_DONE = 1, COLL_PLAN_WAIT_READ = 2, COLL_PLAN_COPY = 3,
    COLL_PLAN_REDUCE = 4, COLL_PLAN_PUBLISH = 5, COLL_PLAN_SET_READ = 6, COLL_PLAN_CHECK_ALL = 7,
    COLL_PLAN_PEER_READ = 8
};
enum coll_plan_kind { COLL_PLAN_NATIVE = 0, COLL_PLAN_HALF = 1 };
enum coll_ctrl_word {
    COLL_CTRL_DONE = 0, COLL_CTRL_SIG_SEQ = 1, COLL_CTRL_SIG_HASH = 2, COLL_CTRL_POISON = 5, COLL_CTRL_FLAG = 6,
    COLL_CTRL_READ = 8, COLL_CTRL_REUSE = 9, COLL_CTRL_PID = 11, COLL_CTRL_ORIGIN = 12, COLL_CTRL_SELF = 13,
    COLL_CTRL_WORDS = 16
};
enum coll_plan_status {
    COLL_PLAN_DONE = 0, COLL_PLAN_WAITING = 1, COLL_PLAN_BAD_CODE = -1, COLL_PLAN_KERNEL_REFUSED = -2,
    COLL_PLAN_NO_MEMORY = -3, COLL_PLAN_MISMATCH = -4, COLL_PLAN_PEER_READ_FAILED = -5
};

/* One call of a program: set up once per runner, then per call only the WORK, SOURCE and OUT buffers, the call
 * number `seq` (and a run with `restart`). */
struct coll_plan_call {
    const int64_t *code;
    char **buffers;        /* buffers[b]: base address of buffer b */
    int64_t *const *ctrl;  /* every rank's control block in the shared control window */
    unsigned char *checked; /* per rank: its signature was compared during this call (nranks entries) */
    int64_t ip;            /* next instruction word (a run with `restart` sets it to 0) */
    int64_t base;          /* counters' value before the call (read from done[me] by a run with `restart`) */
    int64_t waiting;       /* the peer a returned wait (or a mismatch) is about, -1 when none */
    int64_t events;        /* waits passed and counters published during this call */
    int64_t nap_after_ns;  /* yielding waits sleep nap_ns per poll once they have lasted this long (0: never) */
    int64_t nap_ns;        /* 0 or less: never sleep */
    int64_t wait_since_ns; /* CLOCK_MONOTONIC when the current wait's first poll yielded, 0 when none */
    int64_t seq;           /* the call's number on its communicator (the same on every rank of a matching call) */
    int64_t signature;     /* hash of what every rank must agree on (collective, count, dtype, op, root, ...) */
    int64_t poisoned;      /* 1: the peer in `waiting` reported a mismatch of this call (propagated) */
    int64_t steps;         /* counter steps of the call: every counter ends it at base + steps */
    int64_t half_bytes;    /* > 0: the call uses half (seq & 1) of every window, at this byte offset times it */
    int64_t reuse;         /* the peers' `read` that frees this call's part of the window (set by a restart) */
    int64_t shift;         /* byte offset of this call's half in every window (set by a restart) */
    int64_t origin_buf;    /* the buffer where this rank's node state begins for peers' PEER_READ (SOURCE when */
    int64_t origin_shift;  /* the input is read where it lies), minus origin_shift bytes: published by a restart */
    int64_t error;         /* errno of a failed PEER_READ */
    int first_window;      /* buffers[first_window + q] is rank q's window */
    int me;
    int nranks;
    int check;             /* 1: compare signatures (the call agreement); 0: trust the caller */
    int kind;              /* COLL_PLAN_NATIVE: coll_reduce(dtype, op); COLL_PLAN_HALF: coll_reduce_half */
    int dtype;
    int op;
};

/* Run the call from call->ip, or start it when `restart` (ip, base, events, the wait clock and the checked
 * peers reset, this rank's signature slot written). A wait that is not satisfied is polled up to `polls` times
 * (a pause between polls; sched_yield when `yield_cpu`, and once such a wait has lasted nap_after_ns, a
 * nanosleep of nap_ns); then it returns COLL_PLAN_WAITING with ip at the wait and `waiting` set, so the caller
 * can check its deadline and call again. Returns COLL_PLAN_DONE once END is reached, COLL_PLAN_MISMATCH (with
 * `waiting` the peer and `poisoned` telling whether that peer only passed the news on) when the ranks run
 * different calls, or a negative error code. */
int coll_plan_run(struct coll_plan_call *call, int64_t polls, int yield_cpu, int restart);

/* The signature slot and poison word helpers the Python side uses for calls that do not run a program
 * (MPI's own collectives, point-to-point messages) on a host whose ranks share the control window. */
void coll_ctrl_sign(int64_t *ctrl, int64_t seq, int64_t signature);
void coll_ctrl_poison(int64_t *ctrl, int64_t seq);
/* 1: rank q started call `seq` with this signature, or signed a later call (it finished this one); 0: not yet;
 * -1: another signature; -2: q reported a mismatch of this call (its poison word). */
int coll_ctrl_compare(const int64_t *ctrl_q, int64_t seq, int64_t signature);
/* This rank's flag word for call `seq` (2 x seq + flag), then its signature slot. */
void coll_ctrl_sign_flag(int64_t *ctrl, int64_t seq, int64_t signature, int64_t flag);
/* The agreement of call `seq` for a call the plan runner does not execute, every peer at once: 1 when every
 * peer has started it with this signature (or finished it), *out = 1 when every peer's flag word for this call
 * has its bit set, else 0; 0 while a peer has not started it (*out = that peer); -1 when a peer shows another
 * signature or a poison word for this call (*out = that peer). */
int coll_ctrl_agree(int64_t *const *ctrl, int nranks, int me, int64_t seq, int64_t signature, int64_t *out);
/* One cross-memory read: nbytes at `address` in process `pid` into dst. 0, or the errno of the failure
 * (ENOSYS where the system has no process_vm_readv). */
int coll_peer_read(int64_t pid, void *dst, int64_t address, int64_t nbytes);
/* Let any process of this user read this one's memory where a Linux security module (Yama's ptrace_scope 1)
 * allows it only to ancestors: what MPI libraries do for the same single-copy transfers. 0 or an errno. */
int coll_allow_peer_reads(void);
/* CDEF-END */

#endif
