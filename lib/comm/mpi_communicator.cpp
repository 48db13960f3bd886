// The MPI Communicator (host buffers): nonblocking collectives (MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather) behind Request handles, and the blocking forms
// mapped to MPI's blocking collectives, whose tuned algorithms Open MPI does not use for the
// nonblocking ones.
#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <vector>

#include "io/base/error.h"
#include "io/base/mpi_check.h"
#include "lib/comm/communicator.h"

namespace kilter::comm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::bf16: return 2;
  }
  KILTER_FAIL("unknown DType " << int(t));
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16: return MPI_UINT16_T;  // moved, never summed (sum_type)
  }
  KILTER_FAIL("unknown DType " << int(t));
}

// The type of a sum: bf16 values travel only in gathers (MPI has no bf16 sum; an integer sum of
// their bits would be garbage).
MPI_Datatype sum_type(DType t) {
  KILTER_CHECK(t != DType::bf16, "MPI communicator: bf16 buffers are gathered, never reduced (reduce in fp32)");
  return mpi_type(t);
}

// MPI counts are int; a bucket never comes near 2^31 elements, so a larger one is a caller bug.
int mpi_count(size_t count, const char* call) {
  KILTER_CHECK(count <= size_t(INT_MAX), call << ": " << count << " elements exceed MPI's int count limit");
  return int(count);
}

class MpiRequest final : public Request {
 public:
  // on_complete runs once, after MPI reports completion (e.g. to move an in-place
  // reduce-scatter result from the front of the buffer into this rank's block).
  MpiRequest(MPI_Request request, const char* what, std::function<void()> on_complete)
      : request_(request), what_(what), on_complete_(std::move(on_complete)) {}
  // A request is dropped in flight only while unwinding an error, when the other ranks may never
  // join the collective: waiting for it would hang the job the error handler is about to abort,
  // and MPI does not allow freeing an active collective request, so it is left to MPI_Abort.
  ~MpiRequest() override = default;
  void wait() override {
    if (done_) return;
    KILTER_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait(" << what_ << ")");
    complete();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    KILTER_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), "MPI_Test(" << what_ << ")");
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    if (on_complete_) on_complete_();
  }
  MPI_Request request_;
  const char* what_;
  std::function<void()> on_complete_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    KILTER_CHECK(comm != MPI_COMM_NULL, "MPI communicator: MPI_COMM_NULL given");
    KILTER_MPI_CHECK(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    KILTER_MPI_CHECK(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Request> iallreduce(void* buf, size_t count, DType t) override {
    MPI_Request request = MPI_REQUEST_NULL;
    KILTER_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count, "MPI_Iallreduce"), sum_type(t), MPI_SUM,
                                    comm_, &request),
                     "MPI_Iallreduce of " << count << " elements");
    return std::make_unique<MpiRequest>(request, "MPI_Iallreduce", nullptr);
  }

  std::unique_ptr<Request> ireduce_scatter(const void* send, void* recv, size_t count, DType t) override {
    MPI_Request request = MPI_REQUEST_NULL;
    const int n = mpi_count(count, "MPI_Ireduce_scatter_block");
    if (is_own_block(send, recv, count, t)) {
      // MPI's in-place form leaves the result at the front of the buffer; move it into this
      // rank's block once it is there.
      void* whole = const_cast<void*>(send);
      KILTER_MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, whole, n, sum_type(t), MPI_SUM, comm_, &request),
                       "MPI_Ireduce_scatter_block (in place) of " << count << " elements per rank");
      return std::make_unique<MpiRequest>(request, "MPI_Ireduce_scatter_block",
                                          [=] { move_front_to_block(whole, count, t); });
    }
    KILTER_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, sum_type(t), MPI_SUM, comm_, &request),
                     "MPI_Ireduce_scatter_block of " << count << " elements per rank");
    return std::make_unique<MpiRequest>(request, "MPI_Ireduce_scatter_block", nullptr);
  }

  std::unique_ptr<Request> iallgather(const void* send, void* recv, size_t count, DType t) override {
    MPI_Request request = MPI_REQUEST_NULL;
    const int n = mpi_count(count, "MPI_Iallgather");
    const void* source = is_own_block(recv, send, count, t) ? MPI_IN_PLACE : send;
    KILTER_MPI_CHECK(MPI_Iallgather(source, n, mpi_type(t), recv, n, mpi_type(t), comm_, &request),
                     "MPI_Iallgather of " << count << " elements per rank");
    return std::make_unique<MpiRequest>(request, "MPI_Iallgather", nullptr);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    char* bytes_ptr = static_cast<char*>(buf);
    // MPI counts are int: large payloads (a checkpoint) go in pieces.
    const size_t piece = size_t(1) << 30;
    size_t done = 0;
    do {
      const size_t n = std::min(piece, bytes - done);
      KILTER_MPI_CHECK(MPI_Bcast(bytes_ptr + done, int(n), MPI_BYTE, root, comm_),
                       "MPI_Bcast of " << bytes << " bytes from rank " << root);
      done += n;
    } while (done < bytes);
  }

  void allreduce(void* buf, size_t count, DType t) override {
    KILTER_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count, "MPI_Allreduce"), sum_type(t), MPI_SUM, comm_),
                     "MPI_Allreduce of " << count << " elements");
  }

  // MPI_Reduce_scatter with equal counts rather than MPI_Reduce_scatter_block: Open MPI 4.1's
  // tuned module has a ring algorithm for the former only, and it is the faster one for the
  // bucket sizes gradients use (measured on 2 and 4 ranks, see docs/comm.md).
  void reduce_scatter(const void* send, void* recv, size_t count, DType t) override {
    const int n = mpi_count(count, "MPI_Reduce_scatter");
    const std::vector<int> counts(size_t(size_), n);
    if (is_own_block(send, recv, count, t)) {
      void* whole = const_cast<void*>(send);
      KILTER_MPI_CHECK(MPI_Reduce_scatter(MPI_IN_PLACE, whole, counts.data(), sum_type(t), MPI_SUM, comm_),
                       "MPI_Reduce_scatter (in place) of " << count << " elements per rank");
      move_front_to_block(whole, count, t);
      return;
    }
    KILTER_MPI_CHECK(MPI_Reduce_scatter(send, recv, counts.data(), sum_type(t), MPI_SUM, comm_),
                     "MPI_Reduce_scatter of " << count << " elements per rank");
  }

  void allgather(const void* send, void* recv, size_t count, DType t) override {
    const int n = mpi_count(count, "MPI_Allgather");
    const void* source = is_own_block(recv, send, count, t) ? MPI_IN_PLACE : send;
    KILTER_MPI_CHECK(MPI_Allgather(source, n, mpi_type(t), recv, n, mpi_type(t), comm_),
                     "MPI_Allgather of " << count << " elements per rank");
  }

 private:
  // True when `block` is this rank's block of `whole` (blocks of `count` elements).
  bool is_own_block(const void* whole, const void* block, size_t count, DType t) const {
    return static_cast<const char*>(whole) + size_t(rank_) * count * dtype_size(t) ==
           static_cast<const char*>(block);
  }
  void move_front_to_block(void* whole, size_t count, DType t) const {
    if (rank_ == 0) return;
    const size_t bytes = count * dtype_size(t);
    char* base = static_cast<char*>(whole);
    // Blocks never overlap when count > 0 and rank > 0, but memmove costs nothing extra.
    std::memmove(base + size_t(rank_) * bytes, base, bytes);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

}  // namespace kilter::comm
