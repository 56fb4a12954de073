/* A program that checks what `remem run --paging uffd` must keep true for an unmodified
 * program: every byte it wrote reads back, through threads, fork, mremap, munmap,
 * MADV_DONTNEED, system calls that read or write its memory (kernel faults), exec, random
 * writes (each must be seen: a page taken for clean reads back old) and the brk heap.
 * Usage: paging_probe MODE MIB. Prints "ok" and exits 0, or prints "WRONG ..." and exits 2. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t value(uint64_t index, uint64_t salt) { return (index * 0x9E3779B97F4A7C15ull) ^ salt; }

static void fill(uint64_t *words, size_t count, uint64_t salt) {
    for (size_t i = 0; i < count; i++) words[i] = value(i, salt);
}

static void verify(const uint64_t *words, size_t count, uint64_t salt, const char *what) {
    for (size_t i = 0; i < count; i++) {
        if (words[i] != value(i, salt)) {
            printf("WRONG %s: word %zu is %016llx, not %016llx\n", what, i, (unsigned long long)words[i],
                   (unsigned long long)value(i, salt));
            fflush(stdout);
            exit(2);
        }
    }
}

static void verify_zero(const uint64_t *words, size_t count, const char *what) {
    for (size_t i = 0; i < count; i++) {
        if (words[i] != 0) {
            printf("WRONG %s: word %zu is %016llx, not zero\n", what, i, (unsigned long long)words[i]);
            exit(2);
        }
    }
}

static void *map(size_t bytes) {
    void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) { perror("mmap"); exit(1); }
    return memory;
}

/* Touches as much other memory as the region, so the region is paged out. */
static void pressure(size_t bytes) {
    uint64_t *other = map(bytes);
    fill(other, bytes / 8, 77);
    verify(other, bytes / 8, 77, "pressure");
    munmap(other, bytes);
}

struct part { uint64_t *words; size_t count; uint64_t salt; };

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *thread_main(void *argument) {
    struct part *part = argument;
    for (int round = 0; round < 3; round++) {
        fill(part->words, part->count, part->salt + round);
        verify(part->words, part->count, part->salt + round, "thread");
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s MODE MIB\n", argv[0]); return 1; }
    const char *mode = argv[1];
    size_t bytes = (size_t)atoi(argv[2]) << 20, count = bytes / 8;
    if (!strcmp(mode, "fill")) {
        uint64_t *words = malloc(bytes);
        fill(words, count, 1);
        verify(words, count, 1, "first pass");
        verify(words, count, 1, "second pass");
    } else if (!strcmp(mode, "threads")) {
        uint64_t *words = map(bytes);
        pthread_t threads[4];
        struct part parts[4];
        for (int t = 0; t < 4; t++) {
            parts[t] = (struct part){words + t * count / 4, count / 4, 100 + t * 10};
            pthread_create(&threads[t], NULL, thread_main, &parts[t]);
        }
        for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
        for (int t = 0; t < 4; t++) verify(parts[t].words, parts[t].count, parts[t].salt + 2, "after join");
    } else if (!strcmp(mode, "fork")) {
        uint64_t *words = map(bytes);
        fill(words, count, 5);
        pressure(bytes);
        pid_t child = fork();
        if (child == 0) {
            verify(words, count, 5, "in the child");
            fill(words, count, 6);
            verify(words, count, 6, "the child's own copy");
            _exit(0);
        }
        int status;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { printf("WRONG child status %d\n", status); return 2; }
        verify(words, count, 5, "in the parent after fork");
        pressure(bytes);
        verify(words, count, 5, "in the parent, paged again");
    } else if (!strcmp(mode, "mremap")) {
        uint64_t *words = map(bytes);
        fill(words, count, 7);
        pressure(bytes);
        uint64_t *moved = mremap(words, bytes, 2 * bytes, MREMAP_MAYMOVE);
        if (moved == MAP_FAILED) { perror("mremap"); return 1; }
        verify(moved, count, 7, "after mremap");
        verify_zero(moved + count, count, "the grown part");
        fill(moved + count, count, 8);
        pressure(bytes);
        verify(moved, count, 7, "first half, paged again");
        verify(moved + count, count, 8, "second half, paged again");
    } else if (!strcmp(mode, "munmap")) {
        uint64_t *words = map(2 * bytes);
        fill(words, 2 * count, 9);
        pressure(bytes);
        munmap(words + count, bytes);
        uint64_t *again = mmap(words + count, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (again != words + count) { perror("mmap fixed"); return 1; }
        verify_zero(again, count, "a new mapping where an unmapped one was");
        verify(words, count, 9, "the part still mapped");
    } else if (!strcmp(mode, "dontneed")) {
        uint64_t *words = map(bytes);
        fill(words, count, 11);
        pressure(bytes);
        size_t third = count / 3 & ~(size_t)511;
        madvise(words + third, third * 8, MADV_DONTNEED);
        verify_zero(words + third, third, "after MADV_DONTNEED");
        verify(words, third, 11, "before the discarded part");
        for (size_t i = 2 * third; i < count; i++)
            if (words[i] != value(i, 11)) { printf("WRONG after the discarded part at %zu\n", i); return 2; }
        fill(words, count, 12);
        pressure(bytes);
        verify(words, count, 12, "rewritten after MADV_DONTNEED");
    } else if (!strcmp(mode, "syscall")) {
        uint64_t *words = map(bytes), *back = map(bytes);
        fill(words, count, 13);
        pressure(bytes);
        char path[] = "/tmp/remem-paging-probe-XXXXXX";
        int fd = mkstemp(path);
        unlink(path);
        /* write(2) reads the paged-out buffer in the kernel; read(2) writes into another. */
        if (write(fd, words, bytes) != (ssize_t)bytes) { perror("write"); return 1; }
        fill(back, count, 99);
        pressure(bytes);
        if (pread(fd, back, bytes, 0) != (ssize_t)bytes) { perror("pread"); return 1; }
        verify(back, count, 13, "read(2) into a paged-out buffer");
        close(fd);
    } else if (!strcmp(mode, "exec")) {
        uint64_t *words = map(bytes);
        fill(words, count, 15);
        pressure(bytes);
        char *args[] = {argv[0], "fill", argv[2], NULL};
        execv("/proc/self/exe", args);
        perror("execv");
        return 1;
    } else if (!strcmp(mode, "random")) {
        /* Random reads and writes, each page's version known: a write the pager missed (a
         * page it took for clean) reads back as an older version. */
        size_t pages = bytes / 4096;
        uint64_t *words = map(bytes);
        uint32_t *versions = calloc(pages, sizeof *versions);
        uint64_t state = 88172645463325252ull;
        for (size_t page = 0; page < pages; page++) words[page * 512] = (uint64_t)page << 32;
        for (long step = 0; step < 20000; step++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            size_t page = state % pages;
            uint64_t want = (uint64_t)page << 32 | versions[page];
            if (words[page * 512] != want) {
                printf("WRONG page %zu at step %ld: %016llx, not %016llx\n", page, step,
                       (unsigned long long)words[page * 512], (unsigned long long)want);
                return 2;
            }
            if (state >> 40 & 1) words[page * 512] = (uint64_t)page << 32 | ++versions[page];
        }
    } else if (!strcmp(mode, "heap")) {
        /* Many small blocks of the brk heap (which grows in small mappings the pager adopts),
         * allocated, checked, reallocated and freed at random. */
        enum { BLOCKS = 2048 };
        static unsigned char *blocks[BLOCKS];
        static size_t sizes[BLOCKS];
        static unsigned char tags[BLOCKS];
        uint64_t state = 1234567;
        for (long step = 0; step < 20000; step++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            size_t i = state % BLOCKS, size = (state >> 20) % 8000 + 1;
            if (blocks[i]) {
                for (size_t j = 0; j < sizes[i]; j++)
                    if (blocks[i][j] != (unsigned char)(tags[i] + j)) {
                        printf("WRONG heap block %zu byte %zu\n", i, j);
                        return 2;
                    }
                free(blocks[i]);
                blocks[i] = NULL;
                continue;
            }
            blocks[i] = malloc(size);
            sizes[i] = size;
            tags[i] = (unsigned char)(state >> 8);
            for (size_t j = 0; j < size; j++) blocks[i][j] = (unsigned char)(tags[i] + j);
        }
    } else if (!strcmp(mode, "latency")) {
        /* The time of one read of a random page, 20,000 times, after the region was filled and
         * paged out: under a small limit almost every read is a fault served by the pager.
         * Prints the median and the 99th percentile in microseconds (for the fault-latency
         * figure of docs/PAGING.md; not used by the tests). */
        size_t pages = bytes / 4096;
        uint64_t *words = map(bytes);
        fill(words, count, 19);
        enum { SAMPLES = 20000 };
        static double took[SAMPLES];
        uint64_t state = 99991;
        for (int sample = 0; sample < SAMPLES; sample++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            size_t page = state % pages;
            struct timespec start, end;
            clock_gettime(CLOCK_MONOTONIC, &start);
            volatile uint64_t word = words[page * 512];
            clock_gettime(CLOCK_MONOTONIC, &end);
            if (word != value(page * 512, 19)) { printf("WRONG page %zu\n", page); return 2; }
            took[sample] = (end.tv_sec - start.tv_sec) * 1e6 + (end.tv_nsec - start.tv_nsec) / 1e3;
        }
        qsort(took, SAMPLES, sizeof took[0], by_value);
        printf("read of a random page: p50 %.1f us, p99 %.1f us\n", took[SAMPLES / 2], took[SAMPLES * 99 / 100]);
    } else if (!strcmp(mode, "hold")) {
        uint64_t *words = map(bytes);
        fill(words, count, 17);
        pressure(bytes);
        printf("filled\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 1;
        verify(words, count, 17, "after the nodes were killed");
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 1;
    }
    printf("ok\n");
    return 0;
}
