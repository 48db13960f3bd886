// One GPU per rank. NCCL refuses two ranks of a communicator on one device ("Duplicate
// GPU detected") from deep inside ncclCommInitRank, and a rank picks its device as local rank
// modulo the devices it sees, so more ranks than GPUs on a node share one in silence until then.
// kilter refuses that first, naming the ranks and the launch that fixes it. A test-only switch,
// set by tests/gpu/ranks-on-one-gpu.sh together with a distinct NCCL_HOSTID per rank, lets ranks
// share the one GPU of a test machine as NCCL "hosts" of their own joined by sockets.
//
// Ranks are told apart by the GPU's UUID, gathered from every rank of the communicator, not by
// counting ranks per node: a launcher that gives each rank its own CUDA_VISIBLE_DEVICES makes
// every rank see "device 0" of 1, and two ranks on one node may rightly use the same index of
// different device lists. The decision is plain C++ (check_device_sharing) so a CPU test checks it.
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace kilter::comm {

// The test-only switch: "1" lets ranks share a device when each has its own NCCL_HOSTID; unset,
// empty or "0" is off; any other value is refused. kilter never sets it.
inline constexpr const char* kShareDeviceSwitch = "KILTER_TEST_SHARE_DEVICE";

// What one rank reports about its device and its environment.
struct RankDevice {
  int rank = 0;              // world rank, for messages
  std::string host;          // gethostname()
  std::string device;        // equal strings = one physical device (the GPU's UUID)
  std::string device_label;  // for messages: "cuda device 0 (NVIDIA H100 ..., PCI ..., GPU-...)"
  bool nccl_hostid_set = false;
  std::string nccl_hostid;
  bool switch_set = false;
  std::string switch_value;  // KILTER_TEST_SHARE_DEVICE as set
};

// This process's record: `rank`, the host name, the device, NCCL_HOSTID and the switch.
RankDevice local_rank_device(int rank, const std::string& device, const std::string& device_label);

// The decision, from every rank's record; every rank that calls it with the same records decides
// alike, so none is left waiting in a later collective. Returns "" when every rank has a device of
// its own, or a note for the log when ranks share one under the switch. Throws a user Error when
// ranks share a device without the switch on every one of them, when a switch value is malformed,
// or when ranks sharing a device lack distinct NCCL_HOSTIDs (NCCL would then see one host and
// refuse the duplicate device itself).
std::string check_device_sharing(const std::vector<RankDevice>& ranks);

// Collective over `comm`: gathers every rank's record and applies check_device_sharing. Prints
// the note (once per process, on world rank 0) and returns it.
std::string check_one_device_per_rank(MPI_Comm comm, const RankDevice& mine);

// check_one_device_per_rank for this process's CUDA device (backend::cuda_device_identity), before
// an NCCL communicator over `comm` is made. Built with CUDA only (device_sharing_cuda.cpp).
void check_nccl_devices(MPI_Comm comm);

}  // namespace kilter::comm
