// One Communicator interface, several implementations (MPI for CPU, NCCL for GPU), one
// selection point; the topology MPI gives; and the gradient reducer that overlaps bucket
// reductions with backward (docs/design.md, "Communication"). Owner: comm.
#pragma once
#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
// Collective over `world`: ranks passing the same `node_id` form one node (make_topology uses
// it; tests use it to build layouts no launcher gives, e.g. non-uniform nodes).
Topology make_topology_from_node_ids(MPI_Comm world, int node_id);
void free_topology(Topology& topo);

// bf16: 16-bit brain floats (their bits as uint16_t), only moved (gathers): every sum is in fp32.
enum class DType { f32, f64, i64, bf16 };

// [offset, offset + count) of a flat buffer, in elements.
struct BufferRange {
  size_t offset = 0;
  size_t count = 0;
};
size_t dtype_size(DType t);

// An in-flight collective.
class Request {
 public:
  virtual ~Request() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete (and from then on)
};

// Collectives over one group of ranks. Buffers are host memory for "mpi", device memory for
// "nccl". Every rank of the group calls the same collectives in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sum-allreduce in place.
  virtual std::unique_ptr<Request> iallreduce(void* buf, size_t count, DType t) = 0;
  // recv (count) = sum over ranks of send's rank-th block; send holds size()*count elements.
  // In place when recv == send + rank()*count (elements): the result lands in this rank's own
  // block and the other blocks of send are left unspecified (NCCL's in-place convention).
  virtual std::unique_ptr<Request> ireduce_scatter(const void* send, void* recv, size_t count, DType t) = 0;
  // recv (size()*count) = concatenation of every rank's send (count).
  // In place when send == recv + rank()*count (elements).
  virtual std::unique_ptr<Request> iallgather(const void* send, void* recv, size_t count, DType t) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;

  // Blocking forms. An implementation overrides them when its blocking collectives are faster
  // than waiting on the nonblocking ones (Open MPI's tuned blocking algorithms are up to 2x
  // faster than its libnbc nonblocking ones on shared memory).
  virtual void allreduce(void* buf, size_t count, DType t) { iallreduce(buf, count, t)->wait(); }
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType t) {
    ireduce_scatter(send, recv, count, t)->wait();
  }
  virtual void allgather(const void* send, void* recv, size_t count, DType t) {
    iallgather(send, recv, count, t)->wait();
  }
};

// The MPI implementation over `comm` (host buffers). It uses `comm` as given and does not free it.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

// kind: "mpi" (host buffers) or "nccl" (device buffers; needs KILTER_WITH_NCCL).
// timeout_s bounds how long a device collective may wait before the communicator is aborted
// with a message ([comm] timeout_s); the MPI implementation relies on the watchdog instead.
std::unique_ptr<Communicator> make_communicator(const std::string& kind, MPI_Comm comm, double timeout_s = 300.0);

// Reduces the flat gradient buffer (sum) over the world, flat or hierarchically (node
// reduce-scatter -> cross-node allreduce of the 1/L shard -> node allgather), or only scatters it
// (ReducerOptions::shard: node reduce-scatter -> cross-node reduce-scatter), in buckets started
// as backward reports them ready. Call begin() before the last micro-batch's backward, ready()
// from the model's GradReadyFn, finish() after backward: it completes the remaining buckets and
// returns the seconds it blocked (comm_exposed).
// ready() between finish() and the next begin() is ignored (earlier micro-batches of a step only
// accumulate). Buckets are launched strictly from the highest offset down, so every rank issues
// the same collectives in the same order whatever order its ranges arrive in.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual void begin() = 0;
  virtual void ready(size_t offset, size_t count) = 0;
  virtual double finish() = 0;
  // Buckets of the buffer, and how many of them the last step started before finish() (the
  // ones whose reduction could overlap backward).
  virtual size_t num_buckets() const { return 0; }
  virtual size_t buckets_started_early() const { return 0; }
  // The most buckets one stage of the last step held in flight at once (nonblocking
  // collectives; 0 where each bucket ran as a blocking call): at most kMpiBucketsInFlight over MPI.
  virtual size_t most_buckets_in_flight() const { return 0; }

  // Sharded reduction (ReducerOptions::shard, ZeRO-1): the ranges of the buffer this rank holds
  // fully reduced after finish(), one per bucket, in bucket order; together over the ranks they
  // tile the buffer, 1/P of it each. Unsharded: the whole buffer.
  virtual std::vector<BufferRange> owned() const = 0;
  // Collective, sharded reduction only: every rank's owned ranges of `params` (a buffer laid out
  // as the gradients) reach every rank, bucket by bucket in bucket order, over communicators of
  // their own (the reverse of the scatter: across nodes, then inside the node). Call it between
  // finish() and the next begin(). Unsharded: does nothing.
  virtual void gather(float* params) = 0;
  // The same gather, left to the communication thread (overlap mode thread) while the caller goes
  // on: buckets in ascending offsets, so the embeddings and the first layers arrive first, and
  // wait_gather(end) blocks until params[0, end) has arrived (rethrowing the thread's failure). A
  // reducer without that thread gathers in start_gather, blocking. gather() and start_gather() wait
  // for a gather in flight first; whoever reads params waits with wait_gather (the next forward, layer
  // by layer: lib/model/model.h params_arriving).
  virtual bool gathers_in_background() const { return false; }
  // Whether a step's reduction or a gather may still be reading or writing the buffers (begun
  // and not finished, or a gather in flight). A rank that unwinds an error while this holds
  // must not free those buffers: the communication thread may be inside a collective that the
  // other ranks never join, and the reducer lets that thread go rather than wait forever.
  virtual bool communicating() const { return false; }
  virtual void start_gather(float* params) { gather(params); }
  // The distributed optimizer (train.shard = optimizer with a bf16 working copy and a sharded
  // fp32 master, lib/model/model.h gathered_working_copy): the same gathers of a bf16 buffer
  // laid out as the gradients, half the bytes of the fp32 gather. wait_gather and gather_arrival
  // serve both. A reducer that gathers no working copy refuses it.
  virtual void gather_bf16(uint16_t* working) {
    (void)working;
    throw_no_bf16_gather();
  }
  virtual void start_gather_bf16(uint16_t* working) { gather_bf16(working); }
  virtual void wait_gather(size_t end) { (void)end; }
  // The gather started last: a flag the communication thread sets once every range has arrived
  // (read from any thread; it outlives the reducer). nullptr where start_gather() blocks.
  virtual std::shared_ptr<const std::atomic<bool>> gather_arrival() const { return nullptr; }

 private:
  [[noreturn]] static void throw_no_bf16_gather();
};

// How bucket reductions make progress while backward computes.
//   off:    nothing is sent before finish(); finish() runs every bucket.
//   poll:   ready() launches nonblocking collectives and advances them with test() (Open MPI
//           only progresses nonblocking collectives inside MPI calls).
//   thread: a communication thread runs each bucket as soon as it is ready, with blocking
//           collectives or with nonblocking ones it tests every 50 us (blocking_collectives).
//           Needs MPI_THREAD_MULTIPLE; falls back to poll with a warning.
//   automatic: for "mpi", thread with nonblocking collectives when MPI_THREAD_MULTIPLE is
//           provided, else poll; for "nccl", poll (NCCL launches are asynchronous anyway).
enum class OverlapMode { off, poll, thread, automatic };
OverlapMode parse_overlap_mode(const std::string& name);  // off|poll|thread|auto; throws Error
const char* overlap_mode_name(OverlapMode mode);

struct ReducerOptions {
  std::string kind = "mpi";             // communicator kind, see make_communicator
  double timeout_s = 300.0;             // [comm] timeout_s, for device communicators
  std::string algo = "hierarchical";    // flat | hierarchical
  size_t bucket_bytes = 4u << 20;       // target bucket size; rounded to whole node shards
  OverlapMode overlap = OverlapMode::automatic;
  // Elements [0, reported_size) are reported through ready(); [reported_size, padded_size) is
  // padding the model never reports and counts as ready from begin(). 0 means padded_size.
  // Pass the model's num_params, or the highest bucket waits for finish() and nothing overlaps.
  size_t reported_size = 0;
  // How the off and thread modes run a bucket's stages: blocking collectives (Open MPI's tuned
  // algorithms; a thread inside them spins on its core) or nonblocking ones tested every 50 us
  // (pipelined stages, little CPU). Poll mode is always nonblocking.
  bool blocking_collectives = true;
  // ZeRO-1 (train.shard_optimizer): the reduction stops after the scatter, so each rank ends with
  // 1/P of every bucket fully reduced (owned()) and the rest of the buffer unspecified. Flat: one
  // reduce-scatter over the world per bucket; hierarchical: a reduce-scatter inside the node,
  // then one across nodes of the node shard. padded_size must then be a multiple of the world
  // size (buckets are whole multiples of P * 64 elements where the buffer allows).
  bool shard = false;
  // With shard, hierarchical and more than one node: shard inside the node only and replicate
  // across nodes (HSDP, train.shard_group = node). Each bucket is reduce-scattered inside the
  // node, the node shard all-reduced across nodes (1/L of the flat path's cross-node bytes), and
  // owned() is the node shard (1/L of the buffer), gathered back inside the node only.
  bool shard_within_node = false;
};

// The most buckets one stage of the reducer holds in flight at once over MPI (nonblocking
// collectives: poll mode, and the communication thread's). Each holds Open MPI's temporary until
// it completes (its reduce-scatter: twice the bucket), and a communication thread behind a
// backward that runs ahead held dozens at once (rank 0 of GPT-2 124M on 4 ranks under
// train.shard = optimizer: 330 MiB of them). NCCL's collectives take no host temporaries: unbounded.
constexpr size_t kMpiBucketsInFlight = 2;

// The temporaries of Open MPI's nonblocking reduce-scatter (libnbc) that a rank of a
// `group_size`-rank stage writes, at most kMpiBucketsInFlight buckets of `bucket_bytes` at once:
// it reduces to the stage's rank 0 along a binomial tree, then scatters, in a temporary of twice
// the bucket on every rank, of which a rank writes one half per bucket it receives from a peer
// (both halves from the second on). rank0: the stage's rank 0; other: the most of any other rank.
struct ReduceScatterScratch {
  uint64_t rank0 = 0, other = 0;
};
ReduceScatterScratch mpi_reduce_scatter_scratch(uint64_t bucket_bytes, int group_size);

// buf: padded_size floats; padded_size must be a multiple of topo.local_size (the node shards),
// and of topo.size when opts.shard.
std::unique_ptr<GradientReducer> make_gradient_reducer(const Topology& topo, float* buf,
                                                       size_t padded_size, const ReducerOptions& opts);
// The original form: overlap true = automatic, false = off; every element is reported.
std::unique_ptr<GradientReducer> make_gradient_reducer(const Topology& topo, const std::string& kind,
                                                       const std::string& algo, float* buf,
                                                       size_t padded_size, size_t bucket_bytes,
                                                       bool overlap);

}  // namespace kilter::comm
