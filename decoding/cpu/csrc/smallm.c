/* y (M, N) = x (M, K) @ W (N, K)^T for a few rows, streaming W from memory once.
 *
 * A tree pass of the verifier multiplies 2-32 rows by every weight; one-row decoding multiplies
 * one. BLAS runs such thin GEMMs at a fraction of the machine's bandwidth or compute
 * (decoding/cpu/matmul.py has the numbers). Here W is first repacked (pack_*) into panels of 32
 * output rows stored k-major: panel p holds W[32p .. 32p+31][k] contiguously for each k, zero-
 * padded past N. A pass reads each panel as one sequential stream; for every k it loads the
 * panel's 32 weights as two 16-lane vectors and adds weight * x[m][k] (x broadcast) into two
 * accumulators per activation row, so up to 12 rows share each weight load and the outputs need
 * no horizontal sums. Every output is the same chain of fused multiply-adds over k = 0..K-1,
 * whatever M and whatever rows are batched with it, so a row's result does not depend on its
 * batch.
 *
 * Two prefetch hints, one per form the tuner times (matmul.py: "kernel", "kernel-l2"): a
 * non-temporal prefetch 4 KB ahead into L1 (the stream then leaves the caches alone; best on the AMD
 * EPYCs measured), or a prefetch 8 KB ahead into L2 (on an Intel Xeon with AVX-512/AMX the non-
 * temporal one held a one-row pass to 40% of the machine's bandwidth: 50 ms against a 20 ms plain
 * sum of the weights; into L2 the same pass takes 18 ms). Results do not depend on the hint.
 *
 * Two weight formats: float32, and bfloat16 (a bf16 verifier). A bf16 panel is half the bytes to
 * stream; each weight is widened to float32 exactly (a 16-bit shift), multiplied and summed in
 * float32, and each output rounded once to bf16 (round to nearest even, NaN kept), as torch's
 * bf16 linear does (bf16 in, float32 accumulation, bf16 out). Compiled on first use with the
 * machine's own instruction set (kernel.py); GCC vector extensions, no intrinsics: AVX-512 where
 * the CPU has it, AVX2 halves or narrower vectors otherwise. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef uint32_t u32x16 __attribute__((vector_size(64), aligned(4)));
/* what a panel is read through: direct loads keep the weights and the accumulators in registers
 * (copying them with memcpy made GCC 12 keep every accumulator on the stack: a load and a store
 * per fused multiply-add, which Intel's cores pay for and AMD's hid) */
typedef float v16_in __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t u32x16_in __attribute__((vector_size(64), aligned(4), may_alias));

#define NP 32      /* output rows per panel: two 16-lane vectors */
#define CMAX 12    /* activation rows per pass over a panel (24 accumulators in registers) */
#define PF_NTA 4096 /* prefetch distance along the panel stream, hint 0: non-temporal, into L1 */
#define PF_L2 8192   /* hint 1: into L2 */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    if (f != f) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* the panel's 32 weights at one k as two float32 vectors (outputs 0-15, 16-31). A bf16 panel
 * stores them interleaved (pack_bf16: output j in 16-bit slot 2j, output 16+j in slot 2j+1), so
 * one 64-byte load holds both: the low halves shifted up are outputs 0-15, the high halves with
 * the low bits cleared are outputs 16-31 (exact: a bf16 is the top half of its float32). */
static inline __attribute__((always_inline)) void load32(const char *w, int bf16, v16 *w0, v16 *w1) {
    if (bf16) {
        u32x16 u = *(const u32x16_in *)w;
        *w0 = (v16)(u << 16);
        *w1 = (v16)(u & 0xFFFF0000u);
    } else {
        *w0 = *(const v16_in *)w;
        *w1 = *(const v16_in *)(w + 64);
    }
}

static inline __attribute__((always_inline)) void store(void *y, size_t i, v16 v, int n, int bf16) {
    if (bf16) {
        uint16_t *o = (uint16_t *)y + i;
        for (int j = 0; j < n; j++) o[j] = f32_to_bf16(v[j]);
    } else if (n == 16) {
        __builtin_memcpy((float *)y + i, &v, 64);
    } else {
        for (int j = 0; j < n; j++) ((float *)y)[i + j] = v[j];
    }
}

/* the panel's stream ahead of w: hint 0 non-temporal into L1 (prefetchnta), hint 1 into L2
 * (prefetcht1: locality 2) */
static inline __attribute__((always_inline)) void prefetch(const char *w, int hint, int bf16) {
    if (hint) {
        __builtin_prefetch(w + PF_L2, 0, 2);
        if (!bf16) __builtin_prefetch(w + PF_L2 + 64, 0, 2);
    } else {
        __builtin_prefetch(w + PF_NTA, 0, 0);
        if (!bf16) __builtin_prefetch(w + PF_NTA + 64, 0, 0);
    }
}

/* outputs n0 .. n0+NP-1 (fewer at the end) for C activation rows x (float32); w: the panel,
 * in float32 or (bf16 = 1) bfloat16; y in the weight's format; pf: 1 on the first pass over a
 * panel (prefetch with this hint), 0 on later passes (they read the panel from cache) */
static inline __attribute__((always_inline)) void tile(const float *x, const char *w, void *y, int C, int K,
                                                        int N, int n0, int pf, int hint, int bf16) {
    const int step = NP * (bf16 ? 2 : 4);
    v16 acc[CMAX][2];
    for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = (v16){0};
    for (int k = 0; k < K; k++, w += step) {
        if (pf) prefetch(w, hint, bf16);
        v16 w0, w1;
        load32(w, bf16, &w0, &w1);
        for (int c = 0; c < C; c++) {
            float s = x[(size_t)c * K + k];
            v16 xb = {s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s};
            acc[c][0] += w0 * xb;
            acc[c][1] += w1 * xb;
        }
    }
    int n = N - n0 < NP ? N - n0 : NP;
    for (int c = 0; c < C; c++) {
        size_t i = (size_t)c * N + n0;
        store(y, i, acc[c][0], n < 16 ? n : 16, bf16);
        if (n > 16) store(y, i + 16, acc[c][1], n - 16, bf16);
    }
}

typedef void (*tile_fn)(const float *, const char *, void *, int, int, int, int);
#define TILE(C)                                                                                   \
    static void tile##C(const float *x, const char *w, void *y, int K, int N, int n0, int pf) {   \
        tile(x, w, y, C, K, N, n0, pf, 0, 0);                                                     \
    }                                                                                             \
    static void tilel##C(const float *x, const char *w, void *y, int K, int N, int n0, int pf) {  \
        tile(x, w, y, C, K, N, n0, pf, 1, 0);                                                     \
    }                                                                                             \
    static void tileb##C(const float *x, const char *w, void *y, int K, int N, int n0, int pf) {  \
        tile(x, w, y, C, K, N, n0, pf, 0, 1);                                                     \
    }                                                                                             \
    static void tilebl##C(const float *x, const char *w, void *y, int K, int N, int n0, int pf) { \
        tile(x, w, y, C, K, N, n0, pf, 1, 1);                                                     \
    }
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6) TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#define TILES(p) {0, p##1, p##2, p##3, p##4, p##5, p##6, p##7, p##8, p##9, p##10, p##11, p##12}
static const tile_fn TILES_BY[2][2][CMAX + 1] = {{TILES(tile), TILES(tilel)}, {TILES(tileb), TILES(tilebl)}};

/* The number of elements pack_* writes for an (N, K) weight (either format). */
long long packed_size_f32(int N, int K) { return (long long)((N + NP - 1) / NP) * NP * K; }

/* Wp = W (N, K) in panels of NP rows, k-major, zero-padded. float32: output j of a panel at
 * slot j; bf16 (raw 16 bits): output j at slot 2j and output 16+j at slot 2j+1 (see load32). */
#define PACK(name, T, SLOT)                                                                  \
    int name(const T *W, T *Wp, int N, int K, int threads) {                                 \
        if (N < 1 || K < 1 || threads < 1) return -1;                                        \
        int npan = (N + NP - 1) / NP;                                                        \
        _Pragma("omp parallel for schedule(static) num_threads(threads)")                    \
        for (int p = 0; p < npan; p++)                                                       \
            for (int k = 0; k < K; k++)                                                      \
                for (int j = 0; j < NP; j++) {                                               \
                    int n = p * NP + j;                                                      \
                    Wp[((size_t)p * K + k) * NP + SLOT(j)] = n < N ? W[(size_t)n * K + k] : (T)0; \
                }                                                                            \
        return 0;                                                                            \
    }
#define SLOT_F32(j) (j)
#define SLOT_BF16(j) ((j) < 16 ? 2 * (j) : 2 * ((j) - 16) + 1)
PACK(pack_f32, float, SLOT_F32)
PACK(pack_bf16, uint16_t, SLOT_BF16)

/* every panel: rows in balanced chunks of at most CMAX, each a pass over the panel (the later
 * passes read it from cache) */
static void run(const float *x, const char *Wp, void *y, int M, int K, int N, int threads, int hint,
                int bf16) {
    int npan = (N + NP - 1) / NP, nch = (M + CMAX - 1) / CMAX, es = bf16 ? 2 : 4;
    const tile_fn *tiles = TILES_BY[bf16][hint];
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < npan; p++) {
        const char *w = Wp + (size_t)p * NP * K * es;
        for (int c = 0, m0 = 0; c < nch; c++) {
            int mm = (M - m0 + (nch - c) - 1) / (nch - c);
            tiles[mm](x + (size_t)m0 * K, w, (char *)y + (size_t)m0 * N * es, K, N, p * NP, c == 0);
            m0 += mm;
        }
    }
}

/* y = x @ W^T from the packed float32 weight. Returns 0, or -1 for arguments it does not take.
 * threads: the caller's intra-op thread count; hint: the prefetch (0 non-temporal into L1, 1 L2). */
int smallm_f32(const float *x, const float *Wp, float *y, int M, int K, int N, int threads, int hint) {
    if (M < 1 || K < 1 || N < 1 || threads < 1 || (hint != 0 && hint != 1)) return -1;
    run(x, (const char *)Wp, y, M, K, N, threads, hint, 0);
    return 0;
}

/* The same for bf16 x, packed bf16 W and bf16 y (all as raw 16 bits). x is widened to float32
 * once, exactly; -1 also when that scratch cannot be allocated. */
int smallm_bf16(const uint16_t *x, const uint16_t *Wp, uint16_t *y, int M, int K, int N, int threads,
                int hint) {
    if (M < 1 || K < 1 || N < 1 || threads < 1 || (hint != 0 && hint != 1)) return -1;
    float *xf = malloc((size_t)M * K * sizeof(float));
    if (!xf) return -1;
    for (size_t i = 0; i < (size_t)M * K; i++) xf[i] = bf16_to_f32(x[i]);
    run(xf, (const char *)Wp, y, M, K, N, threads, hint, 1);
    free(xf);
    return 0;
}
