// The CPU row-dot engine of the qgate routes (GEMV, GDN input): y[r] = sum_k W[r, k] * x[k] for fp16
// or bf16 rows W and an fp32 vector x, float32 accumulation in one fixed order on every ISA path.
//
// The order (the op docs cite it): the row is read in chunks of 32 elements, zero-padded at the end;
// 32 partial sums p[j] start at +0 and take p[j] = fma(W[32c + j], x[32c + j], p[j]) for c = 0, 1, ...;
// then s[j] = p[j] + p[j + 16] (j < 16), t[j] = s[j] + s[j + 8], u[j] = t[j] + t[j + 4],
// v[j] = u[j] + u[j + 2], y = v[0] + v[1]. FMA is correctly rounded, so the AVX-512, AVX2 and
// scalar paths give the same bits, on any number of threads (one thread owns a row).
//
// ISA: the vector paths are compiled with function target attributes (GCC/Clang on x86-64) and
// picked at run time from what the CPU reports (__builtin_cpu_supports); no global -m flags, so the
// extension builds and runs on any x86-64 CPU and on other architectures (scalar path only).
#pragma once

#include <cstdint>

namespace qgate::cpu {

enum class Isa : int64_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

enum class Elem { kHalf, kBFloat16 };

constexpr int64_t kChunk = 32;  // elements per chunk = partial sums per row

// The best path this CPU runs (cached after the first call).
Isa best_isa();
// Whether this CPU (and this build) can run `isa`.
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);

// Round k up to a whole number of chunks: the length of the zero-padded fp32 x buffer.
inline int64_t padded(int64_t k) { return (k + kChunk - 1) / kChunk * kChunk; }

// x (k elements of `elem`) -> fp32 into dst[0, padded(k)), zero-filled past k.
void to_float_padded(Isa isa, Elem elem, const void* x, int64_t k, float* dst);

// src (n fp32 values) -> dst (n elements of `elem`), rounded to nearest even: the same bits as
// c10::Half(float) / c10::BFloat16(float) (F16C on the vector paths for fp16).
void from_float(Isa isa, Elem elem, const float* src, int64_t n, void* dst);

// out[r] = dot(row r of w, xf) for r in [0, rows): w is `rows` rows of k elements with row stride ld
// (elements), xf the padded fp32 vector of to_float_padded. Single-threaded; callers split rows.
void rows_dot(Isa isa, Elem elem, const void* w, int64_t ld, int64_t rows, int64_t k, const float* xf,
              float* out);

// Weight bytes a parallel task reads at least. Below 512 KiB (all of the tiny model's projections)
// a call runs on the calling thread: waking the pool saves little there, and on a busy machine a
// parallel region waits for its slowest thread (measured here under load: 8 ms a call at 8 MiB with
// 2 threads, F.linear alike, against 0.1 ms on one; vLLM's engine process shares the cores).
constexpr int64_t kMinTaskBytes = 512 * 1024;

// Rows per parallel task so that a task reads at least `min_bytes` of weights (at::parallel_for's
// grain: a problem smaller than one grain runs inline, without waking the thread pool).
int64_t row_grain(int64_t k, int64_t elem_bytes, int64_t min_bytes);

}  // namespace qgate::cpu
