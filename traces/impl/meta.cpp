#include "traces/impl/meta.hpp"

#include <google/protobuf/stubs/logging.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/errors.hpp"
#include "configs/dtype.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "configs/validate.hpp"
#include "traces/impl/h5.hpp"

namespace kvtier::traces {
namespace {

// /meta is a few kilobytes; anything far larger is not a trace written by kvtier.
constexpr hsize_t kMaxMetaBytes = 16U << 20;

std::string granularity_list(const config::TraceMeta& meta) {
  std::string list;
  for (const int granularity : meta.granularities()) {
    list += list.empty() ? "" : ",";
    list += granularity_name(static_cast<config::TraceGranularity>(granularity));
  }
  return list;
}

}  // namespace

TraceShape checked_shape(const config::TraceMeta& meta, const std::string& where_text) {
  // The schema's own rules, through the generic validator; presets play no part in a trace.
  const config::PresetRegistry no_presets({});
  const config::ConfigLoader loader(no_presets);
  std::vector<config::Problem> problems;
  try {
    problems = config::validate(meta, loader, config::LocationMap(where_text));
  } catch (const std::exception& error) {
    // The consistency rules assume values the schema allows (dtype_bytes throws
    // std::invalid_argument for a DType number outside the enum, which a damaged or foreign
    // /meta can hold): any such failure is bad data, not a crash (found by fuzzing).
    throw DataError(std::string("/meta holds values the schema does not allow: ") + error.what(),
                    where_text);
  }
  if (!problems.empty()) {
    const config::Problem& first = problems.front();
    throw DataError("/meta: " + first.what + " (field " + first.path + ")", where_text);
  }
  return shape_from_meta(meta, where_text);
}

void write_meta(hid_t file, const config::TraceMeta& meta, const std::string& file_name) {
  const std::string where_text = h5::where(file_name, kMetaPath);
  std::string bytes;
  if (!meta.SerializeToString(&bytes)) {
    h5::raise(h5::Blame::kOutput, "cannot serialize /meta", where_text);
  }
  const hsize_t size[1] = {bytes.size()};
  const h5::Handle space = h5::checked(H5Screate_simple(1, size, nullptr), H5Sclose,
                                       h5::Blame::kOutput, "cannot create /meta", where_text);
  const h5::Handle properties = h5::checked(H5Pcreate(H5P_DATASET_CREATE), H5Pclose,
                                            h5::Blame::kOutput, "cannot create /meta", where_text);
  h5::check(H5Pset_obj_track_times(properties.get(), 0), h5::Blame::kOutput, "cannot create /meta",
            where_text);
  const h5::Handle dataset =
      h5::checked(H5Dcreate2(file, std::string(kMetaPath).c_str(), H5T_STD_U8LE, space.get(),
                             H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                  H5Dclose, h5::Blame::kOutput, "cannot create /meta", where_text);
  h5::check(H5Dwrite(dataset.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()),
            h5::Blame::kOutput, "cannot write /meta", where_text);
  const hid_t id = dataset.get();
  h5::write_string_attribute(id, "encoding", "protobuf-binary", where_text);
  h5::write_string_attribute(id, "message_type", kMetaMessageType, where_text);
  h5::write_string_attribute(id, "model", meta.model().name(), where_text);
  h5::write_uint_attribute(id, "num_hidden_layers", meta.model().num_hidden_layers(), where_text);
  h5::write_uint_attribute(id, "num_attention_heads", meta.model().num_attention_heads(),
                           where_text);
  h5::write_uint_attribute(id, "num_key_value_heads", meta.model().num_key_value_heads(),
                           where_text);
  h5::write_uint_attribute(id, "vocab_size", meta.model().vocab_size(), where_text);
  h5::write_uint_attribute(id, "prompt_tokens", meta.prompt_tokens(), where_text);
  h5::write_uint_attribute(id, "steps", meta.steps(), where_text);
  h5::write_uint_attribute(id, "first_layer", meta.first_layer(), where_text);
  h5::write_uint_attribute(id, "num_layers", meta.num_layers(), where_text);
  h5::write_string_attribute(id, "granularities", granularity_list(meta), where_text);
  h5::write_string_attribute(id, "attention_dtype", config::dtype_name(meta.attention_dtype()),
                             where_text);
  if (meta.has_top_k()) {
    h5::write_uint_attribute(id, "top_k", meta.top_k(), where_text);
  }
  if (meta.has_prefill_window()) {
    h5::write_uint_attribute(id, "prefill_window", meta.prefill_window(), where_text);
  }
  h5::write_string_attribute(id, "source", config::TraceSourceKind_Name(meta.source().kind()),
                             where_text);
  h5::write_string_attribute(id, "source_tool", meta.source().tool(), where_text);
}

config::TraceMeta read_meta(hid_t file, const std::string& file_name) {
  const std::string where_text = h5::where(file_name, kMetaPath);
  if (!h5::exists(file, kMetaPath)) {
    h5::raise(h5::Blame::kInput, "missing dataset /meta", where_text);
  }
  const h5::Handle dataset =
      h5::checked(H5Dopen2(file, std::string(kMetaPath).c_str(), H5P_DEFAULT), H5Dclose,
                  h5::Blame::kInput, "cannot open /meta", where_text);
  const std::vector<hsize_t> dims = h5::dimensions(dataset.get(), where_text);
  if (dims.size() != 1 || dims[0] == 0 || dims[0] > kMaxMetaBytes) {
    h5::raise(h5::Blame::kInput, "/meta must be a non-empty 1-D byte array", where_text);
  }
  const h5::Handle type = h5::checked(H5Dget_type(dataset.get()), H5Tclose, h5::Blame::kInput,
                                      "cannot read the type of /meta", where_text);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1) {
    h5::raise(h5::Blame::kInput, "/meta must hold bytes (uint8)", where_text);
  }
  if (!h5::storage_consistent(dataset.get())) {
    h5::raise(h5::Blame::kInput, "/meta has a damaged storage layout", where_text);
  }
  std::string bytes(dims[0], '\0');
  h5::read_1d(dataset.get(), H5T_NATIVE_UCHAR, 0, dims[0], bytes.data(), where_text);
  config::TraceMeta meta;
  // A damaged record must give one kvtier error line, not protobuf's log lines as well.
  const google::protobuf::LogSilencer quiet;
  if (!meta.ParseFromString(bytes)) {
    h5::raise(h5::Blame::kInput, "/meta is not a serialized TraceMeta", where_text);
  }
  return meta;
}

void check_root_attributes(hid_t file, const std::string& file_name) {
  const h5::Handle root = h5::checked(H5Oopen(file, "/", H5P_DEFAULT), H5Oclose, h5::Blame::kInput,
                                      "cannot open the root group", file_name);
  const std::string where_text = file_name + ", root attributes";
  if (!h5::has_attribute(root.get(), "format")) {
    h5::raise(h5::Blame::kInput,
              "not a kvtier attention trace (the root has no 'format' attribute)", where_text);
  }
  const std::string format = h5::read_string_attribute(root.get(), "format", where_text);
  if (format != kFormatName) {
    h5::raise(h5::Blame::kInput,
              "not a kvtier attention trace (format '" + format + "', expected '" +
                  std::string(kFormatName) + "')",
              where_text);
  }
  const std::uint64_t version = h5::read_uint_attribute(root.get(), "version", where_text);
  if (version != kFormatVersion) {
    h5::raise(h5::Blame::kInput,
              "unsupported trace format version " + std::to_string(version) +
                  " (this kvtier reads version " + std::to_string(kFormatVersion) + ")",
              where_text);
  }
}

}  // namespace kvtier::traces
