/* y (M, N) = x (M, K) @ W (N, K)^T for a few rows, streaming W from memory once.
 *
 * A tree pass of the verifier multiplies 2-32 rows by every weight. BLAS runs such thin GEMMs at a
 * fraction of the machine's bandwidth (decoding/cpu_matmul.py has the numbers); here each block of
 * NB weight rows is read once, with prefetch, while up to 8 activation rows stay in registers.
 * Every output is the same dot product in the same order whatever M is (16 lanes accumulated over
 * K, then a fixed pairwise sum), so a row's result does not depend on the rows batched with it.
 * Compiled on first use with the machine's own instruction set (cpu_kernel.py); GCC vector
 * extensions, no intrinsics: AVX-512 where the CPU has it, two AVX2 halves otherwise. */
#include <stddef.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

#define NB 8      /* weight rows per block (at most; 4 for 7-8 activation rows, where 8 would spill) */
#define PF 1      /* prefetch distance, in blocks */
#define MMAX 8    /* activation rows held in registers; more are done in chunks of 8 per block */

static inline float hsum(v16 a) {
    v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)
         + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* rows n0 .. n0+nb-1 of y for M activation rows (M, nb compile-time constants after inlining) */
static inline __attribute__((always_inline)) void block(const float *x, const float *W, float *y, int M, int K,
                                                         int N, int n0, int nb, int pfd) {
    v16 acc[NB][MMAX];
    for (int j = 0; j < nb; j++)
        for (int m = 0; m < M; m++) acc[j][m] = (v16){0};
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        v16 xv[MMAX];
        for (int m = 0; m < M; m++) __builtin_memcpy(&xv[m], x + (size_t)m * K + k, 64);
        for (int j = 0; j < nb && n0 + j + pfd < N; j++)
            __builtin_prefetch(W + (size_t)(n0 + j + pfd) * K + k, 0, 0);
        for (int j = 0; j < nb; j++) {
            v16 w;
            __builtin_memcpy(&w, W + (size_t)(n0 + j) * K + k, 64);
            for (int m = 0; m < M; m++) acc[j][m] += w * xv[m];
        }
    }
    for (int j = 0; j < nb; j++)
        for (int m = 0; m < M; m++) {
            float s = hsum(acc[j][m]);
            for (int kk = k; kk < K; kk++) s += x[(size_t)m * K + kk] * W[(size_t)(n0 + j) * K + kk];
            y[(size_t)m * N + n0 + j] = s;
        }
}

/* weight rows n0 .. n0+NB-1 (fewer at the end) for MM activation rows, in blocks of NBB */
#define ROWS(MM, NBB)                                                                    \
    static void rows##MM(const float *x, const float *W, float *y, int K, int N, int n0) { \
        int end = N - n0 < NB ? N : n0 + NB, n = n0;                                     \
        for (; n + NBB <= end; n += NBB) block(x, W, y, MM, K, N, n, NBB, PF * NB);      \
        for (; n < end; n++) block(x, W, y, MM, K, N, n, 1, PF * NB);                    \
    }
ROWS(1, 8) ROWS(2, 8) ROWS(3, 8) ROWS(4, 8) ROWS(5, 8) ROWS(6, 8) ROWS(7, 4) ROWS(8, 4)

static void (*const ROWS_OF[MMAX + 1])(const float *, const float *, float *, int, int, int) = {
    0, rows1, rows2, rows3, rows4, rows5, rows6, rows7, rows8};

/* Returns 0, or -1 for arguments it does not take. threads: the caller's intra-op thread count. */
int smallm_f32(const float *x, const float *W, float *y, int M, int K, int N, int threads) {
    if (M < 1 || K < 1 || N < 1 || threads < 1) return -1;
    int nblocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int b = 0; b < nblocks; b++)
        for (int m0 = 0; m0 < M; m0 += MMAX) {  /* the block's weights stay in L1 between chunks */
            int mm = M - m0 < MMAX ? M - m0 : MMAX;
            ROWS_OF[mm](x + (size_t)m0 * K, W, y + (size_t)m0 * N, K, N, b * NB);
        }
    return 0;
}
