// The one-GPU-per-rank decision (lib/comm/device_sharing.h), on the CPU: ranks on devices of their
// own pass; ranks sharing a device are refused with their ranks, the device and the fix named,
// unless every one of them has the test-only switch and an NCCL_HOSTID of its own; malformed
// switch values are refused; and this process's record reads the two environment variables.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "lib/comm/device_sharing.h"

namespace kilter::comm {
namespace {

RankDevice on(int rank, const std::string& device, const std::string& host = "node7") {
  RankDevice r;
  r.rank = rank;
  r.host = host;
  r.device = device;
  r.device_label = "cuda device 0 (NVIDIA H100, PCI 0000:1b:00.0, " + device + ")";
  return r;
}

RankDevice shared_test_rank(int rank, const std::string& host_id) {
  RankDevice r = on(rank, "GPU-aaaa");
  r.switch_set = true;
  r.switch_value = "1";
  r.nccl_hostid_set = true;
  r.nccl_hostid = host_id;
  return r;
}

// The user error check_device_sharing throws for `ranks` (fails the test when it returns).
Error refusal(const std::vector<RankDevice>& ranks) {
  try {
    const std::string note = check_device_sharing(ranks);
    ADD_FAILURE() << "accepted, with note '" << note << "'";
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_user_error()) << e.what();
    return e;
  }
  return Error("not refused", __FILE__, __LINE__);
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' missing from: " << text;
}

TEST(DeviceSharing, RanksOnDevicesOfTheirOwnPass) {
  EXPECT_EQ(check_device_sharing({on(0, "GPU-a"), on(1, "GPU-b"), on(2, "GPU-c", "node8"), on(3, "GPU-d", "node8")}),
            "");
  // Every rank seeing "device 0" of its own CUDA_VISIBLE_DEVICES is fine: the UUIDs differ.
  EXPECT_EQ(check_device_sharing({on(0, "GPU-a"), on(1, "GPU-b")}), "");
  EXPECT_EQ(check_device_sharing({on(0, "GPU-a")}), "");
  // The switch alone changes nothing where no device is shared.
  RankDevice with_switch = on(1, "GPU-b");
  with_switch.switch_set = true;
  with_switch.switch_value = "1";
  EXPECT_EQ(check_device_sharing({on(0, "GPU-a"), with_switch}), "");
}

TEST(DeviceSharing, SharingWithoutTheSwitchNamesRanksDeviceAndFix) {
  // 8 ranks on a node of 4 GPUs: local rank % 4 puts ranks 0 and 4 on one GPU, 1 and 5 on another...
  std::vector<RankDevice> ranks;
  for (int r = 0; r < 8; ++r) ranks.push_back(on(r, "GPU-" + std::to_string(r % 4)));
  const std::string message = refusal(ranks).message();
  expect_contains(message, "more ranks than GPUs");
  expect_contains(message, "ranks 0,4 share one GPU, cuda device 0 (NVIDIA H100, PCI 0000:1b:00.0, GPU-0) on host node7");
  expect_contains(message, "ranks 3,7 share one GPU");
  expect_contains(message, "srun --gpus-per-task=1");
  expect_contains(message, "mpirun -npernode");
  EXPECT_EQ(message.find(kShareDeviceSwitch), std::string::npos) << "a user who never set the switch is not told of it";

  const std::string four = refusal({on(0, "GPU-x"), on(1, "GPU-x"), on(2, "GPU-x"), on(3, "GPU-x")}).message();
  expect_contains(four, "ranks 0-3 share one GPU");
}

TEST(DeviceSharing, TheSwitchMustBeSetOnEverySharingRank) {
  std::vector<RankDevice> ranks = {shared_test_rank(0, "h0"), shared_test_rank(1, "h1"), shared_test_rank(2, "h2")};
  ranks[2].switch_set = false;
  const std::string message = refusal(ranks).message();
  expect_contains(message, "ranks 0-2 share one GPU");
  expect_contains(message, std::string(kShareDeviceSwitch) + "=1 is set on ranks 0-1 only");
  ranks[2].switch_set = true;
  ranks[2].switch_value = "0";  // "0" is off
  expect_contains(refusal(ranks).message(), "is set on ranks 0-1 only");
}

TEST(DeviceSharing, TheSwitchAllowsSharingAsDistinctNcclHosts) {
  const std::string note = check_device_sharing(
      {shared_test_rank(0, "kilter-rank-0"), shared_test_rank(1, "kilter-rank-1"), shared_test_rank(2, "kilter-rank-2"),
       shared_test_rank(3, "kilter-rank-3")});
  expect_contains(note, std::string(kShareDeviceSwitch) + "=1: ranks 0-3 share one GPU");
  expect_contains(note, "'kilter-rank-0' 'kilter-rank-1' 'kilter-rank-2' 'kilter-rank-3'");
  expect_contains(note, "speed means nothing");
}

TEST(DeviceSharing, TheSwitchIsRefusedWithoutAnNcclHostIdPerRank) {
  std::vector<RankDevice> ranks = {shared_test_rank(0, "h0"), shared_test_rank(1, "h1"), shared_test_rank(2, "h2")};
  ranks[1].nccl_hostid_set = false;
  std::string message = refusal(ranks).message();
  expect_contains(message, "NCCL_HOSTID is not set on rank 1");
  expect_contains(message, "tests/gpu/ranks-on-one-gpu.sh");

  ranks[1].nccl_hostid_set = true;
  ranks[1].nccl_hostid = "";  // set but empty: NCCL would fall back to the real host
  expect_contains(refusal(ranks).message(), "NCCL_HOSTID is not set on rank 1");

  ranks[1].nccl_hostid = "h0";  // one host id for two ranks: NCCL sees one host, two ranks on a device
  message = refusal(ranks).message();
  expect_contains(message, "ranks 0-1 have the same NCCL_HOSTID 'h0'");
  expect_contains(message, "ranks 0-2 share one GPU");

  // Ranks on other devices may share a host id (several GPUs of one real host).
  ranks = {shared_test_rank(0, "h0"), shared_test_rank(1, "h1"), on(2, "GPU-b"), on(3, "GPU-c")};
  ranks[2].nccl_hostid_set = ranks[3].nccl_hostid_set = true;
  ranks[2].nccl_hostid = ranks[3].nccl_hostid = "h2";
  expect_contains(check_device_sharing(ranks), "ranks 0-1 share one GPU");
}

TEST(DeviceSharing, MalformedSwitchValuesAreRefused) {
  RankDevice typo = on(1, "GPU-b");
  typo.switch_set = true;
  typo.switch_value = "yes";
  const std::string message = refusal({on(0, "GPU-a"), typo}).message();
  expect_contains(message, std::string("environment variable ") + kShareDeviceSwitch + " = 'yes' on rank 1");
  expect_contains(message, "expected 1");
}

TEST(DeviceSharing, LocalRecordReadsTheEnvironment) {
  ::unsetenv("NCCL_HOSTID");
  ::unsetenv(kShareDeviceSwitch);
  RankDevice mine = local_rank_device(5, "GPU-q", "cuda device 1 (test)");
  EXPECT_EQ(mine.rank, 5);
  EXPECT_EQ(mine.device, "GPU-q");
  EXPECT_EQ(mine.device_label, "cuda device 1 (test)");
  EXPECT_FALSE(mine.host.empty());
  EXPECT_FALSE(mine.nccl_hostid_set);
  EXPECT_FALSE(mine.switch_set);
  ::setenv("NCCL_HOSTID", "kilter-rank-5", 1);
  ::setenv(kShareDeviceSwitch, "1", 1);
  mine = local_rank_device(5, "GPU-q", "x");
  EXPECT_TRUE(mine.nccl_hostid_set);
  EXPECT_EQ(mine.nccl_hostid, "kilter-rank-5");
  EXPECT_TRUE(mine.switch_set);
  EXPECT_EQ(mine.switch_value, "1");
  ::unsetenv("NCCL_HOSTID");
  ::unsetenv(kShareDeviceSwitch);
}

}  // namespace
}  // namespace kilter::comm
