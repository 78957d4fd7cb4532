#pragma once
// HGX H100 nodes for tests of groups and stages over several nodes: NVLink 4 within each node,
// one InfiniBand NDR adapter per GPU between them.

#include "configs/schema/hardware.pb.h"
#include "hwmodels/iteration_cost.hpp"
#include "tests/support/config_fixture.hpp"

namespace kvtier::test {

struct HgxH100Nodes {
  config::GpuSpec gpu = preset<config::GpuSpec>("gpu", "H100-SXM");
  config::LinkSpec nvlink = preset<config::LinkSpec>("link", "NVLink4");
  config::LinkSpec network = preset<config::LinkSpec>("link", "InfiniBand-NDR");
  hw::GroupLinks links{&nvlink, &network, 8};
};

}  // namespace kvtier::test
