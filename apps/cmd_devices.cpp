// `kvtier devices`: the CPU and CUDA devices this build can use.

#include "apps/cli.hpp"
#include "common/text_output.hpp"
#include "kernels/device_info.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

int run_devices(const Arguments& args, Context& context) {
  po::options_description options("devices options");
  add_format_option(options);
  po::variables_map values;
  if (!parse_arguments(args, options, {}, values, "usage: kvtier devices [--format text|json]",
                       context.out)) {
    return 0;
  }
  const Format format = format_from(values);
  std::vector<kernels::DeviceInfo> devices{kernels::host_cpu()};
  std::string status;
  for (auto& device : kernels::cuda_devices(status)) {
    devices.push_back(std::move(device));
  }
  if (format == Format::kJson) {
    context.out << "{\"cuda_status\": " << json_escape(status) << ", \"devices\": [";
    for (size_t i = 0; i < devices.size(); ++i) {
      const auto& device = devices[i];
      context.out << (i == 0 ? "" : ", ") << "{\"kind\": " << json_escape(device.kind)
                  << ", \"index\": " << device.index << ", \"name\": " << json_escape(device.name)
                  << ", \"memory_gib\": " << format_double(device.memory_gib)
                  << ", \"detail\": " << json_escape(device.detail) << "}";
    }
    context.out << "]}\n";
    return 0;
  }
  TextTable table({"kind", "index", "name", "memory", "detail"}, {false, true, false, true, false});
  for (const auto& device : devices) {
    table.add_row({device.kind, std::to_string(device.index), device.name,
                   format_fixed(device.memory_gib, 1) + " GiB", device.detail});
  }
  table.render(context.out);
  context.out << "CUDA: " << status << "\n";
  return 0;
}

}  // namespace kvtier::app
