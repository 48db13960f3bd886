// Token + position embedding, forward and backward (llm.c style, see encoder.h for shapes).
#include "lib/model/encoder.h"

#include "lib/model/vecmath.h"

namespace kilter::model {

KILTER_SIMD_CLONES
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* out_bt = out + (static_cast<size_t>(b) * T + t) * C;
      const int32_t ix = inp[static_cast<size_t>(b) * T + t];
      const float* wpe_t = wpe + static_cast<size_t>(t) * C;
      if (ix >= 0) {
        const float* wte_ix = wte + static_cast<size_t>(ix) * C;
        for (int i = 0; i < C; ++i) out_bt[i] = wte_ix[i] + wpe_t[i];
      } else {
        for (int i = 0; i < C; ++i) out_bt[i] = wpe_t[i];
      }
    }
  }
}

KILTER_SIMD_CLONES
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                      const int32_t* lengths, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    const int length = lengths[b] < T ? lengths[b] : T;
    for (int t = 0; t < length; ++t) {
      const float* dout_bt = dout + (static_cast<size_t>(b) * T + t) * C;
      const int32_t ix = inp[static_cast<size_t>(b) * T + t];
      float* dwpe_t = dwpe + static_cast<size_t>(t) * C;
      for (int i = 0; i < C; ++i) dwpe_t[i] += dout_bt[i];
      if (ix >= 0) {
        float* dwte_ix = dwte + static_cast<size_t>(ix) * C;
        for (int i = 0; i < C; ++i) dwte_ix[i] += dout_bt[i];
      }
    }
  }
}

}  // namespace kilter::model
