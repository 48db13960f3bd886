// Softmax cross-entropy over the vocabulary, summed over rows that have a target.
#pragma once
#include <cstdint>

namespace kilter::model {

// logits (N,V); targets (N), -1 = no target. Returns sum over rows with a target of
// -log softmax(logits)[target]. dlogits (N,V) += (softmax - onehot) * dloss_scale on those rows;
// rows with target -1 are left untouched.
double crossentropy_forward_backward(float* dlogits, const float* logits, const int32_t* targets, int N, int V,
                                     float dloss_scale);

// The model's fused form: returns the same sum and REPLACES logits by the gradient
// (softmax - onehot) * dloss_scale; rows without a target become 0.
double crossentropy_forward_backward_inplace(float* logits, const int32_t* targets, int N, int V, float dloss_scale);

// Loss only (evaluation).
double crossentropy_forward(const float* logits, const int32_t* targets, int N, int V);

}  // namespace kilter::model
