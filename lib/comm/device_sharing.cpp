// One GPU per rank: the decision (check_device_sharing) and its collective (see device_sharing.h).
#include "lib/comm/device_sharing.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "io/base/error.h"
#include "io/base/mpi_check.h"
#include "io/text_format.h"

namespace kilter::comm {

namespace {

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + io::rank_list_text(ranks);
}

bool switch_on(const RankDevice& r) { return r.switch_set && r.switch_value == "1"; }

// Records of ranks that share a device, one group per device in order of its lowest rank.
std::vector<std::vector<const RankDevice*>> shared_devices(const std::vector<RankDevice>& ranks) {
  std::map<std::string, std::vector<const RankDevice*>> by_device;
  for (const RankDevice& r : ranks) by_device[r.device].push_back(&r);
  std::vector<std::vector<const RankDevice*>> shared;
  for (auto& [device, group] : by_device)
    if (group.size() > 1) shared.push_back(group);
  const auto lowest_rank = [](const std::vector<const RankDevice*>& g) {
    int lowest = g.front()->rank;
    for (const RankDevice* r : g) lowest = std::min(lowest, r->rank);
    return lowest;
  };
  std::sort(shared.begin(), shared.end(), [&](const auto& a, const auto& b) { return lowest_rank(a) < lowest_rank(b); });
  return shared;
}

std::vector<int> ranks_of(const std::vector<const RankDevice*>& group) {
  std::vector<int> out;
  for (const RankDevice* r : group) out.push_back(r->rank);
  return out;
}

// "ranks 0-3 share one GPU, cuda device 0 (...) on host node17"
std::string describe_group(const std::vector<const RankDevice*>& group) {
  return ranks_word(ranks_of(group)) + " share one GPU, " + group.front()->device_label + " on host " +
         group.front()->host;
}

void refuse_malformed_switch(const std::vector<RankDevice>& ranks) {
  std::map<std::string, std::vector<int>> bad;  // value -> ranks
  for (const RankDevice& r : ranks)
    if (r.switch_set && r.switch_value != "" && r.switch_value != "0" && r.switch_value != "1")
      bad[r.switch_value].push_back(r.rank);
  if (bad.empty()) return;
  std::ostringstream values;
  for (const auto& [value, on] : bad) values << (values.tellp() > 0 ? ", " : "") << "'" << value << "' on " << ranks_word(on);
  KILTER_USER_FAIL("environment variable " << kShareDeviceSwitch << " = " << values.str()
                                           << ": expected 1 (ranks may share a GPU, for tests only) or unset");
}

// Ranks share a device and some lack the switch: the launch gives a node more ranks than GPUs.
void refuse_sharing(const std::vector<std::vector<const RankDevice*>>& shared) {
  std::ostringstream msg;
  msg << "more ranks than GPUs: ";
  for (size_t g = 0; g < shared.size(); ++g) {
    msg << (g ? "; " : "") << describe_group(shared[g]);
    std::vector<int> with_switch;
    for (const RankDevice* r : shared[g])
      if (switch_on(*r)) with_switch.push_back(r->rank);
    if (!with_switch.empty())
      msg << " (" << kShareDeviceSwitch << "=1 is set on " << ranks_word(with_switch) << " only)";
  }
  msg << ". NCCL needs a GPU of its own for every rank (it would stop with \"Duplicate GPU detected\"). "
         "Launch one rank per GPU: srun --gpus-per-task=1 (or --ntasks-per-node=<GPUs per node>), or "
         "mpirun -npernode <GPUs per node>; or start fewer ranks. Ranks on one GPU are a test layout "
         "only (tests/gpu/ranks-on-one-gpu.sh)";
  KILTER_USER_FAIL(msg.str());
}

// Under the switch: every rank of a shared device needs an NCCL_HOSTID of its own, or NCCL sees
// one host and refuses the duplicate device itself.
void refuse_missing_host_ids(const std::vector<std::vector<const RankDevice*>>& shared) {
  std::ostringstream problems;
  for (const auto& group : shared) {
    std::vector<int> unset;
    std::map<std::string, std::vector<int>> by_id;
    for (const RankDevice* r : group) {
      if (!r->nccl_hostid_set || r->nccl_hostid.empty())
        unset.push_back(r->rank);
      else
        by_id[r->nccl_hostid].push_back(r->rank);
    }
    std::ostringstream group_problems;
    if (!unset.empty()) group_problems << "NCCL_HOSTID is not set on " << ranks_word(unset);
    for (const auto& [id, on] : by_id)
      if (on.size() > 1)
        group_problems << (group_problems.tellp() > 0 ? ", " : "") << ranks_word(on) << " have the same NCCL_HOSTID '"
                       << id << "'";
    if (group_problems.tellp() > 0)
      problems << (problems.tellp() > 0 ? "; " : "") << group_problems.str() << " (" << describe_group(group) << ")";
  }
  if (problems.tellp() == 0) return;
  KILTER_USER_FAIL(kShareDeviceSwitch << "=1 lets ranks share a GPU only as NCCL hosts of their own, each with a "
                                         "distinct NCCL_HOSTID: "
                                      << problems.str()
                                      << ". Launch through tests/gpu/ranks-on-one-gpu.sh, which sets one per rank");
}

// Fields joined by '\0', so any text travels (a host id may hold spaces).
std::string serialize(const RankDevice& r) {
  const std::string fields[] = {std::to_string(r.rank),   r.host,           r.device,
                                r.device_label,           r.nccl_hostid_set ? "1" : "0", r.nccl_hostid,
                                r.switch_set ? "1" : "0", r.switch_value};
  std::string out;
  for (const std::string& f : fields) out += f + '\0';
  return out;
}

RankDevice deserialize(const char* data, size_t size) {
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t i = 0; i < size; ++i)
    if (data[i] == '\0') {
      fields.emplace_back(data + start, i - start);
      start = i + 1;
    }
  KILTER_CHECK(fields.size() == 8, "device check: a rank's record has " << fields.size() << " fields, expected 8");
  RankDevice r;
  r.rank = std::atoi(fields[0].c_str());
  r.host = fields[1];
  r.device = fields[2];
  r.device_label = fields[3];
  r.nccl_hostid_set = fields[4] == "1";
  r.nccl_hostid = fields[5];
  r.switch_set = fields[6] == "1";
  r.switch_value = fields[7];
  return r;
}

std::vector<RankDevice> gather_records(MPI_Comm comm, const RankDevice& mine) {
  int size = 1;
  KILTER_MPI_CHECK(MPI_Comm_size(comm, &size), "MPI_Comm_size (device check)");
  const std::string bytes = serialize(mine);
  const int length = int(bytes.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  KILTER_MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm),
                   "MPI_Allgather (device check: record sizes)");
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[size_t(r)] = total;
    total += lengths[size_t(r)];
  }
  std::vector<char> all(size_t(std::max(total, 1)));
  KILTER_MPI_CHECK(MPI_Allgatherv(bytes.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                                  MPI_CHAR, comm),
                   "MPI_Allgatherv (device check: records)");
  std::vector<RankDevice> records;
  for (int r = 0; r < size; ++r)
    records.push_back(deserialize(all.data() + offsets[size_t(r)], size_t(lengths[size_t(r)])));
  return records;
}

}  // namespace

RankDevice local_rank_device(int rank, const std::string& device, const std::string& device_label) {
  RankDevice r;
  r.rank = rank;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  r.host = host;
  r.device = device;
  r.device_label = device_label;
  if (const char* id = std::getenv("NCCL_HOSTID")) {
    r.nccl_hostid_set = true;
    r.nccl_hostid = id;
  }
  if (const char* value = std::getenv(kShareDeviceSwitch)) {
    r.switch_set = true;
    r.switch_value = value;
  }
  return r;
}

std::string check_device_sharing(const std::vector<RankDevice>& ranks) {
  refuse_malformed_switch(ranks);
  const auto shared = shared_devices(ranks);
  if (shared.empty()) return "";
  for (const auto& group : shared)
    for (const RankDevice* r : group)
      if (!switch_on(*r)) refuse_sharing(shared);
  refuse_missing_host_ids(shared);
  std::ostringstream note;
  note << kShareDeviceSwitch << "=1: ";
  for (size_t g = 0; g < shared.size(); ++g) {
    note << (g ? "; " : "") << describe_group(shared[g]) << " as NCCL hosts";
    for (const RankDevice* r : shared[g]) note << " '" << r->nccl_hostid << "'";
  }
  note << ". A test layout: NCCL joins them over sockets, so their speed means nothing";
  return note.str();
}

std::string check_one_device_per_rank(MPI_Comm comm, const RankDevice& mine) {
  const std::string note = check_device_sharing(gather_records(comm, mine));
  static std::atomic<bool> printed{false};
  if (!note.empty() && mine.rank == 0 && !printed.exchange(true)) {
    std::fprintf(stderr, "kilter: warning: %s\n", note.c_str());
    std::fflush(stderr);
  }
  return note;
}

}  // namespace kilter::comm
