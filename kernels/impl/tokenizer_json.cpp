// tokenizer.json → ByteLevelBpeDefinition. Only what byte-level BPE models (Llama 3, Qwen2/2.5/3,
// DeepSeek-R1-Distill) use is accepted; anything else is refused by name rather than guessed.
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "kernels/byte_level.hpp"
#include "kernels/impl/byte_level_bpe.hpp"
#include "kernels/impl/json_file.hpp"

namespace kvtier::kernels {
namespace {

using Json = nlohmann::json;

std::string type_of(const Json& object) {
  return object.is_object() && object.contains("type") && object["type"].is_string()
             ? object["type"].get<std::string>()
             : std::string();
}

// A value as JSON on one line, for messages (strings quoted, invalid UTF-8 replaced).
std::string one_line(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A token id as the file states it. nlohmann's get<std::int32_t> would convert a float such as
// 1e30 out of range (undefined) and wrap a large integer, so the value is checked first.
std::int32_t token_id(const Json& value, const std::string& what, const std::string& where) {
  // Below 2^31 - 1, so that the vocabulary size (the largest id + 1) is an int32 too.
  if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
      value.get<std::int64_t>() >= std::numeric_limits<std::int32_t>::max()) {
    throw DataError(what + " has id " + one_line(value) + "; ids are integers from 0 to 2^31 - 2",
                    where);
  }
  return static_cast<std::int32_t>(value.get<std::int64_t>());
}

// Returns whether a ByteLevel step was seen.
bool read_pre_tokenizer(const Json& node, ByteLevelBpeDefinition& out) {
  const std::string type = type_of(node);
  if (type == "Sequence") {
    bool byte_level = false;
    for (const Json& step : node.at("pretokenizers")) {
      byte_level = read_pre_tokenizer(step, out) || byte_level;
    }
    return byte_level;
  }
  if (type == "ByteLevel") {
    out.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      out.split_patterns.emplace_back(kGpt2SplitPattern);
    }
    return true;
  }
  if (type == "Split") {
    if (node.value("behavior", std::string()) != "Isolated" || node.value("invert", false)) {
      throw DataError("pre_tokenizer Split with behavior '" +
                          node.value("behavior", std::string()) +
                          "' is not supported (only Isolated)",
                      out.where);
    }
    const Json& pattern = node.at("pattern");
    if (pattern.contains("Regex")) {
      out.split_patterns.push_back(pattern["Regex"].get<std::string>());
    } else {
      out.split_patterns.push_back("\\Q" + pattern.at("String").get<std::string>() + "\\E");
    }
    return false;
  }
  throw DataError("pre_tokenizer type '" + type + "' is not supported", out.where);
}

// The BOS a TemplateProcessing post-processor puts before a single sequence, if any.
std::optional<std::int32_t> template_bos(const Json& node, const std::string& where) {
  const std::string type = type_of(node);
  if (type == "Sequence") {
    for (const Json& step : node.at("processors")) {
      if (auto bos = template_bos(step, where)) {
        return bos;
      }
    }
    return std::nullopt;
  }
  if (type != "TemplateProcessing" || !node.contains("single") || node["single"].empty()) {
    return std::nullopt;
  }
  const Json& first = node["single"][0];
  if (!first.contains("SpecialToken")) {
    return std::nullopt;
  }
  const auto name = first["SpecialToken"].at("id").get<std::string>();
  return token_id(node.at("special_tokens").at(name).at("ids").at(0),
                  "post_processor special token " + one_line(name), where);
}

std::optional<std::int32_t> id_of(const ByteLevelBpeDefinition& definition,
                                  const std::string& content) {
  for (const AddedToken& token : definition.added_tokens) {
    if (token.content == content) {
      return token.id;
    }
  }
  return std::nullopt;
}

void read_model(const Json& model, ByteLevelBpeDefinition& out) {
  if (type_of(model) != "BPE") {
    throw DataError(
        "tokenizer model type '" + type_of(model) + "' is not supported (only byte-level BPE)",
        out.where);
  }
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(field) && model[field].is_string() &&
        !model[field].get<std::string>().empty()) {
      throw DataError(std::string("tokenizer model field '") + field + "' is not supported",
                      out.where);
    }
  }
  out.ignore_merges = model.value("ignore_merges", false);
  for (const auto& [text, id] : model.at("vocab").items()) {
    out.vocabulary.emplace_back(text, token_id(id, "vocab token " + one_line(text), out.where));
  }
  for (const Json& merge : model.at("merges")) {
    if (merge.is_array() && merge.size() == 2) {  // newer files: ["a", "b"]
      out.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    const auto line = merge.get<std::string>();  // older files: "a b"
    const std::size_t space = line.find(' ', 1);
    if (space == std::string::npos) {
      throw DataError("merge '" + line + "' is not two tokens separated by a space", out.where);
    }
    out.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
}

}  // namespace

ByteLevelBpeDefinition read_tokenizer_json(const std::filesystem::path& path) {
  ByteLevelBpeDefinition definition;
  definition.where = path.string();
  const Json json = read_json_file(path);
  try {
    read_model(json.at("model"), definition);
    if (json.contains("added_tokens")) {
      for (const Json& token : json["added_tokens"]) {
        auto content = token.at("content").get<std::string>();
        // An empty added token would match everywhere and never advance the encoder.
        if (content.empty()) {
          throw DataError("added token " + one_line(token.at("id")) + " has empty content",
                          definition.where);
        }
        definition.added_tokens.push_back(
            {token_id(token.at("id"), "added token " + one_line(content), definition.where),
             std::move(content), token.value("special", false)});
      }
    }
    const std::string normalizer = json.contains("normalizer") ? type_of(json["normalizer"]) : "";
    // NFC leaves text that is already composed unchanged; inputs are taken to be NFC.
    if (!normalizer.empty() && normalizer != "NFC") {
      throw DataError("normalizer type '" + normalizer + "' is not supported", definition.where);
    }
    if (!json.contains("pre_tokenizer") || json["pre_tokenizer"].is_null() ||
        !read_pre_tokenizer(json["pre_tokenizer"], definition)) {
      throw DataError("pre_tokenizer has no ByteLevel step: not a byte-level BPE tokenizer",
                      definition.where);
    }
    if (json.contains("post_processor") && !json["post_processor"].is_null()) {
      definition.bos = template_bos(json["post_processor"], definition.where);
    }
  } catch (const Json::exception& error) {
    throw DataError(std::string("malformed tokenizer.json: ") + error.what(), definition.where);
  }
  const std::filesystem::path config = path.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    const Json settings = read_json_file(config);
    if (settings.contains("eos_token")) {
      const Json& eos = settings["eos_token"];
      if (eos.is_string()) {
        definition.eos = id_of(definition, eos.get<std::string>());
      } else if (eos.is_object() && eos.contains("content")) {
        // Checked here: this file is read outside the try block that turns JSON errors into
        // DataErrors, so get<std::string> on a number would escape as nlohmann's type_error.
        if (!eos["content"].is_string()) {
          throw DataError("tokenizer_config.json field 'eos_token.content' must be a string",
                          config.string());
        }
        definition.eos = id_of(definition, eos["content"].get<std::string>());
      }
    }
  }
  return definition;
}

}  // namespace kvtier::kernels
