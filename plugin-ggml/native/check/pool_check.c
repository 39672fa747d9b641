/* A C-only check of the ops' thread pool (pool.c): every task of every job runs exactly once, at
 * widths 1 to 4, with jobs back to back and with pauses that let the workers fall asleep; two
 * threads submitting at once (the second runs its op inline, as one task); and an op whose task
 * count is its nth, through SDRT_POOLED as the ops use it (width x SDRT_GGML_TASKS tasks) and through
 * SDRT_POOLED_SHARED (width tasks). Exit status 1 on any mismatch. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sdrt_native.h"

void sdrt_pool_set_width(int width);
int sdrt_pool_workers(void);

#define JOBS 20000
#define MAX_TASKS 256 /* width 4 x SDRT_GGML_TASKS at most 64 */

typedef struct {
    int hits[MAX_TASKS];
    int nth_seen;
    int slow; /* microseconds a task sleeps: the caller finishes first, a worker still runs */
    int shared; /* through SDRT_POOLED_SHARED */
} job;

static void nap_us(int us) {
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
}

/* an op as the kernels are written: its first line hands it to the pool */
static void count_body(job *j, int ith, int nth) {
    __atomic_fetch_add(&j->hits[ith], 1, __ATOMIC_RELAXED);
    __atomic_store_n(&j->nth_seen, nth, __ATOMIC_RELAXED);
    if (j->slow)
        nap_us(j->slow);
}

static void count_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED(count_op);
    (void)userdata;
    count_body((job *)dst, ith, nth);
}

static void count_shared_op(void *dst, int ith, int nth, void *userdata) {
    SDRT_POOLED_SHARED(count_shared_op);
    (void)userdata;
    count_body((job *)dst, ith, nth);
}

/* one job at `width` through SDRT_POOLED (or SDRT_POOLED_SHARED); 1 when some task ran other than once. With `inline_ok`
 * the job may also have run inline as one task (another thread's job held the pool). */
static int one_job(int width, int slow, int inline_ok, int shared) {
    job j;
    memset(&j, 0, sizeof j);
    j.slow = slow;
    if (shared)
        count_shared_op(&j, 0, 1, NULL); /* as ggml calls it on one thread */
    else
        count_op(&j, 0, 1, NULL);
    const int tasks = width > 1 ? (shared ? sdrt_pool_shared_tasks(width) : sdrt_pool_tasks(width)) : 1;
    const int want = inline_ok && j.nth_seen == 1 ? 1 : tasks;
    if (j.nth_seen != want)
        return 1;
    for (int i = 0; i < MAX_TASKS; i++)
        if (j.hits[i] != (i < want ? 1 : 0))
            return 1;
    return 0;
}

static int submit_fails;

static void *submitter(void *arg) {
    const int width = *(const int *)arg;
    sdrt_pool_set_width(width);
    for (int i = 0; i < JOBS; i++)
        if (one_job(width, 0, 1, i & 1))
            __atomic_fetch_add(&submit_fails, 1, __ATOMIC_RELAXED);
    return NULL;
}

int main(void) {
    int fails = 0, runs = 0;
    for (int width = 0; width <= 4; width++) {
        sdrt_pool_set_width(width);
        for (int i = 0; i < JOBS; i++, runs++)
            fails += one_job(width, 0, 0, i & 1);
        for (int i = 0; i < 50; i++, runs++) { /* workers asleep between jobs, tasks slower than the caller */
            nap_us(i % 5 == 0 ? 2000 : 50);
            fails += one_job(width, i % 3 == 0 ? 300 : 0, 0, i & 1);
        }
    }
    sdrt_pool_set_width(0);
    /* two threads submitting at once: one runs on the pool, the other inline whenever it is busy */
    int widths[2] = {2, 3};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, submitter, &widths[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    runs += 2 * JOBS;
    printf("pool: %d workers started\n", sdrt_pool_workers());
    printf("%d runs, %d failures (%d of them from concurrent submitters)\n", runs, fails + submit_fails,
           submit_fails);
    return fails + submit_fails ? 1 : 0;
}
