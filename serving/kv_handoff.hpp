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

  // Transfers one engine makes at once, sending (a prefill engine) and receiving (a decode
  // engine): its tensor-parallel degree with data-parallel attention, each GPU its own
  // requests', else 1, every GPU taking part in each.
  [[nodiscard]] std::uint32_t sending_lanes() const noexcept { return sending_lanes_; }
  [[nodiscard]] std::uint32_t receiving_lanes() const noexcept { return receiving_lanes_; }

  // One GPU's part in a transfer: its bytes as a share of `received_bytes`, in `copies` copies.
  struct GpuPart {
    double share = 1.0;
    std::uint64_t copies = 1;
  };
  // The parts of a GPU of each stage of each side, prefill stages first.
  [[nodiscard]] const std::vector<GpuPart>& parts() const noexcept { return parts_; }

 private:
  std::vector<GpuPart> parts_;
  std::uint32_t sending_lanes_ = 1;
  std::uint32_t receiving_lanes_ = 1;
  double link_bytes_per_s_ = 0.0;
  sim::Tick per_copy_;
};

}  // namespace kvtier::serving
