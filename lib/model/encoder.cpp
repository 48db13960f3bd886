// Token + position embedding, forward and backward (llm.c style, see encoder.h for shapes).
#include "lib/model/encoder.h"

#include <cstddef>

#include "lib/model/gemm.h"
#include "lib/model/vecmath.h"

namespace kilter::model {

KILTER_SIMD_CLONES
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, const int32_t* cu_seqlens,
                     int pieces, int C, const int32_t* pos_offset) {
  for (int p = 0; p < pieces; ++p) {
    const int first_position = pos_offset == nullptr ? 0 : pos_offset[p];
    for (int i = cu_seqlens[p]; i < cu_seqlens[p + 1]; ++i) {
      float* out_i = out + static_cast<size_t>(i) * C;
      const float* wte_ix = wte + static_cast<size_t>(inp[i]) * C;
      if (wpe == nullptr) {
        for (int c = 0; c < C; ++c) out_i[c] = wte_ix[c];
        continue;
      }
      const float* wpe_t = wpe + static_cast<size_t>(first_position + i - cu_seqlens[p]) * C;
      for (int c = 0; c < C; ++c) out_i[c] = wte_ix[c] + wpe_t[c];
    }
  }
}

void encoder_forward_bf16(float* out, const int32_t* inp, const uint16_t* wte, const uint16_t* wpe,
                          const int32_t* cu_seqlens, int pieces, int C, const int32_t* pos_offset) {
  for (int p = 0; p < pieces; ++p) {
    const int first_position = pos_offset == nullptr ? 0 : pos_offset[p];
    for (int i = cu_seqlens[p]; i < cu_seqlens[p + 1]; ++i) {
      float* out_i = out + static_cast<size_t>(i) * C;
      const uint16_t* wte_ix = wte + static_cast<size_t>(inp[i]) * C;
      if (wpe == nullptr) {
        for (int c = 0; c < C; ++c) out_i[c] = bf16_to_float(wte_ix[c]);
        continue;
      }
      const uint16_t* wpe_t = wpe + static_cast<size_t>(first_position + i - cu_seqlens[p]) * C;
      for (int c = 0; c < C; ++c) out_i[c] = bf16_to_float(wte_ix[c]) + bf16_to_float(wpe_t[c]);
    }
  }
}

KILTER_SIMD_CLONES
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, const int32_t* cu_seqlens,
                      int pieces, int C, const int32_t* pos_offset) {
  for (int p = 0; p < pieces; ++p) {
    const int first_position = pos_offset == nullptr ? 0 : pos_offset[p];
    for (int i = cu_seqlens[p]; i < cu_seqlens[p + 1]; ++i) {
      const float* dout_i = dout + static_cast<size_t>(i) * C;
      float* dwte_ix = dwte + static_cast<size_t>(inp[i]) * C;
      if (dwpe != nullptr) {
        float* dwpe_t = dwpe + static_cast<size_t>(first_position + i - cu_seqlens[p]) * C;
        for (int c = 0; c < C; ++c) dwpe_t[c] += dout_i[c];
      }
      for (int c = 0; c < C; ++c) dwte_ix[c] += dout_i[c];
    }
  }
}

}  // namespace kilter::model
