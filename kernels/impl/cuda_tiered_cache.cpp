// The live tiered KV cache's CUDA backend (kernels/cuda_tiered_cache.hpp, docs/LIVE.md).
#include "kernels/cuda_tiered_cache.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/device_plan.hpp"
#include "kernels/impl/cuda_handles.hpp"
#include "kernels/impl/cuda_kernels.cuh"
#include "kernels/impl/host_recode.hpp"
#include "kernels/impl/kv_quantise.hpp"
#include "kernels/impl/worker_pool.hpp"
#include "kernels/tier_book.hpp"

namespace kvtier::kernels {
namespace {

using cuda::Checker;
using cuda::DeviceMemory;
using cuda::Dtype;
using cuda::EventPool;
using cuda::PinnedMemory;
using cuda::Stream;
using replay::Tier;
using Clock = std::chrono::steady_clock;

constexpr unsigned kMappedHost = cudaHostAllocMapped | cudaHostAllocPortable;

// Transient staging regions for `lookahead` layers ahead of the one computing: one each, and no
// more than the layers (a forward call stages each layer once). ConfigError out of range.
int staging_regions(int lookahead, int layers) {
  check_staging_lookahead(lookahead, "staging lookahead");
  return std::min(lookahead + 1, layers);
}

class CudaTieredCache final : public LiveKvCache, public DeviceKeyValueStore {
 public:
  CudaTieredCache(const config::ModelSpec& spec, const CudaEngineOptions& engine,
                  const TieredCacheOptions& options);
  CudaTieredCache(const CudaTieredCache&) = delete;
  CudaTieredCache& operator=(const CudaTieredCache&) = delete;
  CudaTieredCache(CudaTieredCache&&) = delete;
  CudaTieredCache& operator=(CudaTieredCache&&) = delete;
  ~CudaTieredCache() override;

  [[nodiscard]] std::vector<replay::LayerPlacement>& placement() override {
    return book_.placement();
  }
  void apply_placement() override;
  [[nodiscard]] const TieredCacheStats& stats() override;
  [[nodiscard]] std::array<std::uint64_t, replay::kTierCount> tier_bytes() const override {
    return book_.tier_bytes();
  }
  [[nodiscard]] std::uint64_t t0_budget_bytes() const override { return book_.t0_budget_bytes(); }
  [[nodiscard]] std::uint64_t token_bytes() const override { return book_.token_bytes(); }
  [[nodiscard]] std::uint64_t compressed_token_bytes() const override {
    return book_.compressed_token_bytes();
  }
  [[nodiscard]] CacheAllocation allocation() const override { return allocation_; }
  void attach(Engine& engine) override { engine.set_device_kv_store(this); }
  void detach(Engine& engine) override { engine.set_device_kv_store(nullptr); }

  void begin_forward(int first_position, int rows, void* stream) override;
  DeviceLayerSlots layer(int layer, void* stream) override;
  void end_layer(int layer, void* stream) override;

 private:
  struct Timer {
    CopyCounter* counter = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
  };

  void select_device() const { check_(cudaSetDevice(device_), "cudaSetDevice"); }
  void sample_device_memory();
  // Enqueues `enqueue` on the copy stream between two timing events; stats() adds the time
  // between them to `counter`.
  template <typename Enqueue>
  void timed(CopyCounter& counter, Enqueue&& enqueue);
  void launched(cudaError_t status, const char* kernel) const;
  void ensure_host_tiers();
  // Pins T1 and/or T2 where asked and not yet pinned.
  void pin_host_tiers(bool t1, bool t2);
  void ensure_staging(std::uint64_t persistent, std::uint64_t region);
  void write_plan(int layer, const StagePlan& plan);
  void stage(int layer);
  void recode_on_host(const std::vector<TokenMove>& moves);
  // Copies `count` slot pairs (source slot, target slot) of full precision from `source` to
  // `target` (host addresses of the host tiers) on the copy engines, as runs of consecutive
  // slots.
  void copy_runs(const std::uint32_t* pairs, std::uint64_t count, const std::byte* source,
                 std::byte* target, cudaStream_t stream);
  [[nodiscard]] std::uint32_t* host_plan(int layer) const {
    return reinterpret_cast<std::uint32_t*>(plans_host_.get()) +
           static_cast<std::size_t>(layer) * plan_stride_;
  }
  [[nodiscard]] std::uint32_t* device_plan(int layer) const {
    return static_cast<std::uint32_t*>(plans_device_.get()) +
           static_cast<std::size_t>(layer) * plan_stride_;
  }
  [[nodiscard]] cuda::SlotBatch make_batch(const void* source, void* target,
                                           const std::uint32_t* pairs, std::uint64_t count) const;

  int device_;
  Checker check_;
  Dtype dtype_;
  int layers_;
  int kv_heads_;
  int head_dim_;
  // Transient staging regions: the layer computing and the staging lookahead's layers ahead.
  int regions_;
  std::uint64_t max_positions_;
  std::uint64_t slot_bytes_;
  TierBook book_;
  // The copy stream is declared last, so it is destroyed first: it waits for its work before
  // any buffer or event that work uses goes.
  DeviceMemory t0_;
  PinnedMemory t1_;
  PinnedMemory t2_;
  DeviceMemory staging_;
  std::uint64_t persistent_slots_ = 0;  // staging slots before the transient regions
  std::uint64_t region_slots_ = 0;      // slots of each transient region
  std::size_t plan_stride_;             // 4-byte words per layer
  PinnedMemory plans_host_;
  DeviceMemory plans_device_;
  PinnedMemory moves_;  // mapped: the move batches' slot pairs, read by the kernels in place
  std::vector<StagePlan> stage_plans_;  // per layer, buffers reused call after call
  std::vector<DevicePlanSize> layer_plans_;
  WorkerPool recode_pool_;  // recode_on_host's threads
  CacheCopies copies_;
  // copy_runs' arrays, reused (the batch call reads them before it returns).
  std::vector<void*> run_targets_;
  std::vector<const void*> run_sources_;
  std::vector<std::size_t> run_bytes_;
  EventPool marks_;
  EventPool timing_events_;
  std::vector<cudaEvent_t> staged_;    // per layer: its staging has landed
  std::vector<cudaEvent_t> attended_;  // per layer: its attention ran, its region is free
  cudaEvent_t moved_ = nullptr;        // what the copy stream held at a forward call's start
  std::vector<Timer> timers_;
  CacheAllocation allocation_;
  Stream copy_stream_;
};

CudaTieredCache::CudaTieredCache(const config::ModelSpec& spec, const CudaEngineOptions& engine,
                                 const TieredCacheOptions& options)
    : device_(engine.device),
      check_(engine.device),
      dtype_(cuda::device_dtype(engine.dtype)),
      layers_(static_cast<int>(spec.num_hidden_layers())),
      kv_heads_(static_cast<int>(spec.num_key_value_heads())),
      head_dim_(static_cast<int>(spec.head_dim())),
      regions_(staging_regions(options.staging_lookahead, layers_)),
      max_positions_(options.max_positions),
      slot_bytes_(2 * static_cast<std::uint64_t>(kv_heads_) *
                  static_cast<std::uint64_t>(head_dim_) * cuda::dtype_bytes(dtype_)),
      book_(layers_, resolved_t0_budget(options, layers_, slot_bytes_), slot_bytes_,
            quantise::compressed_bytes(kv_heads_, head_dim_), options.prefetch,
            options.max_positions),
      plan_stride_(3 * static_cast<std::size_t>(options.max_positions)),
      recode_pool_(options.recode_threads),
      copies_(options.copies),
      marks_(check_, false),
      timing_events_(check_, true),
      copy_stream_(check_, engine.device) {
  if (max_positions_ == 0) {
    throw std::logic_error("the CUDA tiered cache needs max_positions");
  }
  // A budget above the whole run's cache is allocated only as far as the run can use it.
  const std::uint64_t token_layers = max_positions_ * static_cast<std::uint64_t>(layers_);
  const std::uint64_t t0_slots = std::min(book_.t0_limit(), token_layers);
  // Page-table entries and slot pairs are 32-bit: T0 slots, and staging slots (at most one kept
  // copy per token-layer, and regions_ transient regions of at most max_positions slots).
  if (token_layers + static_cast<std::uint64_t>(regions_) * max_positions_ + t0_slots >
      static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    throw ConfigError("the CUDA tiered cache indexes slots with 32-bit entries; " +
                      std::to_string(max_positions_) + " positions of " + std::to_string(layers_) +
                      " layers are too many");
  }
  t0_ = DeviceMemory(t0_slots * slot_bytes_, check_);
  allocation_.t0_arena_bytes = t0_.bytes();
  plans_host_ = PinnedMemory(static_cast<std::size_t>(layers_) * plan_stride_ * 4, check_);
  plans_device_ = DeviceMemory(static_cast<std::size_t>(layers_) * plan_stride_ * 4, check_);
  moves_ = PinnedMemory(static_cast<std::size_t>(2 * token_layers) * 4, check_, kMappedHost);
  pin_host_tiers(options.reserve_t1, options.reserve_t2);
  stage_plans_.resize(static_cast<std::size_t>(layers_));
  layer_plans_.resize(static_cast<std::size_t>(layers_));
  for (int l = 0; l < layers_; ++l) {
    staged_.push_back(marks_.take());
    attended_.push_back(marks_.take());
  }
  moved_ = marks_.take();
}

CudaTieredCache::~CudaTieredCache() {
  static_cast<void>(cudaSetDevice(device_));
  static_cast<void>(cudaStreamSynchronize(copy_stream_.get()));
  for (const Timer& timer : timers_) {
    timing_events_.give_back(timer.start);
    timing_events_.give_back(timer.stop);
  }
  for (cudaEvent_t event : staged_) {
    marks_.give_back(event);
  }
  for (cudaEvent_t event : attended_) {
    marks_.give_back(event);
  }
  marks_.give_back(moved_);
}

void CudaTieredCache::launched(cudaError_t status, const char* kernel) const {
  check_(status, std::string(kernel) + " launch (tiered cache)");
}

template <typename Enqueue>
void CudaTieredCache::timed(CopyCounter& counter, Enqueue&& enqueue) {
  Timer timer{&counter, timing_events_.take(), timing_events_.take()};
  timers_.push_back(timer);
  check_(cudaEventRecord(timer.start, copy_stream_.get()), "cudaEventRecord (copy timer)");
  enqueue();
  check_(cudaEventRecord(timer.stop, copy_stream_.get()), "cudaEventRecord (copy timer)");
}

cuda::SlotBatch CudaTieredCache::make_batch(const void* source, void* target,
                                            const std::uint32_t* pairs, std::uint64_t count) const {
  cuda::SlotBatch batch;
  batch.source = source;
  batch.target = target;
  batch.pairs = pairs;
  batch.count = static_cast<int>(count);
  batch.kv_heads = kv_heads_;
  batch.head_dim = head_dim_;
  batch.dtype = dtype_;
  return batch;
}

void CudaTieredCache::ensure_host_tiers() {
  const std::uint64_t slots = max_positions_ * static_cast<std::uint64_t>(layers_);
  if (book_.t1_capacity() > slots || book_.t2_capacity() > slots) {
    throw std::logic_error("CUDA tiered cache: more host slots than token-layers");
  }
  pin_host_tiers(book_.t1_capacity() > 0, book_.t2_capacity() > 0);
}

void CudaTieredCache::pin_host_tiers(bool t1, bool t2) {
  // Sized once for every token-layer of the run: a host tier never moves while copies use it.
  const std::uint64_t slots = max_positions_ * static_cast<std::uint64_t>(layers_);
  if (t1 && t1_.get() == nullptr) {
    t1_ = PinnedMemory(slots * slot_bytes_, check_, kMappedHost);
  }
  if (t2 && t2_.get() == nullptr) {
    t2_ = PinnedMemory(slots * book_.compressed_token_bytes(), check_, kMappedHost);
  }
}

void CudaTieredCache::ensure_staging(std::uint64_t persistent, std::uint64_t region) {
  if (persistent <= persistent_slots_ && region <= region_slots_) {
    return;
  }
  // Geometric growth (a long run reallocates O(log n) times), capped by what a run can need: a
  // kept copy per token-layer, a layer's positions per region.
  const std::uint64_t token_layers = max_positions_ * static_cast<std::uint64_t>(layers_);
  const std::uint64_t new_persistent =
      persistent <= persistent_slots_
          ? persistent_slots_
          : std::min(std::max(persistent, 2 * persistent_slots_), token_layers);
  const std::uint64_t new_region =
      region <= region_slots_ ? region_slots_
                              : std::min(std::max(region, 2 * region_slots_), max_positions_);
  if (new_persistent < persistent || new_region < region) {
    throw std::logic_error("CUDA tiered cache: staging needs more slots than the run has");
  }
  DeviceMemory grown(
      (new_persistent + static_cast<std::uint64_t>(regions_) * new_region) * slot_bytes_, check_);
  // Called before the forward call's first kernel: nothing reads staging now. The staged copies
  // of differential prefetch move with it; the transient regions are refilled every call.
  if (persistent_slots_ > 0) {
    check_(cudaMemcpyAsync(grown.get(), staging_.get(), persistent_slots_ * slot_bytes_,
                           cudaMemcpyDeviceToDevice, copy_stream_.get()),
           "cudaMemcpyAsync (staging growth)");
  }
  check_(cudaStreamSynchronize(copy_stream_.get()), "cudaStreamSynchronize (staging growth)");
  staging_ = std::move(grown);
  allocation_.staging_bytes = std::max<std::uint64_t>(allocation_.staging_bytes, staging_.bytes());
  persistent_slots_ = new_persistent;
  region_slots_ = new_region;
}

void CudaTieredCache::write_plan(int layer, const StagePlan& plan) {
  const std::uint64_t region_base =
      persistent_slots_ + static_cast<std::uint64_t>(layer % regions_) * region_slots_;
  layer_plans_[static_cast<std::size_t>(layer)] =
      write_device_plan(plan, region_base, book_.prefetch(), host_plan(layer));
}

void CudaTieredCache::stage(int layer) {
  cudaStream_t copy = copy_stream_.get();
  if (layer >= regions_) {
    // Its transient region was the one of layer - regions_: wait until that attention ran.
    check_(cudaStreamWaitEvent(copy, attended_[static_cast<std::size_t>(layer - regions_)], 0),
           "cudaStreamWaitEvent (staging region)");
  }
  const DevicePlanSize& plan = layer_plans_[static_cast<std::size_t>(layer)];
  check_(cudaMemcpyAsync(device_plan(layer), host_plan(layer), plan.words() * 4,
                         cudaMemcpyHostToDevice, copy),
         "cudaMemcpyAsync (page table)");
  const std::uint32_t* pairs = device_plan(layer) + plan.positions;
  TieredCacheStats& stats = book_.stats();
  if (plan.t1_copies > 0) {
    timed(stats.h2d_prefetch, [&] {
      if (copies_ == CacheCopies::kCopyEngines) {
        copy_runs(host_plan(layer) + plan.positions, plan.t1_copies, t1_.get(),
                  static_cast<std::byte*>(staging_.get()), copy);
      } else {
        launched(cuda::launch_copy_slots(
                     make_batch(t1_.device(), staging_.get(), pairs, plan.t1_copies), copy),
                 "tier copy kernel (T1 staging)");
      }
    });
  }
  if (plan.t2_reads > 0) {
    timed(stats.h2d_compressed, [&] {
      launched(cuda::launch_dequantise_slots(make_batch(t2_.device(), staging_.get(),
                                                        pairs + 2 * plan.t1_copies, plan.t2_reads),
                                             copy),
               "tier dequantise kernel (T2 staging)");
    });
  }
  check_(cudaEventRecord(staged_[static_cast<std::size_t>(layer)], copy),
         "cudaEventRecord (staged)");
}

void CudaTieredCache::begin_forward(int first_position, int rows, void* stream) {
  select_device();
  auto* compute = static_cast<cudaStream_t>(stream);
  const auto positions =
      static_cast<std::uint64_t>(first_position) + static_cast<std::uint64_t>(rows);
  if (positions > max_positions_) {
    throw std::logic_error("CUDA tiered cache: sized for " + std::to_string(max_positions_) +
                           " positions, asked for " + std::to_string(positions));
  }
  for (int l = 0; l < layers_; ++l) {
    for (int row = 0; row < rows; ++row) {
      static_cast<void>(book_.append(
          l, static_cast<std::uint64_t>(first_position) + static_cast<std::uint64_t>(row)));
    }
  }
  std::uint64_t region = 0;
  for (int l = 0; l < layers_; ++l) {
    StagePlan& plan = stage_plans_[static_cast<std::size_t>(l)];
    book_.plan_stage(l, positions, plan);
    region = std::max<std::uint64_t>(region, plan.transient_entries);
  }
  ensure_staging(book_.staging_capacity(), region);
  for (int l = 0; l < layers_; ++l) {
    write_plan(l, stage_plans_[static_cast<std::size_t>(l)]);
  }
  // The engine's first kernel writes T0 slots the last moves may still be reading.
  check_(cudaEventRecord(moved_, copy_stream_.get()), "cudaEventRecord (moves)");
  check_(cudaStreamWaitEvent(compute, moved_, 0), "cudaStreamWaitEvent (moves)");
  for (int l = 0; l < regions_; ++l) {
    stage(l);
  }
}

DeviceLayerSlots CudaTieredCache::layer(int layer, void* stream) {
  check_(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                             staged_[static_cast<std::size_t>(layer)], 0),
         "cudaStreamWaitEvent (staged)");
  DeviceLayerSlots slots;
  slots.t0 = t0_.get();
  slots.staging = staging_.get();
  slots.page_table = reinterpret_cast<const std::int32_t*>(device_plan(layer));
  return slots;
}

void CudaTieredCache::end_layer(int layer, void* stream) {
  check_(cudaEventRecord(attended_[static_cast<std::size_t>(layer)],
                         static_cast<cudaStream_t>(stream)),
         "cudaEventRecord (attended)");
  if (layer + regions_ < layers_) {
    stage(layer + regions_);
  }
}

void CudaTieredCache::recode_on_host(const std::vector<TokenMove>& moves) {
  const std::size_t values =
      2 * static_cast<std::size_t>(kv_heads_) * static_cast<std::size_t>(head_dim_);
  const std::uint64_t compressed = book_.compressed_token_bytes();
  const auto start = Clock::now();
  // Each chunk converts through float32 scratch of its own.
  recode_on_pool(recode_pool_, moves.size(), values, values, [&](std::size_t i, float* scratch) {
    const TokenMove& move = moves[i];
    if (move.to == Tier::kCompressed) {
      cuda::host_to_float(dtype_, t1_.get() + move.from_slot * slot_bytes_, scratch,
                          static_cast<std::int64_t>(values));
      quantise::quantise_token(
          scratch, kv_heads_, head_dim_,
          reinterpret_cast<std::int8_t*>(t2_.get() + move.to_slot * compressed));
    } else {
      quantise::dequantise_token(
          reinterpret_cast<const std::int8_t*>(t2_.get() + move.from_slot * compressed), kv_heads_,
          head_dim_, scratch);
      cuda::host_from_float(dtype_, scratch, t1_.get() + move.to_slot * slot_bytes_,
                            static_cast<std::int64_t>(values));
    }
  });
  book_.stats().host_recode.seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

void CudaTieredCache::copy_runs(const std::uint32_t* pairs, std::uint64_t count,
                                const std::byte* source, std::byte* target, cudaStream_t stream) {
  run_targets_.clear();
  run_sources_.clear();
  run_bytes_.clear();
  for (std::uint64_t i = 0; i < count;) {
    const std::uint64_t from = pairs[2 * i];
    const std::uint64_t to = pairs[2 * i + 1];
    std::uint64_t length = 1;
    while (i + length < count && pairs[2 * (i + length)] == from + length &&
           pairs[2 * (i + length) + 1] == to + length) {
      ++length;
    }
    run_sources_.push_back(source + from * slot_bytes_);
    run_targets_.push_back(target + to * slot_bytes_);
    run_bytes_.push_back(length * slot_bytes_);
    i += length;
  }
  if (run_bytes_.empty()) {
    return;
  }
#if CUDART_VERSION >= 13000
  // One attribute for every copy: read the source in stream order (earlier kernels on this
  // stream write it), and keep off the SMs.
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  std::size_t first = 0;
  check_(cudaMemcpyBatchAsync(run_targets_.data(), run_sources_.data(), run_bytes_.data(),
                              run_bytes_.size(), &attributes, &first, 1, stream),
         "cudaMemcpyBatchAsync (tier copies)");
#else
  for (std::size_t r = 0; r < run_bytes_.size(); ++r) {
    check_(
        cudaMemcpyAsync(run_targets_[r], run_sources_[r], run_bytes_[r], cudaMemcpyDefault, stream),
        "cudaMemcpyAsync (tier copies)");
  }
#endif
}

void CudaTieredCache::apply_placement() {
  select_device();
  const MovePlan plan = book_.plan_moves();
  ensure_host_tiers();
  // Slots freed by a phase are not reused within it (tier_book.hpp), so each phase's moves run
  // grouped by kind, in any order.
  std::vector<std::uint32_t> to_t1;
  std::vector<std::uint32_t> to_t2;
  std::vector<TokenMove> recodes;
  for (const TokenMove& move : plan.demotions) {
    if (move.from == Tier::kHbm && move.to == Tier::kHost) {
      to_t1.insert(to_t1.end(), {move.from_slot, move.to_slot});
    } else if (move.from == Tier::kHbm && move.to == Tier::kCompressed) {
      to_t2.insert(to_t2.end(), {move.from_slot, move.to_slot});
    } else if (is_recode(move)) {
      recodes.push_back(move);
    }
  }
  std::vector<std::uint32_t> from_t1;
  std::vector<std::uint32_t> from_t2;
  for (const TokenMove& move : plan.promotions) {
    std::vector<std::uint32_t>& pairs = move.from == Tier::kHost ? from_t1 : from_t2;
    pairs.insert(pairs.end(), {move.from_slot, move.to_slot});
  }
  cudaStream_t copy = copy_stream_.get();
  // Earlier moves are done (a forward call in between waited for them, so this rarely waits):
  // the host recodes below read what their kernels wrote, and their pairs' buffer is reused.
  check_(cudaStreamSynchronize(copy), "cudaStreamSynchronize (moves)");
  if (!recodes.empty()) {
    recode_on_host(recodes);
  }
  // The pairs go to the mapped buffer the kernels read them from.
  auto* words = reinterpret_cast<std::uint32_t*>(moves_.get());
  const auto* device_words = reinterpret_cast<const std::uint32_t*>(moves_.device());
  std::size_t used = 0;
  const auto place = [&](const std::vector<std::uint32_t>& pairs) {
    std::copy(pairs.begin(), pairs.end(), words + used);
    const std::uint32_t* placed = device_words + used;
    used += pairs.size();
    return placed;
  };
  TieredCacheStats& stats = book_.stats();
  if (!to_t1.empty() || !to_t2.empty()) {
    const std::uint32_t* t1_pairs = place(to_t1);
    const std::uint32_t* t2_pairs = place(to_t2);
    timed(stats.d2h_offload, [&] {
      if (copies_ == CacheCopies::kCopyEngines) {
        copy_runs(to_t1.data(), to_t1.size() / 2, static_cast<const std::byte*>(t0_.get()),
                  t1_.get(), copy);
      } else {
        launched(cuda::launch_copy_slots(
                     make_batch(t0_.get(), t1_.device(), t1_pairs, to_t1.size() / 2), copy),
                 "tier copy kernel (T0 to T1)");
      }
      launched(cuda::launch_quantise_slots(
                   make_batch(t0_.get(), t2_.device(), t2_pairs, to_t2.size() / 2), copy),
               "tier quantise kernel (T0 to T2)");
    });
  }
  if (!from_t1.empty() || !from_t2.empty()) {
    const std::uint32_t* t1_pairs = place(from_t1);
    const std::uint32_t* t2_pairs = place(from_t2);
    timed(stats.h2d_promote, [&] {
      if (copies_ == CacheCopies::kCopyEngines) {
        copy_runs(from_t1.data(), from_t1.size() / 2, t1_.get(), static_cast<std::byte*>(t0_.get()),
                  copy);
      } else {
        launched(cuda::launch_copy_slots(
                     make_batch(t1_.device(), t0_.get(), t1_pairs, from_t1.size() / 2), copy),
                 "tier copy kernel (T1 to T0)");
      }
      launched(cuda::launch_dequantise_slots(
                   make_batch(t2_.device(), t0_.get(), t2_pairs, from_t2.size() / 2), copy),
               "tier dequantise kernel (T2 to T0)");
    });
  }
}

void CudaTieredCache::sample_device_memory() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  check_(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  allocation_.device_used_peak_bytes =
      std::max<std::uint64_t>(allocation_.device_used_peak_bytes, total_bytes - free_bytes);
}

const TieredCacheStats& CudaTieredCache::stats() {
  select_device();
  sample_device_memory();
  check_(cudaStreamSynchronize(copy_stream_.get()), "cudaStreamSynchronize (tiered cache)");
  for (const Timer& timer : timers_) {
    float milliseconds = 0.0F;
    check_(cudaEventElapsedTime(&milliseconds, timer.start, timer.stop), "cudaEventElapsedTime");
    timer.counter->seconds += static_cast<double>(milliseconds) / 1e3;
    timing_events_.give_back(timer.start);
    timing_events_.give_back(timer.stop);
  }
  timers_.clear();
  return book_.stats();
}

}  // namespace

std::unique_ptr<LiveKvCache> make_cuda_tiered_cache(Engine& engine,
                                                    const TieredCacheOptions& options) {
  const CudaEngineOptions engine_options = cuda_engine_options(engine);
  return std::make_unique<CudaTieredCache>(engine.spec(), engine_options, options);
}

}  // namespace kvtier::kernels
