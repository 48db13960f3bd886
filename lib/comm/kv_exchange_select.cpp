// The one place that picks a K/V exchange implementation (kv_schedule.h): "mpi" (host buffers,
// always built) or "nccl" (device buffers, built only with KILTER_WITH_NCCL).
#include <utility>

#include "io/base/error.h"
#include "lib/comm/kv_exchange_mpi.h"
#include "lib/comm/kv_schedule.h"
#ifdef KILTER_WITH_NCCL
#include "lib/comm/device_sharing.h"
#include "lib/comm/kv_exchange_nccl.h"
#endif

namespace kilter::comm {

CutExchangeFactory kv_exchange_factory(const std::string& kind, MPI_Comm comm, double timeout_s) {
  if (kind == "mpi") {
    (void)timeout_s;  // each exchange gets it in its options
    return [comm](KvSchedule schedule, const KvExchangeOptions& opts) -> std::unique_ptr<CutExchange> {
      return std::make_unique<MpiKvExchange>(comm, std::move(schedule), opts);
    };
  }
  if (kind == "nccl") {
#ifdef KILTER_WITH_NCCL
    check_nccl_devices(comm);
    std::shared_ptr<NcclKvChannel> channel = make_nccl_kv_channel(comm, timeout_s);
    return [channel](KvSchedule schedule, const KvExchangeOptions& opts) {
      return make_nccl_kv_exchange(channel, std::move(schedule), opts);
    };
#else
    KILTER_FAIL("K/V exchange 'nccl' is not compiled into this kilter (backends: see kilter --version); "
                "rebuild with -DENABLE_CUDA=ON -DENABLE_NCCL=ON, or train on the cpu backend");
#endif
  }
  KILTER_FAIL("unknown K/V exchange kind '" << kind << "': expected mpi | nccl");
}

}  // namespace kilter::comm
