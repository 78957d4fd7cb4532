#pragma once
// How a tier policy's copies time against the layers of one iteration (DESIGN.md §5).
//
// Copy rates: the node is assumed fully loaded with identical engines, and every GPU copies
// its shard at the same moment, so the rate one GPU sees is measured once by starting a copy
// on every GPU of the node together on its topology (hwmodels/topology.hpp): GPUs behind one
// PCIe switch share its uplink, pageable host memory pays the link's pageable factor. T1/T2
// live on each GPU's own socket. The two directions are probed separately (offloads are rare
// beside prefetches), so duplex interference between them is not counted. With data-parallel
// dispatch the GPUs copy different amounts; each still copies at that rate (a GPU that copies
// less does not leave its share of a switch's uplink to the others), so the busiest GPU's
// copies are timed as if every GPU copied as long as it does.
//
// Pipeline: layer l's attention reads its T0 tokens plus its T1 (and T2) tokens staged by an
// H2D copy. Copies run in layer order on the H2D copy engine; the copy of layer l may start
// once layer l − lookahead has started (the staging buffer holds lookahead + 1 layers), or,
// with lookahead 0 (synchronous copies), once layer l − 1 has finished; layer l starts when
// layer l − 1 has finished and its copy has arrived. Offloads (D2H) run on
// the other copy engine from the start of the iteration; the iteration cannot end before they
// have, since the next one reuses the HBM they free.
//
// Copies by kernels on the SMs (tiering.copy_method SM_KERNELS, the live cache's CUDA backend)
// take turns with compute instead: layer l's staging (a kernel per kind, LayerCopies) runs after
// layer l − 1 has finished and before layer l starts, whatever the lookahead, and the offloads
// and then the promotions of every layer run as batches after the iteration's last kernel
// (`trailing`), as the live cache moves them.

#include <cstdint>
#include <span>

#include "configs/schema/run.pb.h"
#include "sim/tick.hpp"

namespace kvtier::serving {

// For copies by SM kernels, the host link's SM-kernel figures where it has them
// (LinkSpec::sm_kernel_measured and overheads): the probed rate, at most the kernels' own; their
// T2 kernels' compressed bytes at the link's T2 figures (sm_kernel_t2_*), the same way. The copy
// engines copy compressed bytes as any others.
struct CopyRates {
  double h2d_bytes_per_s = 0.0;  // per GPU, with every GPU of the node copying at once
  double d2h_bytes_per_s = 0.0;
  sim::Tick h2d_setup;  // per copy
  sim::Tick d2h_setup;
  double t2_h2d_bytes_per_s = 0.0;  // compressed bytes
  double t2_d2h_bytes_per_s = 0.0;
  sim::Tick t2_h2d_setup;
  sim::Tick t2_d2h_setup;
  config::CopyMethod method = config::COPY_ENGINES;
};

[[nodiscard]] CopyRates measure_copy_rates(const config::RunSpec& run);

// Swapping a preempted request's KV out and in (workload.on_demand_admission.swap), as vLLM V0
// swaps blocks: a cudaMemcpyAsync per block of one layer's keys or values, from pinned memory on
// the copy engines, with every GPU of the node copying at once (the rates above), each call
// paying the link's per-copy overhead. The copies of one iteration run one after another on the
// compute stream before its forward pass: `swap_time` of `copies` calls moving `bytes` in all.
[[nodiscard]] CopyRates measure_swap_rates(const config::RunSpec& run);
[[nodiscard]] sim::Tick swap_time(double bytes, std::uint64_t copies, double bytes_per_s,
                                  sim::Tick per_copy);

// One layer's copies in one iteration, on one GPU, bytes by kind. The kinds matter to copies by
// SM kernels, which issue them as the live cache's CUDA backend does
// (kernels/impl/cuda_tiered_cache.cpp): a layer's staging is one kernel for its T1 tokens and
// one dequantising its T2 tokens, each with its own setup; the iteration's promotions and
// offloads are batches over all layers after its last kernel, one kernel per kind. The model of
// copy engines has a layer's bytes one copy, promotions riding with its staging.
struct LayerCopies {
  double staged_full = 0.0;           // T1 tokens staged for attention
  double staged_compressed = 0.0;     // T2 tokens' compressed bytes, dequantised into staging
  double promoted_full = 0.0;         // T1 -> HBM
  double promoted_compressed = 0.0;   // T2 -> HBM, dequantised
  double offloaded_full = 0.0;        // HBM -> T1
  double offloaded_compressed = 0.0;  // HBM -> T2, quantised
  // Dequantising T2 tokens in HBM after copy-engine copies, on top of the layer's own cost
  // (copies by SM kernels dequantise as they copy).
  sim::Tick extra_compute;

  [[nodiscard]] double h2d_bytes() const {
    return staged_full + staged_compressed + promoted_full + promoted_compressed;
  }
  [[nodiscard]] double d2h_bytes() const { return offloaded_full + offloaded_compressed; }
};

struct PipelineTiming {
  sim::Tick layers_end;  // when the last layer finishes (the head follows)
  sim::Tick end;         // including outstanding offloads (copy engines)
  sim::Tick trailing;    // after everything else of the iteration: SM kernels' offloads, then
                         // their promotions
  sim::Tick stall;       // time layers waited for their prefetch
  sim::Tick h2d_busy;
  sim::Tick d2h_busy;
};

[[nodiscard]] PipelineTiming time_pipeline(sim::Tick layer_compute,
                                           std::span<const LayerCopies> layers,
                                           std::uint32_t lookahead, const CopyRates& rates);
// With data-parallel dispatch each GPU copies its own requests' KV over its own link, on its
// own copy engines: `gpus` holds each GPU's copies of the same layers (std::invalid_argument
// otherwise, or with none). A GPU starts layer l once every GPU has finished layer l − 1 (they
// meet at each layer's MLP) and its own copy of layer l has arrived; the layer ends when the
// slowest GPU ends it. `layer_compute` is the slowest GPU's layer; `lighter_by` (empty: none,
// else one a GPU, each within [0, layer_compute]) by how much each GPU's own part of it (its
// input norm and the attention of its own requests and chunks) is shorter
// (hw::IterationCost::layer_lighter_by_gpu), so that a GPU whose copy arrives late but whose own
// requests attend little delays the layer by less. `stall` is the time the layers waited beyond
// their compute; the busy times are the GPUs' sums. One GPU's copies time as time_pipeline above.
[[nodiscard]] PipelineTiming time_pipeline(sim::Tick layer_compute,
                                           std::span<const std::span<const LayerCopies>> gpus,
                                           std::uint32_t lookahead, const CopyRates& rates,
                                           std::span<const sim::Tick> lighter_by = {});

// How long one iteration's host recodes of `token_layers` take on the host's threads, from the
// first starting to the last finishing, in nanoseconds, when one thread alone would take
// `one_thread_ns`; `values_per_token_layer` measures the work against the pool's one-thread
// threshold (tiering.host_recode).
[[nodiscard]] double recode_makespan_ns(double token_layers, double one_thread_ns,
                                        double values_per_token_layer,
                                        const config::HostRecodeSpec& pool);

}  // namespace kvtier::serving
