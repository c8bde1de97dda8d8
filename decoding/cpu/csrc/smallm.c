/* y (M, N) = x (M, K) @ W (N, K)^T for a few rows, streaming W from memory once.
 *
 * A tree pass of the verifier multiplies 2-32 rows by every weight; one-row decoding multiplies
 * one. BLAS runs such thin GEMMs at a fraction of the machine's bandwidth or compute
 * (decoding/cpu_matmul.py has the numbers). Here W is first repacked (pack_f32) into panels of 32
 * output rows stored k-major: panel p holds W[32p .. 32p+31][k] contiguously for each k, zero-
 * padded past N. A pass reads each panel as one sequential stream; for every k it loads the
 * panel's 32 weights as two 16-lane vectors and adds weight * x[m][k] (x broadcast) into two
 * accumulators per activation row, so up to 12 rows share each weight load and the outputs need
 * no horizontal sums. Every output is the same chain of fused multiply-adds over k = 0..K-1,
 * whatever M and whatever rows are batched with it, so a row's result does not depend on its
 * batch. Compiled on first use with the machine's own instruction set (cpu_kernel.py); GCC vector
 * extensions, no intrinsics: AVX-512 where the CPU has it, two AVX2 halves otherwise. */
#include <stddef.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));

#define NP 32       /* output rows per panel: two 16-lane vectors */
#define CMAX 12     /* activation rows per pass over a panel (24 accumulators in registers) */
#define PFDIST 1024 /* software prefetch distance in floats (4 KiB) along the panel stream */

/* outputs n0 .. n0+NP-1 (fewer at the end) for C activation rows; w: the panel */
static inline __attribute__((always_inline)) void tile(const float *x, const float *w, float *y, int C, int K,
                                                        int N, int n0, int prefetch) {
    v16 acc[CMAX][2];
    for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = (v16){0};
    for (int k = 0; k < K; k++, w += NP) {
        if (prefetch) {
            __builtin_prefetch(w + PFDIST, 0, 0);
            __builtin_prefetch(w + PFDIST + 16, 0, 0);
        }
        v16 w0, w1;
        __builtin_memcpy(&w0, w, 64);
        __builtin_memcpy(&w1, w + 16, 64);
        for (int c = 0; c < C; c++) {
            float s = x[(size_t)c * K + k];
            v16 xb = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
            acc[c][0] += w0 * xb;
            acc[c][1] += w1 * xb;
        }
    }
    if (n0 + NP <= N) {
        for (int c = 0; c < C; c++) {
            __builtin_memcpy(y + (size_t)c * N + n0, &acc[c][0], 64);
            __builtin_memcpy(y + (size_t)c * N + n0 + 16, &acc[c][1], 64);
        }
    } else {
        for (int c = 0; c < C; c++)
            for (int j = 0; j < N - n0; j++) y[(size_t)c * N + n0 + j] = acc[c][j / 16][j % 16];
    }
}

typedef void (*tile_fn)(const float *, const float *, float *, int, int, int, int);
#define TILE(C)                                                                            \
    static void tile##C(const float *x, const float *w, float *y, int K, int N, int n0, int pf) { \
        tile(x, w, y, C, K, N, n0, pf);                                                    \
    }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
static const tile_fn TILE_OF[CMAX + 1] = {0,      tile1, tile2, tile3, tile4,  tile5, tile6,
                                          tile7,  tile8, tile9, tile10, tile11, tile12};

/* The number of floats pack_f32 writes for an (N, K) weight. */
long long packed_size_f32(int N, int K) { return (long long)((N + NP - 1) / NP) * NP * K; }

/* Wp (packed_size_f32 floats) = W (N, K) in panels of NP rows, k-major, zero-padded. */
int pack_f32(const float *W, float *Wp, int N, int K, int threads) {
    if (N < 1 || K < 1 || threads < 1) return -1;
    int npan = (N + NP - 1) / NP;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < npan; p++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < NP; j++) {
                int n = p * NP + j;
                Wp[((size_t)p * K + k) * NP + j] = n < N ? W[(size_t)n * K + k] : 0.0f;
            }
    return 0;
}

/* y = x @ W^T from the packed weight. Returns 0, or -1 for arguments it does not take.
 * threads: the caller's intra-op thread count. More than CMAX rows go in balanced chunks, each a
 * pass over the panel (the later passes read it from cache). */
int smallm_f32(const float *x, const float *Wp, float *y, int M, int K, int N, int threads) {
    if (M < 1 || K < 1 || N < 1 || threads < 1) return -1;
    int npan = (N + NP - 1) / NP, nch = (M + CMAX - 1) / CMAX;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < npan; p++) {
        const float *w = Wp + (size_t)p * NP * K;
        for (int c = 0, m0 = 0; c < nch; c++) {
            int mm = (M - m0 + (nch - c) - 1) / (nch - c);
            TILE_OF[mm](x + (size_t)m0 * K, w, y + (size_t)m0 * N, K, N, p * NP, c == 0);
            m0 += mm;
        }
    }
    return 0;
}
