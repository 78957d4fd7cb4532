#include "traces/impl/meta.hpp"

#include <google/protobuf/stubs/logging.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "configs/dtype.hpp"
#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "configs/utf8_fields.hpp"
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

void write_attributes(hid_t object, const std::vector<TraceAttribute>& attributes,
                      const std::string& where_text) {
  for (const TraceAttribute& attribute : attributes) {
    if (attribute.type == TraceAttribute::Type::kString) {
      h5::write_string_attribute(object, attribute.name.c_str(), attribute.text, where_text);
    } else {
      h5::write_uint_attribute(object, attribute.name.c_str(), attribute.number, where_text);
    }
  }
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

TraceAttribute TraceAttribute::string(std::string name, std::string text) {
  TraceAttribute attribute;
  attribute.name = std::move(name);
  attribute.type = Type::kString;
  attribute.text = std::move(text);
  return attribute;
}

TraceAttribute TraceAttribute::uint(std::string name, std::uint64_t value) {
  TraceAttribute attribute;
  attribute.name = std::move(name);
  // The type h5::write_uint_attribute stores the value as.
  attribute.type = value <= 0xFFFFFFFFU ? Type::kUInt32 : Type::kUInt64;
  attribute.number = value;
  return attribute;
}

std::string_view attribute_type_name(TraceAttribute::Type type) {
  switch (type) {
    case TraceAttribute::Type::kString: return "string";
    case TraceAttribute::Type::kUInt32: return "uint32";
    case TraceAttribute::Type::kUInt64: return "uint64";
  }
  return "?";
}

std::vector<TraceAttribute> root_attributes(std::string_view producer, std::string_view created) {
  return {TraceAttribute::string("format", std::string(kFormatName)),
          TraceAttribute::uint("version", kFormatVersion),
          TraceAttribute::string("producer", std::string(producer)),
          TraceAttribute::string("created", std::string(created))};
}

std::vector<TraceAttribute> meta_attributes(const config::TraceMeta& meta) {
  using A = TraceAttribute;
  std::vector<TraceAttribute> attributes = {
      A::string("encoding", "protobuf-binary"),
      A::string("message_type", std::string(kMetaMessageType)),
      A::string("model", meta.model().name()),
      A::uint("num_hidden_layers", meta.model().num_hidden_layers()),
      A::uint("num_attention_heads", meta.model().num_attention_heads()),
      A::uint("num_key_value_heads", meta.model().num_key_value_heads()),
      A::uint("vocab_size", meta.model().vocab_size()),
      A::uint("prompt_tokens", meta.prompt_tokens()),
      A::uint("steps", meta.steps()),
      A::uint("first_layer", meta.first_layer()),
      A::uint("num_layers", meta.num_layers()),
      A::string("granularities", granularity_list(meta)),
      A::string("attention_dtype", std::string(config::dtype_name(meta.attention_dtype())))};
  if (meta.has_top_k()) {
    attributes.push_back(A::uint("top_k", meta.top_k()));
  }
  if (meta.has_prefill_window()) {
    attributes.push_back(A::uint("prefill_window", meta.prefill_window()));
  }
  attributes.push_back(A::string("source", config::TraceSourceKind_Name(meta.source().kind())));
  attributes.push_back(A::string("source_tool", meta.source().tool()));
  return attributes;
}

void write_root_attributes(hid_t root, std::string_view producer, std::string_view created,
                           const std::string& where_text) {
  write_attributes(root, root_attributes(producer, created), where_text);
}

void write_meta(hid_t file, const config::TraceMeta& meta, const std::string& file_name) {
  const std::string where_text = h5::where(file_name, kMetaPath);
  config::TraceMeta recorded = meta;
  config::make_strings_valid_utf8(recorded);
  std::string bytes;
  if (!recorded.SerializeToString(&bytes)) {
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
  write_attributes(dataset.get(), meta_attributes(meta), where_text);
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
