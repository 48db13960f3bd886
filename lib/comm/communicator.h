// One Communicator interface, several implementations (MPI for CPU, NCCL for GPU), one
// selection point; the topology MPI gives; and the gradient reducer that overlaps bucket
// reductions with backward (DESIGN.md, "Communication"). Owner: comm (issue 5).
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kilter::comm {

// Ranks and communicators of this process. The library is handed `world`; it never assumes
// MPI_COMM_WORLD.
struct Topology {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm node = MPI_COMM_NULL;   // ranks of this node
  MPI_Comm cross = MPI_COMM_NULL;  // ranks with the same local rank, one per node
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  int node_index = 0, num_nodes = 1;
  bool uniform = true;             // every node has local_size ranks (else: flat only)
};

// MPI_Comm_split_type(SHARED), or groups of `ranks_per_node` consecutive ranks when > 0.
// Warns (rank 0) and marks the topology non-uniform when nodes differ in size; checks the world
// size against SLURM_NTASKS when set.
Topology make_topology(MPI_Comm world, int ranks_per_node);
void free_topology(Topology& topo);

enum class DType { f32, f64, i64 };

// An in-flight collective.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sum-allreduce in place.
  virtual std::unique_ptr<Request> iallreduce(void* buf, size_t count, DType t) = 0;
  // recv (count) = sum over ranks of send's rank-th block; send holds size()*count elements.
  virtual std::unique_ptr<Request> ireduce_scatter(const void* send, void* recv, size_t count, DType t) = 0;
  // recv (size()*count) = concatenation of every rank's send (count).
  virtual std::unique_ptr<Request> iallgather(const void* send, void* recv, size_t count, DType t) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  void allreduce(void* buf, size_t count, DType t) { iallreduce(buf, count, t)->wait(); }
};

// kind: "mpi" (host buffers) or "nccl" (device buffers; needs KILTER_WITH_NCCL).
std::unique_ptr<Communicator> make_communicator(const std::string& kind, MPI_Comm comm);

// Reduces the flat gradient buffer (sum) over the world, flat or hierarchically (node
// reduce-scatter -> cross-node allreduce of the 1/L shard -> node allgather), in buckets started
// as backward reports them ready. Call begin() before the last micro-batch's backward, ready()
// from the model's GradReadyFn, finish() after backward: it completes the remaining buckets and
// returns the seconds it blocked (comm_exposed).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual void begin() = 0;
  virtual void ready(size_t offset, size_t count) = 0;
  virtual double finish() = 0;
};
// buf: padded_size floats; padded_size must be a multiple of topo.local_size (the node shards).
std::unique_ptr<GradientReducer> make_gradient_reducer(const Topology& topo, const std::string& kind,
                                                       const std::string& algo, float* buf,
                                                       size_t padded_size, size_t bucket_bytes,
                                                       bool overlap);

}  // namespace kilter::comm
