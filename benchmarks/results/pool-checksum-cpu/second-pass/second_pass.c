/* What any check over every byte of a pool page costs beside the kernel's page-cache read of it (issue 31).
 *
 * One file per page, as the file pool stores them, 256 MiB of files in all (more than the L3), so that each read
 * starts from memory as a pool read does; every page cold to the CPU's caches when read. Five ways, each over all
 * the files in turn, timed per page (open to close), the first round a warm-up:
 *   readv          the page into a buffer and its 20-byte trailer after it (the verified backend's read, unhashed)
 *   +nh pass       readv, then a keyed multiply-add hash (the NH family xxh3 is built on) over the buffer, AVX2
 *   +sum pass      readv, then a plain 64-bit sum over the buffer: the cheapest pass that reads every byte
 *   mmap fused     the file mapped (MAP_POPULATE), copied to the buffer by AVX2 loads and stores that feed the hash
 *                  from the same registers: one pass over memory, the copy in user space instead of the kernel
 *   chunked        the page read in pieces (four for 256 KiB and up), each hashed just after it lands
 * Build and run: run.sh. Not part of the package: a measurement of this CPU. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static uint64_t secret[128];

static inline __m256i nh(__m256i acc, __m256i x, __m256i k) {
    __m256i d = _mm256_xor_si256(x, k);
    __m256i product = _mm256_mul_epu32(d, _mm256_srli_epi64(d, 32));
    return _mm256_add_epi64(acc, _mm256_add_epi64(product, _mm256_shuffle_epi32(x, 0x4E)));
}

static uint64_t fold(__m256i a, __m256i b, __m256i c, __m256i d) {
    uint64_t lanes[16], h = 0x9E3779B97F4A7C15ull;
    _mm256_storeu_si256((__m256i *)lanes, a); _mm256_storeu_si256((__m256i *)(lanes + 4), b);
    _mm256_storeu_si256((__m256i *)(lanes + 8), c); _mm256_storeu_si256((__m256i *)(lanes + 12), d);
    for (int i = 0; i < 16; i++) { h ^= lanes[i]; h *= 0xff51afd7ed558ccdull; h ^= h >> 33; }
    return h;
}

/* The NH hash of src[0:n]; with dst, src is copied there by the same loads. n a multiple of 128. */
static uint64_t hash_copy(uint8_t *dst, const uint8_t *src, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        const __m256i *k = (const __m256i *)(secret + ((i >> 3) & 96));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(src + i)), x1 = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(src + i + 64)), x3 = _mm256_loadu_si256((const __m256i *)(src + i + 96));
        if (dst) {
            _mm256_storeu_si256((__m256i *)(dst + i), x0); _mm256_storeu_si256((__m256i *)(dst + i + 32), x1);
            _mm256_storeu_si256((__m256i *)(dst + i + 64), x2); _mm256_storeu_si256((__m256i *)(dst + i + 96), x3);
        }
        a = nh(a, x0, _mm256_loadu_si256(k)); b = nh(b, x1, _mm256_loadu_si256(k + 1));
        c = nh(c, x2, _mm256_loadu_si256(k + 2)); d = nh(d, x3, _mm256_loadu_si256(k + 3));
    }
    return fold(a, b, c, d);
}

static uint64_t plain_sum(const uint8_t *src, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n; i += 128) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(src + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(src + i + 32)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(src + i + 64)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(src + i + 96)));
    }
    return fold(a, b, c, d);
}

enum { READV, NH_PASS, SUM_PASS, MMAP_FUSED, CHUNKED, WAYS };
static const char *names[WAYS] = {"readv", "+nh pass", "+sum pass", "mmap fused", "chunked"};

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s DIR PAGE_KIB ROUNDS\n", argv[0]); return 2; }
    const char *dir = argv[1];
    size_t n = (size_t)atoi(argv[2]) * 1024;
    int rounds = atoi(argv[3]), files = (int)((256ull << 20) / n);
    for (int i = 0; i < 128; i++) secret[i] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    char path[4096];
    uint8_t *page = aligned_alloc(4096, n), *dst = aligned_alloc(4096, n), trailer[21];
    for (int f = 0; f < files; f++) {
        snprintf(path, sizeof path, "%s/p%zu-%d.bin", dir, n, f);
        if (access(path, F_OK) == 0) continue;
        for (size_t i = 0; i < n; i++) page[i] = (uint8_t)rand();
        int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (write(fd, page, n) != (ssize_t)n || write(fd, page, 20) != 20) { perror("write"); return 1; }
        close(fd);
    }
    double total[WAYS] = {0};
    volatile uint64_t sink = 0;
    for (int r = 0; r < rounds; r++)
        for (int w = 0; w < WAYS; w++)
            for (int f = 0; f < files; f++) {
                snprintf(path, sizeof path, "%s/p%zu-%d.bin", dir, n, f);
                struct iovec parts[2] = {{dst, n}, {trailer, sizeof trailer}};
                double started = now_ns();
                int fd = open(path, O_RDONLY);
                if (w == READV) {
                    sink += (uint64_t)readv(fd, parts, 2);
                } else if (w == NH_PASS) {
                    sink += (uint64_t)readv(fd, parts, 2) + hash_copy(NULL, dst, n);
                } else if (w == SUM_PASS) {
                    sink += (uint64_t)readv(fd, parts, 2) + plain_sum(dst, n);
                } else if (w == MMAP_FUSED) {
                    uint8_t *mapped = mmap(NULL, n + 20, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
                    sink += hash_copy(dst, mapped, n);
                    memcpy(trailer, mapped + n, 20);
                    munmap(mapped, n + 20);
                } else {
                    size_t piece = n >= 262144 ? n / 4 : n;
                    for (size_t at = 0; at < n; at += piece)
                        sink += (uint64_t)pread(fd, dst + at, piece, (off_t)at) + hash_copy(NULL, dst + at, piece);
                    sink += (uint64_t)pread(fd, trailer, sizeof trailer, (off_t)n);
                }
                close(fd);
                if (r > 0) total[w] += now_ns() - started;
            }
    double per = (rounds - 1) * files * 1000.0;
    printf("%4zu KiB, %d files, %d timed rounds:", n / 1024, files, rounds - 1);
    for (int w = 0; w < WAYS; w++) {
        printf(" | %s %.1f us", names[w], total[w] / per);
        if (w) printf(" (%+.1f%%)", 100 * (total[w] / total[READV] - 1));
    }
    double started = now_ns();
    for (int i = 0; i < 200; i++) sink += hash_copy(NULL, dst, n);
    double hashed = (now_ns() - started) / 200;
    printf(" | nh alone, from cache, %.1f us (%.0f GB/s)\n", hashed / 1000, n / hashed);
    return 0;
}
