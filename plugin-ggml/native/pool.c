/* The ops' own thread pool: the caller never waits for a thread that has not started.
 *
 * ggml's CPU backend runs a graph on n threads with a barrier after every node, so each node
 * waits for the slowest thread to arrive. Where another program holds one of the cores (a
 * desktop's browser, a shared VM's neighbour) a worker that slept at that barrier waits for the
 * OS to give its core back, and the whole graph waits with it: measured on a 2-core VM, the
 * bench UNet ran 1.1-1.3x onnxruntime's time with a busy loop on one core, where onnxruntime
 * lost 5-8% (docs/ggml.md, "The ops' own thread pool").
 *
 * So a session whose graph is all sdrt ops (and ggml's cheap ones) is computed by ggml on ONE
 * thread, and each sdrt op spreads itself over this pool, the way onnxruntime's parallel-for
 * does: the op's tasks go to whoever takes them, the caller first; a worker that is awake
 * takes tasks too, and the caller waits only for tasks that a worker has started. A worker held
 * back by the OS costs its share of the work, never a wait for work it has not started.
 *
 *   sdrt_pool_set_width(n)   the calling thread's width: its ops' thread count (0 or 1: none)
 *   SDRT_POOLED(fn)          the first line of an op with a fixed split (ith of nth): with ggml on
 *                            one thread and a width above one, it runs fn's width x
 *                            SDRT_GGML_TASKS (default 4) tasks on the pool and returns. Small
 *                            tasks: a worker the OS preempts holds back one of them, not half
 *                            the op, and the running threads take the rest.
 *   SDRT_POOLED_SHARED(fn)   the same with width tasks, for ops whose threads share a counter of
 *                            units (GEMM, convs): already fine-grained, and nth sizes the units
 *
 * Workers spin on the job word for SDRT_GGML_SPIN_US microseconds (default 200: the gaps
 * between ops inside one graph), then sleep on a condition variable until the next job. The
 * caller, out of tasks, spins SDRT_GGML_WAIT_US (default 50) for workers still inside a task, then
 * sleeps until the last one leaves: a worker that the OS preempted mid-task then finds the
 * caller's core idle rather than spun on. A thread that has spun SDRT_GGML_YIELD_US (default 20;
 * -1: never) yields its core at each check while it spins on: where the OS puts the caller and a
 * waiting worker on one core (a busy program on the other), the worker's spin no longer takes the
 * caller's time. Only one job runs at a time: a second caller (another
 * Python thread's session) runs its op inline.
 *
 * Beside a busy program (issue 38 point 5, docs/ggml.md "Loaded: where the threads run"), on Linux:
 *   SDRT_GGML_PIN (default 3)  1: worker i runs only on the (i+1)-th CPU that the first caller may use
 *                        (its affinity within the process's cpuset; the first is left to the caller; no
 *                        pin for a worker whose CPU would not exist), so a caller's wakeup cannot put
 *                        it on the caller's core. 2: also, while a worker's core is contended (below),
 *                        the caller's affinity leaves the workers' CPUs for the rest of its graph
 *                        (sdrt_pool_release gives it back), and the caller, alone on its core, spins
 *                        SDRT_GGML_WAIT_PINNED_US (1000) for a worker inside a task, never yielding:
 *                        a caller that sleeps leaves an idle core that the OS fills with the busy
 *                        program. 3: as 2, but a worker is pinned only while it is contended
 *                        during long jobs (below), or for SDRT_GGML_PIN_HOLD_MS (default 1000) after its
 *                        spin last lost its core whatever the jobs' length, so an idle machine runs the
 *                        pool unpinned. 0: neither. The caller leaves the workers' CPUs while any is
 *                        contended, in graphs of short jobs too: beside a busy program, the MobileNets'
 *                        20-60 µs jobs then get 1.2-1.4 cores where they got 1.0-1.15.
 *   SDRT_GGML_CONTENDED_MS (default 100; 0: never)  a worker whose spin was interrupted for over
 *                        100 µs (the OS ran another thread on its core) sleeps right after each job
 *                        for this long, without spinning: woken at the next job, a thread that slept
 *                        runs at once beside the busy program, where a spinning one waits out the
 *                        other's time slice. Then it spins again, and goes on sleeping if interrupted.
 *   SDRT_GGML_LONG_JOB_US (default 200; 0: every job)  ... but only while at least 40% of the recent
 *                        jobs' time (about the last 64, each counted up to 4x this bound) lay in jobs
 *                        of this length or more, a job's length being the caller's time until it found
 *                        no task left. A graph of 20-60 µs ops (the MobileNets) keeps spinning between
 *                        jobs, as before: a wakeup per job costs it more than the sleeping gains. The
 *                        SD graphs' GEMMs (0.3-1 ms) put 60-95% of their time in long jobs.
 * Together these place the threads as onnxruntime's do: the caller alone on one core, the worker
 * sharing the other with the busy program (measured: 1.34-1.47 cores of CPU time, the default before
 * them 0.9-1.05).
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getaffinity, pthread_setaffinity_np, CPU_SET */
#endif
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include "sdrt_native.h"

#include <stdlib.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#endif
#if defined(SDRT_X86) && !defined(_MSC_VER)
#include <immintrin.h>
#endif

#define MAX_WORKERS 255

/* ---- atomics (seq_cst: the job word and the counters pair up as in Dekker's algorithm) ------ */
#if defined(_MSC_VER)
#include <intrin.h>
#define A_LOAD64(p) _InterlockedOr64((volatile __int64 *)(p), 0)
#define A_STORE64(p, v) _InterlockedExchange64((volatile __int64 *)(p), (__int64)(v))
#define A_LOAD(p) _InterlockedOr((volatile long *)(p), 0)
#define A_ADD(p, v) _InterlockedExchangeAdd((volatile long *)(p), (long)(v))
#define A_STORE(p, v) _InterlockedExchange((volatile long *)(p), (long)(v))
#define A_CAS(p, old, new) (_InterlockedCompareExchange((volatile long *)(p), (long)(new), (long)(old)) == (long)(old))
#else
#define A_LOAD64(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define A_STORE64(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define A_LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define A_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define A_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define A_CAS(p, old, new) __atomic_compare_exchange_n((p), &(long){(old)}, (new), 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
#endif

static void cpu_relax(void) {
#if defined(SDRT_X86) && defined(_MSC_VER)
    _mm_pause();
#elif defined(SDRT_X86)
    _mm_pause();
#elif defined(SDRT_ARM64) && defined(_MSC_VER)
    __yield();
#elif defined(SDRT_ARM64)
    __asm__ __volatile__("yield");
#endif
}

/* ---- the platform: a monotonic clock, a mutex and condition variable, a thread ---------------- */
#if defined(_WIN32)
typedef SRWLOCK pool_mutex;
typedef CONDITION_VARIABLE pool_cond;
static int64_t now_ns(void) {
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (int64_t)((double)c.QuadPart * 1e9 / (double)f.QuadPart);
}
static void yield_core(void) { SwitchToThread(); }
static void mutex_init(pool_mutex *m) { InitializeSRWLock(m); }
static void mutex_lock(pool_mutex *m) { AcquireSRWLockExclusive(m); }
static int mutex_trylock(pool_mutex *m) { return TryAcquireSRWLockExclusive(m) ? 0 : 1; }
static void mutex_unlock(pool_mutex *m) { ReleaseSRWLockExclusive(m); }
static void cond_init(pool_cond *c) { InitializeConditionVariable(c); }
static void cond_wait(pool_cond *c, pool_mutex *m) { SleepConditionVariableSRW(c, m, INFINITE, 0); }
static void cond_broadcast(pool_cond *c) { WakeAllConditionVariable(c); }
static long process_id(void) { return (long)GetCurrentProcessId(); }
static DWORD WINAPI worker_main_win(LPVOID arg);
static int start_thread(long cpu, int pin_now) {
    (void)cpu; /* no pin on Windows (cpu is always -1 there) */
    (void)pin_now;
    /* the stack size that Linux gives its threads, as ggml's own workers have there */
    HANDLE h = CreateThread(NULL, 8u << 20, worker_main_win, NULL, STACK_SIZE_PARAM_IS_A_RESERVATION, NULL);
    if (!h)
        return -1;
    CloseHandle(h);
    return 0;
}
#else
typedef pthread_mutex_t pool_mutex;
typedef pthread_cond_t pool_cond;
static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static void yield_core(void) { sched_yield(); }
static void mutex_init(pool_mutex *m) { pthread_mutex_init(m, NULL); }
static void mutex_lock(pool_mutex *m) { pthread_mutex_lock(m); }
static int mutex_trylock(pool_mutex *m) { return pthread_mutex_trylock(m); }
static void mutex_unlock(pool_mutex *m) { pthread_mutex_unlock(m); }
static void cond_init(pool_cond *c) { pthread_cond_init(c, NULL); }
static void cond_wait(pool_cond *c, pool_mutex *m) { pthread_cond_wait(c, m); }
static void cond_broadcast(pool_cond *c) { pthread_cond_broadcast(c); }
static long process_id(void) { return (long)getpid(); }
static void *worker_main(void *arg);
/* a worker's thread attributes: Linux's stack size, detached */
static int worker_attr(pthread_attr_t *attr) {
    if (pthread_attr_init(attr))
        return -1;
    pthread_attr_setstacksize(attr, 8u << 20); /* macOS gives a thread 512 KiB otherwise */
    pthread_attr_setdetachstate(attr, PTHREAD_CREATE_DETACHED);
    return 0;
}

static int start_thread(long cpu, int pin_now) {
    pthread_attr_t attr;
    pthread_t t;
    if (worker_attr(&attr))
        return -1;
    int rc = -1;
#if defined(__linux__) && defined(__GLIBC__)
    if (cpu >= 0 && pin_now) { /* pinned from its start (worker_main pins it again: elsewhere, there only) */
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)cpu, &set);
        if (pthread_attr_setaffinity_np(&attr, sizeof set, &set) == 0)
            rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)cpu);
        if (rc) { /* refused (the CPU is not ours after all): a worker without the pin */
            pthread_attr_destroy(&attr);
            if (worker_attr(&attr))
                return -1;
        }
    }
#else
    (void)pin_now;
#endif
    if (rc)
        rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)cpu);
    pthread_attr_destroy(&attr);
    return rc ? -1 : 0;
}
#endif

/* ---- the pool -------------------------------------------------------------------------------- */
static struct {
    /* the job word, rising: odd while a job is open. A job is published by storing the next odd
     * value, after its fields below; closed (the next even value) once the caller has found no
     * task left. */
    volatile int64_t job;
    sdrt_op_fn fn;
    void *dst, *userdata;
    long ntasks;
    volatile long next;     /* the next task to take */
    volatile long active;   /* workers inside the open job */
    volatile long sleepers; /* workers asleep on `wake` (or about to be) */
    volatile long waiting;  /* the caller sleeps on `done` until `active` falls to 0 */
    volatile long workers;  /* workers started */
    volatile long init;     /* 0: not yet; 1: being set up; 2: ready */
    volatile long jobs;     /* jobs run on the pool so far (sdrt_pool_jobs: tests) */
    long pid;               /* the process that started the workers (a forked child has none) */
    int64_t spin_ns;
    int64_t wait_ns;        /* how long the caller spins on `active` before it sleeps */
    int grain;              /* tasks per thread of an op with a fixed split */
    int shared_grain;       /* tasks per thread of an op whose threads share a counter of units */
    int64_t yield_ns;       /* spinning past this, a waiting thread yields its core at each check */
    int pin;                /* SDRT_GGML_PIN: worker i runs only on the (i+1)-th CPU the caller may use */
    volatile int64_t calm_at; /* until then some worker's core is contended (the latest tl_calm_at) */
    int64_t wait_pinned_ns; /* SDRT_GGML_WAIT_PINNED_US: wait_ns for a caller kept off the workers' CPUs */
    int64_t contended_ns;   /* SDRT_GGML_CONTENDED_MS: a worker whose spin lost its core sleeps at once this long */
    int64_t long_job_ns;    /* SDRT_GGML_LONG_JOB_US: only after a job this long does a contended worker sleep at once */
    int64_t pin_hold_ns;    /* SDRT_GGML_PIN_HOLD_MS: under PIN=3, a worker stays pinned this long after any contention */
    volatile int64_t job_t0; /* when the open job was published (the caller's clock) */
    double len_all, len_long; /* the caller's decaying sums of its jobs' lengths (capped), all and the long ones */
    volatile long long_share; /* len_long / len_all in thousandths: the share of pooled time in long jobs */
    long ncpus;             /* the CPUs the caller may use when the workers started (0: unknown, no pin) */
    int cpus[MAX_WORKERS + 1]; /* their numbers, ascending */
    pool_mutex submit;      /* one job at a time */
    pool_mutex lock;        /* with `wake`: the sleepers */
    pool_cond wake;
    pool_cond done;         /* with `lock`: the caller waiting for the last worker to leave */
} P;

static SDRT_THREAD_LOCAL int tl_width;  /* the calling thread's width (0: its ops run as ggml calls them) */
static SDRT_THREAD_LOCAL int tl_worker; /* this thread is one of the pool's workers */
static SDRT_THREAD_LOCAL int64_t tl_calm_at; /* a worker: until then its core is contended, it sleeps at once */
static SDRT_THREAD_LOCAL long tl_cpu = -1;    /* a worker: the CPU it is pinned to (-1: none) */
static SDRT_THREAD_LOCAL int tl_pinned;       /* a worker under SDRT_GGML_PIN=3: pinned now (while contended) */
static SDRT_THREAD_LOCAL int64_t tl_lost_at = INT64_MIN / 2; /* a worker: when its spin last lost its core */
#if defined(__linux__)
static SDRT_THREAD_LOCAL int tl_moved;      /* a caller: its affinity was narrowed off the workers' CPUs */
static SDRT_THREAD_LOCAL cpu_set_t tl_saved; /* its affinity before */
#endif

/* the gap between two checks of a spin that means the OS ran another thread on this core meanwhile:
 * far above a check's own time (a few µs), far below a time slice (ms) */
#define CONTENDED_GAP_NS 100000

SDRT_EXPORT void sdrt_pool_release(void);
SDRT_EXPORT void sdrt_pool_set_width(int width) {
    sdrt_pool_release(); /* a graph that ended without it: the caller's own affinity back */
    tl_width = width < 0 ? 0 : width;
}
int sdrt_pool_width(void) { return tl_worker ? 0 : tl_width; }
SDRT_EXPORT int sdrt_pool_workers(void) { return (int)A_LOAD(&P.workers); }
SDRT_EXPORT long sdrt_pool_jobs(void) { return A_LOAD(&P.jobs); }
SDRT_EXPORT long sdrt_pool_long_share(void) { return A_LOAD(&P.long_share); }

/* run the open job `job`'s tasks until none is left */
static void take_tasks(void) {
    for (;;) {
        const long i = A_ADD(&P.next, 1);
        if (i >= P.ntasks)
            return;
        P.fn(P.dst, (int)i, (int)P.ntasks, P.userdata);
    }
}

/* wait until the job word differs from `seen`: spin for spin_ns, then sleep. A worker whose spin
 * was interrupted (another thread ran on its core: a busy program beside it) sleeps at once between
 * jobs for the next contended_ns: a sleeping thread is woken when the next job comes and, having
 * slept, the OS runs it at once beside the busy program; a spinning one stays runnable beside it and
 * waits out the other's time slice (ms) when the job comes. */
static int64_t wait_change(int64_t seen, int long_job) {
    const int64_t t0 = now_ns();
    const int contended = P.contended_ns > 0 && t0 < tl_calm_at && long_job;
    const int64_t until = t0 + P.spin_ns;
    const int64_t yield_at = P.yield_ns == INT64_MAX ? INT64_MAX : t0 + P.yield_ns;
    int64_t prev = t0;
    for (unsigned n = 1; !contended; n++) { /* contended: no spin (a spin of 20 µs cost 15-50%) */
        const int64_t j = A_LOAD64(&P.job);
        if (j != seen && P.contended_ns == 0)
            return j;
        if (j != seen || (n & 63) == 0) {
            const int64_t t = now_ns();
            const int lost = P.contended_ns > 0 && t - prev > CONTENDED_GAP_NS;
            if (lost) { /* the OS gave this core to another thread meanwhile: sleep between jobs from now on */
                tl_calm_at = t + P.contended_ns;
                tl_lost_at = t;
                A_STORE64(&P.calm_at, tl_calm_at); /* the caller leaves the workers' CPUs meanwhile */
            }
            if (j != seen)
                return j;
            if (lost && long_job)
                break;
            prev = t;
            if (t > until)
                break;
            if (t > yield_at)
                yield_core(); /* a thread sharing this core (the caller) runs first */
        }
        cpu_relax();
    }
    mutex_lock(&P.lock);
    A_ADD(&P.sleepers, 1);
    int64_t j;
    while ((j = A_LOAD64(&P.job)) == seen)
        cond_wait(&P.wake, &P.lock);
    A_ADD(&P.sleepers, -1);
    mutex_unlock(&P.lock);
    return j;
}

static void pin_self(long cpu);

static void worker_loop(void) {
    tl_worker = 1;
    int64_t seen = A_LOAD64(&P.job);
    int long_job = 1;
    for (;;) {
        const int64_t j = wait_change(seen, long_job);
        seen = j;
        if (!(j & 1))
            continue; /* a job closed: wait for the next */
        A_ADD(&P.active, 1);
        if (A_LOAD64(&P.job) == j) { /* still open: the caller will wait for this worker */
            take_tasks();
            const int64_t t = now_ns();
            long_job = P.long_job_ns == 0 || A_LOAD(&P.long_share) >= 400;
            if (P.pin == 3 && tl_cpu >= 0) { /* pinned only while contended */
                const int want = (long_job && t < tl_calm_at) || t < tl_lost_at + P.pin_hold_ns;
                if (want != tl_pinned) {
                    pin_self(want ? tl_cpu : -1);
                    tl_pinned = want;
                }
            }
        }
        if (A_ADD(&P.active, -1) == 1 && A_LOAD(&P.waiting)) { /* the last one out: wake the caller */
            mutex_lock(&P.lock);
            cond_broadcast(&P.done);
            mutex_unlock(&P.lock);
        }
    }
}

#if defined(_WIN32)
static DWORD WINAPI worker_main_win(LPVOID arg) {
    (void)arg;
    worker_loop();
    return 0;
}
#else
static void *worker_main(void *arg) {
    tl_cpu = (long)(intptr_t)arg;
    if (tl_cpu >= 0 && P.pin != 3)
        pin_self(tl_cpu); /* pinned: the caller's wakeups cannot put this worker on the caller's core */
    worker_loop();
    return NULL;
}
#endif

/* this worker runs only on `cpu`, or (-1) on every CPU the caller could use at the start; refused: as before */
static void pin_self(long cpu) {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu >= 0)
        CPU_SET((int)cpu, &set);
    else
        for (long i = 0; i < P.ncpus; i++)
            CPU_SET(P.cpus[i], &set);
    if (CPU_COUNT(&set) > 0)
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
#else
    (void)cpu;
#endif
}

/* the CPUs the calling thread may use (its affinity, within the process's cpuset), into P.cpus */
static void read_cpus(void) {
    P.ncpus = 0;
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set))
        return;
    for (int c = 0; c < CPU_SETSIZE && P.ncpus <= MAX_WORKERS; c++)
        if (CPU_ISSET(c, &set))
            P.cpus[P.ncpus++] = c;
#endif
}

/* the CPU worker i (0-based) is pinned to: the (i+1)-th the caller may use, leaving the first to the
 * caller; -1 (no pin) unless asked, or where caller and workers would be more threads than CPUs */
static long worker_cpu(long i) {
    return P.pin && i + 1 < P.ncpus ? P.cpus[i + 1] : -1;
}

/* a duration from the environment: `name` as a count of `unit_ns` (negative: 0), else `dflt` */
static int64_t env_ns(const char *name, long dflt, int64_t unit_ns) {
    const char *env = getenv(name);
    const long v = env ? strtol(env, NULL, 10) : dflt;
    return (int64_t)(v < 0 ? 0 : v) * unit_ns;
}

static void pool_init(void) {
    if (A_LOAD(&P.init) == 2)
        return;
    if (A_CAS(&P.init, 0, 1)) {
        mutex_init(&P.submit);
        mutex_init(&P.lock);
        cond_init(&P.wake);
        cond_init(&P.done);
        P.spin_ns = env_ns("SDRT_GGML_SPIN_US", 200, 1000);
        P.wait_ns = env_ns("SDRT_GGML_WAIT_US", 50, 1000);
        const char *env = getenv("SDRT_GGML_TASKS");
        const long g = env ? strtol(env, NULL, 10) : 4;
        P.grain = g < 1 ? 1 : g > 64 ? 64 : (int)g;
        env = getenv("SDRT_GGML_SHARED_TASKS");
        const long sg = env ? strtol(env, NULL, 10) : 1;
        P.shared_grain = sg < 1 ? 1 : sg > 64 ? 64 : (int)sg;
        env = getenv("SDRT_GGML_YIELD_US");
        const long yus = env ? strtol(env, NULL, 10) : 20;
        P.yield_ns = yus < 0 ? INT64_MAX : (int64_t)yus * 1000;
        env = getenv("SDRT_GGML_PIN");
        P.pin = env ? atoi(env) : 3; /* 0: none; 1: the workers; 2: also the caller off their CPUs; 3: 2 only while contended */
        P.wait_pinned_ns = env_ns("SDRT_GGML_WAIT_PINNED_US", 1000, 1000);
        P.contended_ns = env_ns("SDRT_GGML_CONTENDED_MS", 100, 1000000);
        P.long_job_ns = env_ns("SDRT_GGML_LONG_JOB_US", 200, 1000);
        P.pin_hold_ns = env_ns("SDRT_GGML_PIN_HOLD_MS", 1000, 1000000);
        read_cpus();
        P.pid = process_id();
        A_STORE(&P.init, 2);
    }
    while (A_LOAD(&P.init) != 2)
        cpu_relax();
}

/* at least n workers (fewer if the OS refuses threads); call with `submit` held */
static void grow(long n) {
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    const long pid = process_id();
    if (pid != P.pid) { /* a forked child: the parent's workers do not exist here */
        P.pid = pid;
        A_STORE(&P.workers, 0);
        A_STORE(&P.sleepers, 0);
        A_STORE(&P.active, 0);
        A_STORE(&P.waiting, 0);
        mutex_init(&P.lock);
        cond_init(&P.wake);
        cond_init(&P.done);
        read_cpus();
    }
    while (A_LOAD(&P.workers) < n) {
        if (start_thread(worker_cpu(A_LOAD(&P.workers)), P.pin != 3))
            return;
        A_ADD(&P.workers, 1);
    }
}

/* SDRT_GGML_PIN=2: while a worker's core is contended, the caller keeps off the pinned workers' CPUs
 * for the rest of its graph (sdrt_pool_release gives its affinity back): on a worker's CPU, the
 * worker's wakeups would take the caller's time while another CPU runs only the busy program */
static void caller_off_workers(void) {
#if defined(__linux__)
    if (P.pin < 2 || tl_moved || now_ns() >= A_LOAD64(&P.calm_at))
        return;
    const long pinned = A_LOAD(&P.workers) < P.ncpus - 1 ? A_LOAD(&P.workers) : P.ncpus - 1;
    if (pinned <= 0 || sched_getaffinity(0, sizeof tl_saved, &tl_saved))
        return;
    cpu_set_t set = tl_saved;
    for (long i = 0; i < pinned; i++)
        CPU_CLR(P.cpus[i + 1], &set);
    if (CPU_COUNT(&set) > 0 && sched_setaffinity(0, sizeof set, &set) == 0)
        tl_moved = 1;
#endif
}

SDRT_EXPORT void sdrt_pool_release(void) {
#if defined(__linux__)
    if (tl_moved) {
        sched_setaffinity(0, sizeof tl_saved, &tl_saved);
        tl_moved = 0;
    }
#endif
}

SDRT_EXPORT int sdrt_pool_tasks(int width) {
    pool_init();
    const long n = (long)width * P.grain;
    return width <= 1 ? width : n > 4096 ? 4096 : (int)n;
}

SDRT_EXPORT int sdrt_pool_shared_tasks(int width) {
    pool_init();
    const long n = (long)width * P.shared_grain;
    return width <= 1 ? width : n > 4096 ? 4096 : (int)n;
}

/* the caller, after the last task: wait for the workers still inside the job. Spin for wait_ns
 * (a worker finishing its task on another core), then sleep: a worker that the OS has preempted
 * inside its task waits for a core, and an idle core (this one, once the caller sleeps) is where the
 * OS's balancing moves it at once; a spinning caller would hold its core for the worker's wait. */
static void wait_workers(void) {
    if (A_LOAD(&P.active) <= 0)
        return;
    int64_t wait_ns = P.wait_ns, yield_ns = P.yield_ns;
#if defined(__linux__)
    if (tl_moved) { /* no worker shares this core: spin on it (a sleeping caller's core is where the OS
                     * moves a busy program), yielding it to nobody */
        wait_ns = P.wait_pinned_ns;
        yield_ns = INT64_MAX;
    }
#endif
    const int64_t t0 = now_ns(), until = t0 + wait_ns;
    const int64_t yield_at = yield_ns == INT64_MAX ? INT64_MAX : t0 + yield_ns;
    for (unsigned n = 1; A_LOAD(&P.active) > 0; n++) {
        cpu_relax();
        if ((n & 63) == 0 && now_ns() > yield_at)
            yield_core();
        if ((n & 63) == 0 && now_ns() > until) {
            mutex_lock(&P.lock);
            A_STORE(&P.waiting, 1);
            while (A_LOAD(&P.active) > 0)
                cond_wait(&P.done, &P.lock);
            A_STORE(&P.waiting, 0);
            mutex_unlock(&P.lock);
            return;
        }
    }
}

void sdrt_pool_run(sdrt_op_fn fn, void *dst, void *userdata, int ntasks) {
    pool_init();
    const int width = tl_width > 1 && tl_width < ntasks ? tl_width : ntasks; /* threads, with the caller */
    if (width <= 1 || mutex_trylock(&P.submit)) { /* one task, or another thread's job is running */
        const int w = tl_width;
        tl_width = 0; /* fn's SDRT_POOLED must not come back here */
        fn(dst, 0, 1, userdata);
        tl_width = w;
        return;
    }
    grow(width - 1);
    caller_off_workers();
    A_ADD(&P.jobs, 1);
    P.fn = fn;
    P.dst = dst;
    P.userdata = userdata;
    P.ntasks = ntasks;
    A_STORE64(&P.job_t0, now_ns());
    A_STORE(&P.next, 0);
    const int64_t j = A_LOAD64(&P.job) + 1; /* closed values are even: the next one, open */
    A_STORE64(&P.job, j);
    if (A_LOAD(&P.sleepers) > 0) {
        mutex_lock(&P.lock);
        cond_broadcast(&P.wake);
        mutex_unlock(&P.lock);
    }
    take_tasks();
    /* the job's length: until the caller found no task left. Not its wait for the workers after that,
     * which grows with the sleeping this measure decides on (a job whose worker woke late would count
     * as long and keep the worker sleeping); a late worker makes it at most the caller's time alone */
    int64_t d = now_ns() - A_LOAD64(&P.job_t0);
    A_STORE64(&P.job, j + 1); /* closed: a worker that comes now leaves the job alone */
    wait_workers(); /* only workers that took the job before it closed */
    /* the share of the recent jobs' time (about the last 64 jobs) spent in long jobs, each job counted
     * up to 4x the bound (a job that lost the caller's core for a time slice counts as one long job,
     * not as the whole window) */
    const int64_t cap = 4 * P.long_job_ns;
    if (d > cap)
        d = cap;
    P.len_all = P.len_all * (63.0 / 64.0) + (double)d;
    P.len_long = P.len_long * (63.0 / 64.0) + (d >= P.long_job_ns ? (double)d : 0.0);
    A_STORE(&P.long_share, (long)(1000.0 * P.len_long / (P.len_all > 0 ? P.len_all : 1.0)));
    mutex_unlock(&P.submit);
}
