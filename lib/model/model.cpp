// The few non-virtual members of the Model interface (model.h) that every backend shares.
#include "lib/model/model.h"

#include "io/base/error.h"

namespace kilter::model {

void Model::shard_optimizer_unsupported() const {
  KILTER_FAIL("train.shard_optimizer = true: the " << backend_name()
                                                   << " backend has no sharded optimizer yet; set train.shard_optimizer = false");
}

}  // namespace kilter::model
