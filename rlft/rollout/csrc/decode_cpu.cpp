// One decoding step of a Llama-family decoder on the CPU, in fp32: the lean sampler's step
// (rlft/rollout/lean.py) with the element-wise work fused into a few loops over rows.
//
// The matrix products stay ATen's (MKL). Fused here, each in one pass over the rows:
// RMSNorm; per-head RMSNorm (Qwen3), rotary embedding (query/key dims in pair order) and the
// cache write of the new keys and values; grouped-query attention of the new token over the cache
// (each cached key and value read once per key/value head, for all of its query heads; a prompt's
// keys and values cached once for all the rows that sample it); SiLU(gate)*up.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kLanes = 16;  // independent partial sums, so the compiler vectorises reductions

inline float sum(const float* a, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i];
  return s;
}

inline float max_of(const float* a, int64_t n) {
  float acc[kLanes];
  std::fill(acc, acc + kLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = std::max(acc[l], a[i + l]);
  float m = acc[0];
  for (int l = 1; l < kLanes; ++l) m = std::max(m, acc[l]);
  for (; i < n; ++i) m = std::max(m, a[i]);
  return m;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y = w * (x / sqrt(mean(x^2) + eps)), as Hugging Face's Llama RMSNorm in fp32
inline void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float inv = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w[i] * (x[i] * inv);
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto y = at::empty_like(x);
  const int64_t rows = x.size(0), n = x.size(1);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) rms_norm_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
  });
  return y;
}

// qkv [B, (H + 2 KV) * D]: per-head norm (if given) and rotation of queries and keys in place;
// keys and values written to cache column t.
void rotate_and_cache(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& q_norm,
                      const at::Tensor& k_norm, double eps, at::Tensor& keys, at::Tensor& values, int64_t t,
                      int64_t H, int64_t KV, int64_t D) {
  const int64_t B = qkv.size(0), width = qkv.size(1), L = values.size(2), Lk = keys.size(3), half = D / 2;
  float* y = qkv.data_ptr<float>();
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  const float* qn = q_norm.numel() ? q_norm.data_ptr<float>() : nullptr;
  const float* kn = k_norm.numel() ? k_norm.data_ptr<float>() : nullptr;
  float *kc = keys.data_ptr<float>(), *vc = values.data_ptr<float>();
  at::parallel_for(0, B, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float *cb = c + b * half, *sb = s + b * half;
      for (int64_t h = 0; h < H + KV; ++h) {
        float* p = y + b * width + h * D;
        const float* norm = h < H ? qn : kn;
        if (norm) rms_norm_row(p, norm, p, D, static_cast<float>(eps));
        for (int64_t i = 0; i < half; ++i) {  // (x0 + i x1) * (cos + i sin)
          const float x0 = p[2 * i], x1 = p[2 * i + 1];
          p[2 * i] = x0 * cb[i] - x1 * sb[i];
          p[2 * i + 1] = x0 * sb[i] + x1 * cb[i];
        }
        if (h >= H) {  // keys cached transposed: [B, KV, D, Lk]
          float* col = kc + (b * KV + (h - H)) * D * Lk + t;
          for (int64_t d = 0; d < D; ++d) col[d * Lk] = p[d];
        }
      }
      for (int64_t h = 0; h < KV; ++h) {
        const float* p = y + b * width + (H + KV + h) * D;
        std::copy(p, p + D, vc + ((b * KV + h) * L + t) * D);
      }
    }
  });
}

// exp(x) for x <= 0 (softmax weights after subtracting the maximum), 0 below -87 (and for -inf):
// Cephes' single-precision polynomial (about 1 ulp), written so that loops over it vectorise.
inline float exp_nonpositive(float x) {
  const float xc = x > -87.0f ? x : -87.0f;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.0f ? 0.0f : e * scale;
}

constexpr int kBlock = 16;  // columns (scores) or dimensions (values) kept in registers at a time
typedef float Block __attribute__((vector_size(kBlock * sizeof(float))));  // GCC/Clang vector type

inline Block load_block(const float* p) {
  Block v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// scores[g * n + j] = scale * q_g . K[:, j] for the `cols` columns of a transposed key block
// KT [D, stride], g over the `group` query heads q [group, D] that share it. Blocks of kBlock
// columns accumulate in registers over all D dimensions; `stride` is a multiple of kBlock, so the
// last block reads whole (columns past `cols` are computed and dropped).
inline void key_scores(const float* q, int64_t group, int64_t D, float scale, const float* KT, int64_t stride,
                       int64_t cols, float* scores, int64_t n) {
  for (int64_t g = 0; g < group; ++g) {
    const float* qg = q + g * D;
    float* sg = scores + g * n;
    for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
      Block acc = {};
      for (int64_t d = 0; d < D; ++d) acc += (qg[d] * scale) * load_block(KT + d * stride + j0);
      const int64_t width = std::min<int64_t>(kBlock, cols - j0);
      for (int64_t l = 0; l < width; ++l) sg[j0 + l] = acc[l];
    }
  }
}

// a[0..D) += sum over j < rows of p[j] * V[j, :], kBlock dimensions at a time in registers
inline void add_values(const float* p, const float* V, int64_t rows, int64_t D, float* a) {
  const int64_t whole = D - D % kBlock;
  for (int64_t d0 = 0; d0 < whole; d0 += kBlock) {
    Block acc = load_block(a + d0);
    for (int64_t j = 0; j < rows; ++j) acc += p[j] * load_block(V + j * D + d0);
    std::memcpy(a + d0, &acc, sizeof(acc));
  }
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t d = whole; d < D; ++d) a[d] += p[j] * V[j * D + d];
}

// out [B, H * D]: each query head of row b over its prompt's cached columns and its own columns
// 0..t. A prompt's keys and values are cached once for all rows that sample it (keys_p
// [U, KV, D, P'] transposed, values_p [U, KV, P, D]; row b samples prompt prompt_of[b];
// prompt_bias [U, P]: 0 / -inf for the prompt's padding, or empty); the rows' own columns in
// keys [B, KV, D, N'] (transposed) and values [B, KV, N, D]. P', N': P, N rounded up to a multiple
// of kBlock (whole blocks of columns are read). Rows are taken in order, so the rows of
// one prompt (GRPO's groups are consecutive) find its columns already in the processor's cache.
at::Tensor attend(const at::Tensor& qkv, const at::Tensor& keys_p, const at::Tensor& values_p,
                  const at::Tensor& prompt_bias, const at::Tensor& prompt_of, const at::Tensor& keys,
                  const at::Tensor& values, int64_t t, int64_t H, int64_t KV, int64_t D, double scaling) {
  const int64_t B = qkv.size(0), width = qkv.size(1), P = values_p.size(2), N = values.size(2);
  const int64_t Pk = keys_p.size(3), Nk = keys.size(3);  // key columns: P, N rounded up to kBlock
  const int64_t own = t + 1, n = P + own, group = H / KV;
  auto out = at::zeros({B, H * D}, qkv.options());
  const float *y = qkv.data_ptr<float>(), *kp = keys_p.data_ptr<float>(), *vp = values_p.data_ptr<float>();
  const float *kc = keys.data_ptr<float>(), *vc = values.data_ptr<float>();
  const float* bias = prompt_bias.numel() ? prompt_bias.data_ptr<float>() : nullptr;
  const int64_t* row_prompt = prompt_of.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const float scale = static_cast<float>(scaling);
  at::parallel_for(0, B * KV, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(group * n);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / KV, kv = i % KV, shared = row_prompt[b] * KV + kv;
      const float* q = y + b * width + kv * group * D;
      key_scores(q, group, D, scale, kp + shared * D * Pk, Pk, P, scores.data(), n);
      key_scores(q, group, D, scale, kc + i * D * Nk, Nk, own, scores.data() + P, n);
      for (int64_t g = 0; g < group; ++g) {
        float* sg = scores.data() + g * n;
        if (bias) {
          const float* pb = bias + row_prompt[b] * P;
          for (int64_t j = 0; j < P; ++j) sg[j] += pb[j];
        }
        const float top = max_of(sg, n);
        for (int64_t j = 0; j < n; ++j) sg[j] = exp_nonpositive(sg[j] - top);
        const float inv = 1.0f / sum(sg, n);
        for (int64_t j = 0; j < n; ++j) sg[j] *= inv;
        float* a = o + b * H * D + (kv * group + g) * D;
        add_values(sg, vp + shared * P * D, P, D, a);
        add_values(sg + P, vc + i * N * D, own, D, a);
      }
    }
  });
  return out;
}

// silu(g[:, :I]) * g[:, I:]
at::Tensor silu_mul(const at::Tensor& g) {
  const int64_t B = g.size(0), I = g.size(1) / 2;
  auto out = at::empty({B, I}, g.options());
  const float* gp = g.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float *gate = gp + b * 2 * I, *up = gate + I;
      float* r = op + b * I;
      for (int64_t i = 0; i < I; ++i) r[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
  });
  return out;
}

inline at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return bias.numel() ? at::addmm(bias, x, w.t()) : at::mm(x, w.t());
}

inline at::Tensor residual_linear(const at::Tensor& x, const at::Tensor& inp, const at::Tensor& w,
                                  const at::Tensor& bias) {
  auto out = at::addmm(x, inp, w.t());
  return bias.numel() ? out.add_(bias) : out;
}

inline int64_t round_up(int64_t columns) { return (columns + kBlock - 1) / kBlock * kBlock; }

}  // namespace

// One decoding step for every row. x [B, hidden]: the embedded tokens; layers[i]: the 12 tensors
// of layer i (norm_in, qkv, qkv_bias, q_norm, k_norm, o, o_bias, norm_post, gate_up, gate_up_bias,
// down, down_bias; an empty tensor for an absent one; query/key rows in pair order); keys_p[i],
// values_p[i], prompt_bias, prompt_of: the prompts' cache (see `attend`); keys[i] [B, KV, D, N'] and
// values[i] [B, KV, N, D]: the rows' own cache, column t filled here; cos/sin [B, D/2]: the rows'
// rotations. Returns the next-token logits [B, V] (final norm, LM head with head_bias if not empty).
at::Tensor decode_step(at::Tensor x, const std::vector<std::vector<at::Tensor>>& layers,
                       const std::vector<at::Tensor>& keys_p, const std::vector<at::Tensor>& values_p,
                       const at::Tensor& prompt_bias, const at::Tensor& prompt_of, std::vector<at::Tensor> keys,
                       std::vector<at::Tensor> values, const at::Tensor& cos, const at::Tensor& sin, int64_t t,
                       int64_t H, int64_t KV, int64_t D, double scaling, double eps, const at::Tensor& final_norm,
                       const at::Tensor& head, const at::Tensor& head_bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, "decode_step: x must be fp32 [B, hidden]");
  const size_t layer_count = layers.size();
  TORCH_CHECK(keys.size() == layer_count && values.size() == layer_count && keys_p.size() == layer_count &&
                  values_p.size() == layer_count, "decode_step: one cache per layer");
  TORCH_CHECK(H % KV == 0 && D % 2 == 0, "decode_step: heads must be a multiple of kv heads, head_dim even");
  const int64_t B = x.size(0), U = values_p[0].size(0), P = values_p[0].size(2), N = values[0].size(2);
  TORCH_CHECK(prompt_of.scalar_type() == at::kLong && prompt_of.is_contiguous() && prompt_of.numel() == B,
              "decode_step: prompt_of must be int64 [B]");
  const int64_t* row_prompt = prompt_of.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(row_prompt[b] >= 0 && row_prompt[b] < U, "decode_step: prompt_of out of range");
  for (size_t i = 0; i < layer_count; ++i) {
    TORCH_CHECK(layers[i].size() == 12, "decode_step: 12 tensors per layer");
    TORCH_CHECK(keys[i].is_contiguous() && keys[i].sizes() == at::IntArrayRef({B, KV, D, round_up(N)}) &&
                    values[i].is_contiguous() && values[i].sizes() == at::IntArrayRef({B, KV, N, D}),
                "decode_step: own caches must be contiguous keys [B, KV, D, N rounded up to 16] and values [B, KV, N, D]");
    TORCH_CHECK(keys_p[i].is_contiguous() && keys_p[i].sizes() == at::IntArrayRef({U, KV, D, round_up(P)}) &&
                    values_p[i].is_contiguous() && values_p[i].sizes() == at::IntArrayRef({U, KV, P, D}),
                "decode_step: prompt caches must be contiguous keys [U, KV, D, P rounded up to 16] and values [U, KV, P, D]");
  }
  TORCH_CHECK(t >= 0 && t < N, "decode_step: column t outside the cache");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == B * D / 2 && sin.numel() == B * D / 2,
              "decode_step: cos/sin must be contiguous [B, D/2]");
  TORCH_CHECK(!prompt_bias.numel() || (prompt_bias.is_contiguous() && prompt_bias.size(0) == U &&
                                       prompt_bias.size(1) == P && prompt_bias.scalar_type() == at::kFloat),
              "decode_step: prompt_bias must be fp32 [U, P]");
  for (size_t i = 0; i < layer_count; ++i) {
    const auto& w = layers[i];
    auto qkv = linear(rms_norm_rows(x, w[0], eps), w[1], w[2]);
    rotate_and_cache(qkv, cos, sin, w[3], w[4], eps, keys[i], values[i], t, H, KV, D);
    auto attended = attend(qkv, keys_p[i], values_p[i], prompt_bias, prompt_of, keys[i], values[i], t, H, KV, D,
                           scaling);
    x = residual_linear(x, attended, w[5], w[6]);
    auto g = linear(rms_norm_rows(x, w[7], eps), w[8], w[9]);
    x = residual_linear(x, silu_mul(g), w[10], w[11]);
  }
  return linear(rms_norm_rows(x, final_norm, eps), head, head_bias);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_step", &decode_step, "fp32 decoding step of a Llama-family decoder (CPU)");
}
