/* What the AMX checks share (amx_check.c, amx_conv_check.c): operands that end exactly where an inaccessible
 * page begins (a load or store past an operand's end faults), and the value of a bf16 bit pattern. Linux only. */
#ifndef SDRT_CHECK_GUARDED_H
#define SDRT_CHECK_GUARDED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    char *base;
    size_t len;
} mapping;

/* `bytes` that end where an inaccessible page begins */
static void *guarded(size_t bytes, mapping *m) {
    const size_t pg = 4096;
    m->len = (bytes + pg - 1) / pg * pg + pg;
    m->base = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m->base == MAP_FAILED || mprotect(m->base + m->len - pg, pg, PROT_NONE)) {
        perror("mmap");
        exit(1);
    }
    return m->base + m->len - pg - bytes;
}

static void unmap(mapping *m) { munmap(m->base, m->len); }

static double bf(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
