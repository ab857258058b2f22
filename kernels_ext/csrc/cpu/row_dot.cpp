// The CPU row-dot engine (row_dot.h has the summation order every path follows).
#include "row_dot.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define QGATE_CPU_X86 1
#include <immintrin.h>
#define QGATE_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QGATE_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#endif

namespace qgate::cpu {
namespace {

// --- scalar: the definition of the order --------------------------------------------------------

inline float to_f(Elem e, uint16_t bits) {
  if (e == Elem::kHalf) return c10::detail::fp16_ieee_to_fp32_value(bits);
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float reduce32(const float* p) {
  float s[16], t[8], u[4], v[2];
  for (int j = 0; j < 16; ++j) s[j] = p[j] + p[j + 16];
  for (int j = 0; j < 8; ++j) t[j] = s[j] + s[j + 8];
  for (int j = 0; j < 4; ++j) u[j] = t[j] + t[j + 4];
  for (int j = 0; j < 2; ++j) v[j] = u[j] + u[j + 2];
  return v[0] + v[1];
}

float dot_scalar(Elem e, const uint16_t* w, int64_t k, const float* xf) {
  float p[kChunk] = {};
  const int64_t kp = padded(k);
  for (int64_t c = 0; c < kp; c += kChunk) {
    for (int64_t j = 0; j < kChunk; ++j) {
      const float wv = c + j < k ? to_f(e, w[c + j]) : 0.0f;
      p[j] = std::fma(wv, xf[c + j], p[j]);
    }
  }
  return reduce32(p);
}

void rows_scalar(Elem e, const uint16_t* w, int64_t ld, int64_t rows, int64_t k, const float* xf, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = dot_scalar(e, w + r * ld, k, xf);
}

void to_float_scalar(Elem e, const uint16_t* x, int64_t k, float* dst) {
  for (int64_t i = 0; i < k; ++i) dst[i] = to_f(e, x[i]);
  for (int64_t i = k; i < padded(k); ++i) dst[i] = 0.0f;
}

#ifdef QGATE_CPU_X86

// A row's zero-padded last chunk, so that every path reads whole chunks.
inline const uint16_t* tail_chunk(const uint16_t* row, int64_t c, int64_t k, uint16_t* buf) {
  std::memset(buf, 0, kChunk * sizeof(uint16_t));
  std::memcpy(buf, row + c, (k - c) * sizeof(uint16_t));
  return buf;
}

// --- AVX2 + F16C + FMA: a row's 32 partial sums in 4 ymm (p[0..7], p[8..15], p[16..23], p[24..31]) --

template <Elem E>
QGATE_AVX2 inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (E == Elem::kHalf) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// u = t[0..3] + t[4..7]; v = u[0..1] + u[2..3]; y = v[0] + v[1]
QGATE_AVX2 inline float reduce8(__m256 t) {
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

// One row at a time: one sequential stream per core is what the hardware prefetchers follow best
// (measured here: 2-4 interleaved rows streamed 20-45 % slower from DRAM and from L3).
template <Elem E>
QGATE_AVX2 float row_avx2(const uint16_t* w, int64_t k, const float* xf) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  alignas(64) uint16_t buf[kChunk];
  const int64_t kp = padded(k);
  for (int64_t c = 0; c < kp; c += kChunk) {
    const uint16_t* p = c + kChunk <= k ? w + c : tail_chunk(w, c, k, buf);
    acc0 = _mm256_fmadd_ps(load8<E>(p), _mm256_loadu_ps(xf + c), acc0);
    acc1 = _mm256_fmadd_ps(load8<E>(p + 8), _mm256_loadu_ps(xf + c + 8), acc1);
    acc2 = _mm256_fmadd_ps(load8<E>(p + 16), _mm256_loadu_ps(xf + c + 16), acc2);
    acc3 = _mm256_fmadd_ps(load8<E>(p + 24), _mm256_loadu_ps(xf + c + 24), acc3);
  }
  // s = p[j] + p[j+16] as (lo, hi); t = s[j] + s[j+8]
  return reduce8(_mm256_add_ps(_mm256_add_ps(acc0, acc2), _mm256_add_ps(acc1, acc3)));
}

template <Elem E>
QGATE_AVX2 void rows_avx2(const uint16_t* w, int64_t ld, int64_t rows, int64_t k, const float* xf, float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = row_avx2<E>(w + r * ld, k, xf);
}

template <Elem E>
QGATE_AVX2 void to_float_avx2(const uint16_t* x, int64_t k, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) _mm256_storeu_ps(dst + i, load8<E>(x + i));
  for (; i < k; ++i) dst[i] = to_f(E, x[i]);
  for (; i < padded(k); ++i) dst[i] = 0.0f;
}

// --- AVX-512F: a row's 32 partial sums in 2 zmm (p[0..15], p[16..31]) -------------------------------

template <Elem E>
QGATE_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (E == Elem::kHalf) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <Elem E>
QGATE_AVX512 float row_avx512(const uint16_t* w, int64_t k, const float* xf) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  alignas(64) uint16_t buf[kChunk];
  const int64_t kp = padded(k);
  for (int64_t c = 0; c < kp; c += kChunk) {
    const uint16_t* p = c + kChunk <= k ? w + c : tail_chunk(w, c, k, buf);
    acc0 = _mm512_fmadd_ps(load16<E>(p), _mm512_loadu_ps(xf + c), acc0);
    acc1 = _mm512_fmadd_ps(load16<E>(p + 16), _mm512_loadu_ps(xf + c + 16), acc1);
  }
  const __m512 s = _mm512_add_ps(acc0, acc1);  // p[j] + p[j+16]
  const __m256 s_lo = _mm512_castps512_ps256(s);
  const __m256 s_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
  return reduce8(_mm256_add_ps(s_lo, s_hi));  // t = s[j] + s[j+8], then as AVX2
}

template <Elem E>
QGATE_AVX512 void rows_avx512(const uint16_t* w, int64_t ld, int64_t rows, int64_t k, const float* xf,
                              float* out) {
  for (int64_t r = 0; r < rows; ++r) out[r] = row_avx512<E>(w + r * ld, k, xf);
}

Isa detect() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2 && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  return avx2 ? Isa::kAvx2 : Isa::kScalar;
}

#else

Isa detect() { return Isa::kScalar; }

#endif  // QGATE_CPU_X86

}  // namespace

Isa best_isa() {
  static const Isa isa = detect();  // the widest the CPU runs (tests pick others through gemv_isa)
  return isa;
}

bool isa_supported(Isa isa) {
  static const Isa hw = detect();
  return static_cast<int64_t>(isa) <= static_cast<int64_t>(hw);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

void to_float_padded(Isa isa, Elem elem, const void* x, int64_t k, float* dst) {
  const auto* p = static_cast<const uint16_t*>(x);
#ifdef QGATE_CPU_X86
  if (isa != Isa::kScalar) {
    elem == Elem::kHalf ? to_float_avx2<Elem::kHalf>(p, k, dst) : to_float_avx2<Elem::kBFloat16>(p, k, dst);
    return;
  }
#endif
  to_float_scalar(elem, p, k, dst);
}

#ifdef QGATE_CPU_X86
namespace {
QGATE_AVX2 void to_half_f16c(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = c10::detail::fp16_ieee_from_fp32_value(src[i]);
}
}  // namespace
#endif

void from_float(Isa isa, Elem elem, const float* src, int64_t n, void* dst) {
  auto* out = static_cast<uint16_t*>(dst);
#ifdef QGATE_CPU_X86
  if (isa != Isa::kScalar && elem == Elem::kHalf) {
    to_half_f16c(src, n, out);
    return;
  }
#endif
  (void)isa;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = elem == Elem::kHalf ? c10::Half(src[i]).x : c10::BFloat16(src[i]).x;
  }
}

void rows_dot(Isa isa, Elem elem, const void* w, int64_t ld, int64_t rows, int64_t k, const float* xf,
              float* out) {
  const auto* p = static_cast<const uint16_t*>(w);
  const bool half = elem == Elem::kHalf;
#ifdef QGATE_CPU_X86
  if (isa == Isa::kAvx512) {
    half ? rows_avx512<Elem::kHalf>(p, ld, rows, k, xf, out) : rows_avx512<Elem::kBFloat16>(p, ld, rows, k, xf, out);
    return;
  }
  if (isa == Isa::kAvx2) {
    half ? rows_avx2<Elem::kHalf>(p, ld, rows, k, xf, out) : rows_avx2<Elem::kBFloat16>(p, ld, rows, k, xf, out);
    return;
  }
#endif
  (void)half;
  rows_scalar(elem, p, ld, rows, k, xf, out);
}

int64_t row_grain(int64_t k, int64_t elem_bytes, int64_t min_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, k * elem_bytes);
  const int64_t rows = (min_bytes + row_bytes - 1) / row_bytes;
  return std::max<int64_t>(4, (rows + 3) / 4 * 4);
}

}  // namespace qgate::cpu
