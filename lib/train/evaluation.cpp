// evaluate (evaluation.h).
#include "lib/train/evaluation.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "io/base/error.h"
#include "lib/train/micro_batch.h"

namespace kilter::train {

double evaluate(StepContext& ctx, PlanCache& eval_plans, const io::DatasetIndex& index, const std::string& data_dir,
                io::ReaderOptions reader_options, int64_t eval_steps, int64_t step_index) {
  const balance::EpochPlan& plan = eval_plans.get(0);
  reader_options.prefetch = 2;
  io::PrefetchReader reader(index, data_dir, reader_options);
  model::Batch batch;
  std::vector<io::PieceRequest> pieces;
  double sums[2] = {0, 0};  // loss sum, targets
  const size_t n_steps = std::min<size_t>(plan.steps.size(), size_t(std::max<int64_t>(0, eval_steps)));
  balance::MicroBatch mb;
  for (size_t s = 0; s < n_steps; ++s) {
    const balance::StepView step = plan.steps[s];
    const auto [first, end] = step.rank_micro_batches(ctx.rank);
    for (uint32_t id = first; id < end; ++id) {
      step.micro_batch(id, mb);
      piece_requests(mb, pieces);
      reader.enqueue(std::move(pieces));
      assemble_batch(reader.next(), mb, batch);
      // Evaluation runs forward only, without a K/V exchange: its plans never cut a piece.
      KILTER_CHECK(batch.pos_offset.empty(), "evaluation step " << s << " holds a part of a cut piece; evaluation "
                                                                << "plans must keep pieces whole");
      sums[0] += ctx.model->forward_loss(batch);
      sums[1] += double(batch.num_targets);
    }
    // Sharded parameters: every rank gathers every unit as often as the busiest (no loss added).
    const int padding = padding_micro_batches(ctx, step);
    if (padding > 0) {
      const model::Batch empty = padding_micro_batch();
      for (int i = 0; i < padding; ++i) ctx.model->forward_loss(empty);
    }
  }
  ctx.watchdog->enter("evaluation allreduce", long(step_index));
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, ctx.world);
  ctx.watchdog->leave();
  return sums[1] > 0 ? sums[0] / sums[1] : NAN;
}

}  // namespace kilter::train
