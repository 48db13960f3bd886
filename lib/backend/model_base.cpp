// ModelBase (model_base.h): the AdamW moments of the owned ranges, on any backend's memory.
#include "lib/backend/model_base.h"

#include <algorithm>

#include "io/base/error.h"

namespace kilter::backend {

ModelBase::ModelBase(const model::ModelSpec& spec, size_t pad_multiple, const std::string& recompute)
    : cfg_(spec), layout_(model::ParamLayout::build(spec, pad_multiple)), offsets_(model::LayoutOffsets::of(layout_)),
      recompute_(model::parse_recompute(recompute)), plan_(model::activation_layout(cfg_, recompute_)),
      schedule_(cfg_, recompute_) {
  owned_ = {{0, layout_.num_params}};
}

size_t ModelBase::owned_floats() const {
  size_t total = 0;
  for (const model::ParamRange& r : owned_) total += r.count;
  return total;
}

void ModelBase::ensure_moments() {
  const size_t total = owned_floats();
  if (adam_m_ != nullptr && moments_held_ == total) return;
  release_moments();
  float* moments = allocate_moments(2 * std::max<size_t>(total, 1));
  adam_m_ = moments;
  adam_v_ = moments + total;
  moments_held_ = total;
}

void ModelBase::release_moments() {
  if (adam_m_ == nullptr) return;
  free_moments(adam_m_);
  adam_m_ = adam_v_ = nullptr;
  moments_held_ = 0;
}

void ModelBase::zero_moments() {
  if (adam_m_ != nullptr) zero(adam_m_, 2 * moments_held_);
}

void ModelBase::get_optimizer_state(float* m, float* v) const {
  KILTER_CHECK(!sharded_, who() << ": get_optimizer_state: the optimizer is sharded; use get_optimizer_shard");
  get_optimizer_shard(m, v, 0, layout_.num_params);
}

void ModelBase::get_optimizer_shard(float* m, float* v, size_t first, size_t count) const {
  const size_t total = owned_floats();
  KILTER_CHECK(first + count <= total, who() << ": get_optimizer_shard: [" << first << ", " << first + count
                                                     << ") beyond the " << total << " held");
  if (adam_m_ == nullptr) {  // no step taken yet
    std::fill(m, m + count, 0.0f);
    std::fill(v, v + count, 0.0f);
    return;
  }
  download(m, adam_m_ + first, count);
  download(v, adam_v_ + first, count);
  finish_copies();
}

// m and v: num_params floats each (the full moments, as a checkpoint holds them); this rank
// keeps its owned ranges of them.
void ModelBase::set_optimizer_state(const float* m, const float* v) {
  ensure_moments();
  size_t dst = 0;
  for (const model::ParamRange& r : owned_) {
    // Only the first num_params floats exist in m and v; the padding's moments stay 0.
    const size_t end = std::min(r.offset + r.count, layout_.num_params);
    if (r.offset < end) {
      upload(adam_m_ + dst, m + r.offset, end - r.offset);
      upload(adam_v_ + dst, v + r.offset, end - r.offset);
    }
    dst += r.count;
  }
  finish_copies();
}

void ModelBase::shard_optimizer(const std::vector<model::ParamRange>& owned) {
  for (const model::ParamRange& r : owned)
    KILTER_CHECK(r.offset + r.count <= layout_.padded_size, who() << ": shard_optimizer: range [" << r.offset
                                                               << ", " << r.offset + r.count << ") beyond the buffer ("
                                                               << layout_.padded_size << ")");
  // Keep what is held for the new ranges (a resume that loaded the full moments first): through
  // the host, once, at setup.
  std::vector<float> held_m, held_v;
  const std::vector<model::ParamRange> held_ranges = owned_;
  if (adam_m_ != nullptr) {
    held_m.resize(moments_held_);
    held_v.resize(moments_held_);
    get_optimizer_shard(held_m.data(), held_v.data(), 0, moments_held_);
  }
  release_moments();
  owned_ = owned;
  sharded_ = true;
  if (held_m.empty()) return;  // nothing held yet: allocated on first use
  // held_ranges is either the full [0, num_params) or a previous shard; copy the overlap.
  std::vector<float> m(owned_floats(), 0.0f), v(m.size(), 0.0f);
  model::copy_range_overlap(held_ranges, held_m.data(), owned_, m.data());
  model::copy_range_overlap(held_ranges, held_v.data(), owned_, v.data());
  ensure_moments();
  upload(adam_m_, m.data(), m.size());
  upload(adam_v_, v.data(), v.size());
  finish_copies();
}

}  // namespace kilter::backend
