#pragma once
// How a prompt's KV crosses from a prefill engine's GPUs to a decode engine's in a
// disaggregated cluster (cluster.disaggregation), when the two pools may split the model
// differently (prefill_parallelism).
//
// Every decode GPU that holds the request's KV receives its KV heads of its stage's layers
// from prefill GPUs that hold them: one copy from each prefill GPU whose heads and layers
// overlap its own. A head a decode engine keeps on several GPUs (more GPUs than KV heads, or
// latent attention split by heads, every GPU holding the whole latent) is sent to each of
// them, the prefill GPUs holding copies of it sharing those sends. With data-parallel
// attention one GPU of each stage holds a request's KV, all of its heads. Every GPU's copies
// go one after another over its own link, each paying the link's per-copy overhead; a
// transfer lasts as long as its busiest GPU's copies, sending or receiving. With the same
// split on both sides that is one copy a GPU, of its own share.
//
// Layer by layer (cluster.disaggregation.layer_wise_transfer), a transfer may start while the
// prefill iteration that completes the prompt still runs: what earlier iterations wrote goes at
// once, each GPU's copies as above, and what that iteration writes goes a layer at a time as it
// is computed, each layer's copies paying the overhead again (Splitwise, Mooncake's layer-wise
// prefill, vLLM's per-layer KV connector saves).

#include <cstdint>
#include <vector>

#include "configs/schema/hardware.pb.h"
#include "configs/schema/run.pb.h"
#include "sim/tick.hpp"

namespace kvtier::serving {

class KvHandoff {
 public:
  // `prefill` and `decode`: the runs the two pools' engines are built from (the same model).
  KvHandoff(const config::RunSpec& prefill, const config::RunSpec& decode,
            const config::LinkSpec& link);

  // One prompt's transfer, `received_bytes` being what the decode GPU that receives the most
  // of it takes (a GPU of its heaviest stage).
  [[nodiscard]] sim::Tick time(double received_bytes) const;

  // Sent layer by layer: the iteration that runs from `computing` to `computed` has computed
  // layer `layer` of the model by this (its layers taken to end evenly over it, in order,
  // rounded up).
  [[nodiscard]] sim::Tick layer_computed(std::uint32_t layer, sim::Tick computing,
                                         sim::Tick computed) const;
  // The copies bringing one layer of `last_bytes` (as `received_bytes` above): those of the
  // busiest GPU holding that layer, each paying the per-copy overhead.
  [[nodiscard]] sim::Tick layer_copy(double last_bytes, std::uint32_t layer) const;
  [[nodiscard]] std::uint32_t model_layers() const noexcept { return model_layers_; }

  // A transfer starting at `start` of `earlier_bytes`, written before that iteration, and
  // `last_bytes` that it writes, alone on its lanes: layer by layer, the earlier bytes go at
  // once (`time`), then each layer once computed and the copies before it done. Where that
  // would not end sooner than waiting for `computed` and sending the whole (`time`), it does
  // that instead.
  struct Timing {
    sim::Tick end;
    sim::Tick earlier;  // layer by layer, the earlier bytes' copies; else the whole's
    bool layer_wise = false;
  };
  [[nodiscard]] Timing layer_wise(double earlier_bytes, double last_bytes, sim::Tick start,
                                  sim::Tick computing, sim::Tick computed) const;

  // Transfers one engine makes at once, sending (a prefill engine) and receiving (a decode
  // engine): its tensor-parallel degree with data-parallel attention, each GPU its own
  // requests', else 1, every GPU taking part in each.
  [[nodiscard]] std::uint32_t sending_lanes() const noexcept { return sending_lanes_; }
  [[nodiscard]] std::uint32_t receiving_lanes() const noexcept { return receiving_lanes_; }

  // One GPU's part in a transfer: its bytes as a share of `received_bytes`, in `copies` copies;
  // its stage's `layers` layers, from `first_layer` on; sent layer by layer, `copies_per_layer`
  // copies bring each of them.
  struct GpuPart {
    double share = 1.0;
    std::uint64_t copies = 1;
    std::uint32_t first_layer = 0;
    std::uint32_t layers = 1;
    std::uint64_t copies_per_layer = 1;
  };
  // The parts of a GPU of each stage of each side, prefill stages first.
  [[nodiscard]] const std::vector<GpuPart>& parts() const noexcept { return parts_; }

 private:
  std::vector<GpuPart> parts_;
  std::uint32_t sending_lanes_ = 1;
  std::uint32_t receiving_lanes_ = 1;
  std::uint32_t model_layers_ = 1;
  double link_bytes_per_s_ = 0.0;
  sim::Tick per_copy_;
};

}  // namespace kvtier::serving
