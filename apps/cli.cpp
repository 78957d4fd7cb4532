#include "apps/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/errors.hpp"
#include "common/input_file.hpp"
#include "common/temporary_file.hpp"
#include "kernels/device_info.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/random_model.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
// Generated at build time (cmake/write_commit.cmake): KVTIER_GIT_COMMIT.
#include "kvtier_commit.hpp"

namespace kvtier::app {

namespace po = boost::program_options;

// More threads than any CPU has cores would only contend; the bound catches typos like 1000000.
constexpr int kMaxEngineThreads = 1024;

void apply_policy_options(const po::variables_map& values, config::RunSpec& run) {
  if (values.count("policy") != 0U) {
    *run.mutable_policy() = replay::parse_policy_string(values["policy"].as<std::string>());
  }
  if (values.count("compare") != 0U) {
    run.clear_compare();
    for (auto& spec : parse_policy_list(values["compare"].as<std::string>())) {
      *run.add_compare() = std::move(spec);
    }
  }
}

std::vector<config::PolicySpec> parse_policy_list(const std::string& text) {
  std::vector<std::string> policies;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    const std::string piece = text.substr(begin, comma - begin);
    const bool parameter =
        piece.find('=') != std::string::npos && piece.find(':') == std::string::npos;
    if (parameter && !policies.empty()) {
      policies.back() += "," + piece;
    } else {
      policies.push_back(piece);
    }
    begin = comma + 1;
  }
  std::vector<config::PolicySpec> specs;
  for (const std::string& policy : policies) {
    if (policy.empty()) {
      throw ConfigError("--compare has an empty policy in '" + text + "'");
    }
    specs.push_back(replay::parse_policy_string(policy));
  }
  return specs;
}

namespace {

template <typename T>
bool is_typed(const po::value_semantic* semantic) {
  return dynamic_cast<const po::typed_value<T>*>(semantic) != nullptr ||
         dynamic_cast<const po::typed_value<std::vector<T>>*>(semantic) != nullptr;
}

// Boost reads "-1" for an unsigned option as 2^32 - 1 or 2^64 - 1 (lexical_cast wraps negative
// numbers round), so a negative value of any unsigned option is refused here, for every command.
void refuse_negative_unsigned(const po::parsed_options& parsed,
                              const po::options_description& options) {
  for (const po::option& option : parsed.options) {
    const po::option_description* description = options.find_nothrow(option.string_key, false);
    if (description == nullptr) {
      continue;
    }
    const po::value_semantic* semantic = description->semantic().get();
    if (!is_typed<unsigned>(semantic) && !is_typed<unsigned long>(semantic) &&
        !is_typed<unsigned long long>(semantic)) {
      continue;
    }
    for (const std::string& value : option.value) {
      const std::size_t first = value.find_first_not_of(" \t");
      if (first != std::string::npos && value[first] == '-') {
        throw ConfigError("--" + option.string_key + " " + value + ": must not be negative");
      }
    }
  }
}

}  // namespace

bool parse_arguments(const Arguments& args, const po::options_description& options,
                     const po::positional_options_description& positional,
                     po::variables_map& values, const std::string& usage, std::ostream& out) {
  po::options_description with_help(options);
  with_help.add_options()("help,h", "show this help");
  // Without allow_guessing: an abbreviated option (--form for --format) is an error, not a
  // silent match that a later option of the same prefix would change.
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  const po::parsed_options parsed =
      po::command_line_parser(args).options(with_help).positional(positional).style(style).run();
  refuse_negative_unsigned(parsed, with_help);
  po::store(parsed, values);
  if (values.count("help") != 0U) {
    out << usage << "\n\n" << options;
    return false;
  }
  po::notify(values);
  return true;
}

void add_format_option(po::options_description& options, bool offers_html) {
  options.add_options()("format", po::value<std::string>()->default_value("text"),
                        offers_html ? "output: text (aligned tables), json or html (a page of "
                                      "charts and tables)"
                                    : "output: text (aligned tables) or json");
}

void add_set_option(po::options_description& options) {
  options.add_options()("set", po::value<std::vector<std::string>>()->composing(),
                        "override a field: PATH=VALUE, units allowed (e.g. "
                        "model.kv_dtype=FP8_E4M3, hardware.node.gpu.memory_capacity=40GiB); "
                        "'PATH=~' (quoted) removes the field; repeatable");
}

Format format_from(const po::variables_map& values, bool offers_html) {
  const std::string format = values["format"].as<std::string>();
  if (format == "text") {
    return Format::kText;
  }
  if (format == "json") {
    return Format::kJson;
  }
  if (format == "html" && offers_html) {
    return Format::kHtml;
  }
  throw ConfigError("unknown --format '" + format + "': expected text" +
                    (offers_html ? ", json or html" : " or json"));
}

std::vector<config::Override> overrides_from(const po::variables_map& values) {
  std::vector<config::Override> overrides;
  if (values.count("set") != 0U) {
    for (const auto& argument : values["set"].as<std::vector<std::string>>()) {
      overrides.push_back(config::parse_override(argument));
    }
  }
  return overrides;
}

std::string version_line() {
  return std::string("kvtier ") + KVTIER_VERSION + " (commit " + KVTIER_GIT_COMMIT + ", CUDA " +
         (kernels::built_with_cuda() ? "on" : "off") + ")";
}

std::string read_prompt_file(const std::string& path) {
  InputText input = read_input_file(path, kTextInputLimitBytes);
  switch (input.status) {
    case InputText::Status::kRead: break;
    case InputText::Status::kFolder:
      // A prompt file is data, as its other failures (exit 3).
      throw DataError("--prompt-file names a folder, not a file", path);
    case InputText::Status::kTooLarge:
      throw DataError("the prompt file is larger than " + input_limit_text(kTextInputLimitBytes),
                      path);
    case InputText::Status::kCannotOpen:
    case InputText::Status::kReadError: throw DataError("cannot read the prompt file", path);
  }
  std::string text = std::move(input.text);
  // One final line break is the file's, not the prompt's (as with the shell's $(cat FILE)).
  if (!text.empty() && text.back() == '\n') {
    text.pop_back();
    if (!text.empty() && text.back() == '\r') {
      text.pop_back();
    }
  }
  return text;
}

// The tokenizer of a Hugging Face directory is in it; beside a llama2.c checkpoint it is
// tokenizer.bin (llama2.c's default name) or else the only tok*.bin there (tok512.bin and the
// like, llama2.c's custom vocabularies).
bool is_random_model(const std::string& text) {
  return text.rfind("random:", 0) == 0;
}

kernels::ModelWeights load_model_argument(const std::string& text, const Context& context) {
  if (!is_random_model(text)) {
    return kernels::load_model(text);
  }
  std::string name = text.substr(std::string_view("random:").size());
  kernels::RandomModelOptions options;
  if (const std::size_t at = name.find('@'); at != std::string::npos) {
    const std::string seed = name.substr(at + 1);
    name.resize(at);
    if (seed.empty() || seed.find_first_not_of("0123456789") != std::string::npos ||
        seed.size() > 19) {
      throw ConfigError("--model " + text + ": the seed after '@' must be a non-negative integer");
    }
    options.seed = std::stoull(seed);
  }
  const config::PresetFile* preset = context.presets.find("model", name);
  if (preset == nullptr) {
    throw ConfigError("--model " + text + ": " + context.presets.unknown_message("model", name));
  }
  config::ModelSpec spec;
  (void)context.loader.load_preset(*preset, spec, {});
  return kernels::random_model(spec, options);
}

kernels::DeviceInfo check_engine_device(const std::string& device) {
  if (device == "cpu") {
    return kernels::host_cpu();
  }
  if (device != "cuda") {
    throw ConfigError("unknown --device '" + device + "': expected cpu or cuda");
  }
  if (!kernels::built_with_cuda()) {
    throw ConfigError(
        "the CUDA engine is not available in this build (only the CPU engine is); use "
        "--device cpu");
  }
  std::string status;
  std::vector<kernels::DeviceInfo> devices = kernels::cuda_devices(status);
  if (devices.empty()) {
    throw ConfigError("the CUDA engine is not available: " + status + "; use --device cpu");
  }
  return std::move(devices.front());
}

std::string command_line(std::string command, const Arguments& args,
                         std::initializer_list<std::string_view> dropped) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    const auto is_dropped = [&](std::string_view option) {
      return arg == option || (arg.size() > option.size() &&
                               arg.substr(0, option.size()) == option && arg[option.size()] == '=');
    };
    if (std::any_of(dropped.begin(), dropped.end(), is_dropped)) {
      i += arg.find('=') == std::string_view::npos ? 1 : 0;  // and its value
      continue;
    }
    if (!arg.empty() &&
        arg.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;#~!") == std::string_view::npos) {
      command += " " + args[i];
      continue;
    }
    // Single quotes keep everything but a single quote, which is closed, escaped and reopened.
    command += " '";
    for (const char c : arg) {
      command += c == '\'' ? std::string("'\\''") : std::string(1, c);
    }
    command += "'";
  }
  return command;
}

namespace {

// `folder` (to be created as needed) can take new files: its nearest existing ancestor is a
// folder this process may write in. ConfigError naming `option` and `path` otherwise.
void check_writable_below(const std::string& option, const std::filesystem::path& path,
                          std::filesystem::path folder) {
  std::error_code error;
  while (!folder.empty() && !std::filesystem::exists(folder, error)) {
    folder = folder.parent_path();
  }
  if (folder.empty()) {
    folder = ".";
  }
  if (!std::filesystem::is_directory(folder, error)) {
    throw ConfigError(option + " cannot be written: " + folder.string() + " is not a folder",
                      path.string());
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw ConfigError(option + " cannot be written: folder " + folder.string() + ": " +
                          std::system_category().message(errno),
                      path.string());
  }
}

}  // namespace

void check_output_file(const std::string& option, const std::filesystem::path& path,
                       const std::vector<std::filesystem::path>& inputs) {
  if (path.empty()) {
    throw ConfigError(option + " needs a file name");
  }
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (std::filesystem::is_directory(status)) {
    throw ConfigError(option + " is a folder: name a file", path.string());
  }
  // The finished output is renamed over the name: a device or a pipe would be replaced, not
  // written to.
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw ConfigError(option + " is not a regular file (a device, pipe or socket): name a file",
                      path.string());
  }
  // The temporary is made beside the output (folders created as needed).
  check_writable_below(option, path, output_target(path).parent_path());
  for (const std::filesystem::path& input : inputs) {
    if (!input.empty() && std::filesystem::equivalent(path, input, error)) {
      throw ConfigError(
          option + " would overwrite " +
              (input == path ? std::string("an input file") : "the input " + input.string()),
          path.string());
    }
  }
}

std::vector<std::filesystem::path> given_paths(const boost::program_options::variables_map& values,
                                               std::initializer_list<const char*> options) {
  std::vector<std::filesystem::path> paths;
  for (const char* option : options) {
    if (values.count(option) == 0U) {
      continue;
    }
    const boost::any& value = values[option].value();
    if (value.type() == typeid(std::vector<std::string>)) {
      for (const std::string& path : boost::any_cast<const std::vector<std::string>&>(value)) {
        paths.emplace_back(path);
      }
    } else {
      paths.emplace_back(boost::any_cast<const std::string&>(value));
    }
  }
  return paths;
}

void check_run_policies(const config::RunSpec& run, const config::LocationMap& locations,
                        const boost::program_options::variables_map* options) {
  const replay::PolicyRegistry registry = replay::builtin_policies();
  // Where a policy's field came from: the option that gave it, or the file's line of `part`.
  const auto origin = [&](const char* option, const std::string& field, const std::string& part) {
    if (options != nullptr && options->count(option) != 0U) {
      return std::string("--") + option;
    }
    std::string where = describe(locations.nearest(part));
    where += ", field ";
    where += field;
    return where;
  };
  const auto check = [&](const config::PolicySpec& policy, const std::string& field,
                         const char* option) {
    try {
      registry.check(policy);
    } catch (const replay::ParameterValueError& error) {
      // The value's position: its line in the file or the --set that wrote it, and which
      // policy and parameter it is (error.where()).
      std::string value_field = field;
      for (int i = 0; i < policy.param_size(); ++i) {
        const config::PolicyParam& param = policy.param(i);
        if (param.name() == error.parameter()) {
          const auto* set = param.GetDescriptor()->FindFieldByNumber(param.value_case());
          value_field = field + ".param[" + std::to_string(i) + "]" +
                        (set != nullptr ? "." + set->name() : std::string());
        }
      }
      throw ConfigError(error.what(),
                        origin(option, value_field, value_field) + ", " + error.where());
    } catch (const ConfigError& error) {
      // The name's position: the policy's line in the file, or the --set that named it.
      throw ConfigError(error.what(), origin(option, field, field + ".name"));
    }
  };
  if (run.has_policy()) {
    check(run.policy(), "policy", "policy");
  }
  for (int i = 0; i < run.compare_size(); ++i) {
    check(run.compare(i), "compare[" + std::to_string(i) + "]", "compare");
  }
  // A policy given twice would be run twice and give two columns (and result rows) of one name.
  std::vector<std::pair<std::string, std::string>> seen;  // policy string, field
  if (run.has_policy()) {
    seen.emplace_back(replay::policy_string(run.policy()), "policy");
  }
  for (int i = 0; i < run.compare_size(); ++i) {
    const std::string field = "compare[" + std::to_string(i) + "]";
    std::string name = replay::policy_string(run.compare(i));
    const auto same = std::find_if(seen.begin(), seen.end(),
                                   [&](const auto& entry) { return entry.first == name; });
    if (same != seen.end()) {
      throw ConfigError(replay::policy_given_twice(name, same->second, field),
                        origin("compare", field, field + ".name"));
    }
    seen.emplace_back(std::move(name), field);
  }
}

std::vector<std::filesystem::path> model_input_paths(
    const boost::program_options::variables_map& values,
    std::initializer_list<const char*> other_inputs) {
  std::vector<std::filesystem::path> paths = given_paths(values, other_inputs);
  const auto add = [&](const std::filesystem::path& path) {
    paths.push_back(path);
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      for (const auto& entry : std::filesystem::directory_iterator(path, error)) {
        paths.push_back(entry.path());
      }
    }
  };
  const std::filesystem::path model = values["model"].as<std::string>();
  add(model);
  if (values.count("tokenizer") != 0U) {
    add(values["tokenizer"].as<std::string>());
  } else if (!is_random_model(model.string())) {
    try {
      add(find_tokenizer(model));
    } catch (const ConfigError&) {
      // No tokenizer found: loading it says so, after the output checks.
    }
  }
  return paths;
}

void check_output_folder(const std::string& option, const std::filesystem::path& path,
                         std::initializer_list<const char*> files) {
  if (path.empty()) {
    throw ConfigError(option + " needs a folder name");
  }
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_directory(path, error)) {
    throw ConfigError(option + " is a file: name a folder", path.string());
  }
  check_writable_below(option, path, path);
  for (const char* name : files) {
    const std::filesystem::file_status status = std::filesystem::status(path / name, error);
    if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
      throw ConfigError(option + " holds " + name +
                            " as something other than a file (a folder?), which the output "
                            "cannot replace",
                        (path / name).string());
    }
  }
}

boost::program_options::options_description sampling_options() {
  namespace po = boost::program_options;
  po::options_description options("sampling options");
  options.add_options()("temperature", po::value<float>()->default_value(0.0F),
                        "sampling temperature (0: greedy)")(
      "top-p", po::value<float>()->default_value(1.0F), "nucleus sampling mass, (0, 1]")(
      "seed", po::value<std::uint64_t>()->default_value(1), "sampling seed");
  return options;
}

kernels::SamplingOptions sampling_option(const boost::program_options::variables_map& values) {
  const kernels::SamplingOptions options = kernels::SamplingOptions::nucleus(
      values["temperature"].as<float>(), values["top-p"].as<float>(),
      values["seed"].as<std::uint64_t>());
  const kernels::Sampler check(options);  // ConfigError for bad values
  return options;
}

boost::program_options::options_description cpu_engine_options() {
  boost::program_options::options_description options("CPU engine options");
  options.add_options()("threads", boost::program_options::value<int>(),
                        "--device cpu: threads running the engine's products and attention "
                        "heads (default 1); results are the same for every count");
  return options;
}

kernels::CpuEngineOptions cpu_engine_option(const boost::program_options::variables_map& values,
                                            const std::string& device) {
  kernels::CpuEngineOptions options;
  if (values.count("threads") == 0U) {
    return options;
  }
  if (device != "cpu") {
    throw ConfigError("--threads applies to --device cpu (the CUDA engine runs on the GPU)");
  }
  options.threads = thread_count_option(values, "threads");
  return options;
}

int thread_count_option(const boost::program_options::variables_map& values,
                        const std::string& name) {
  const int threads = values[name].as<int>();
  if (threads < 1 || threads > kMaxEngineThreads) {
    throw ConfigError("--" + name + " " + std::to_string(threads) + ": from 1 to " +
                      std::to_string(kMaxEngineThreads));
  }
  return threads;
}

boost::program_options::options_description cuda_engine_options() {
  boost::program_options::options_description options("CUDA engine options");
  options.add_options()("cuda-attention", boost::program_options::value<std::string>(),
                        "--device cuda: the attention kernel, split-keys (default: split over "
                        "chunks of keys at decode) or per-head (docs/ENGINE.md)")(
      "cuda-gemm", boost::program_options::value<std::string>(),
      "--device cuda: the GEMM of calls of at most 2 rows (decode), warp-rows (default: one "
      "warp per weight row, 16-byte loads) or cublas (docs/ENGINE.md)")(
      "cuda-fusion", boost::program_options::value<std::string>(),
      "--device cuda: off (default) or on: SwiGLU applied by the warp-rows gate/up GEMM and "
      "split-key attention combined by its last chunk blocks, the same results with two kernels "
      "fewer a layer (docs/ENGINE.md)");
  return options;
}

namespace {

// A CUDA engine setting chosen by name: `choices` (the first is the default when the option is
// not given) spelled as `name_of` spells them; only with --device cuda.
template <typename Choice>
Choice cuda_choice(const boost::program_options::variables_map& values, const std::string& device,
                   const std::string& option, std::initializer_list<Choice> choices,
                   std::string_view (*name_of)(Choice), const std::string& why_cuda_only) {
  if (values.count(option) == 0U) {
    return *choices.begin();
  }
  if (device != "cuda") {
    throw ConfigError("--" + option + " applies to --device cuda" + why_cuda_only);
  }
  const std::string name = values[option].as<std::string>();
  std::string expected;
  for (const Choice candidate : choices) {
    if (name == name_of(candidate)) {
      return candidate;
    }
    expected += std::string(expected.empty() ? "" : ", ") + std::string(name_of(candidate));
  }
  throw ConfigError("--" + option + " must be one of " + expected + ", not '" + name + "'");
}

}  // namespace

kernels::CudaAttention cuda_attention_option(const boost::program_options::variables_map& values,
                                             const std::string& device) {
  return cuda_choice(
      values, device, "cuda-attention",
      {kernels::CudaAttention::kSplitKeys, kernels::CudaAttention::kPerHead},
      +[](kernels::CudaAttention choice) { return kernels::cuda_attention_name(choice); }, "");
}

kernels::CudaGemm cuda_gemm_option(const boost::program_options::variables_map& values,
                                   const std::string& device) {
  return cuda_choice(
      values, device, "cuda-gemm", {kernels::CudaGemm::kWarpRows, kernels::CudaGemm::kCublas},
      +[](kernels::CudaGemm choice) { return kernels::cuda_gemm_name(choice); }, "");
}

kernels::CudaFusion cuda_fusion_option(const boost::program_options::variables_map& values,
                                       const std::string& device) {
  return cuda_choice(
      values, device, "cuda-fusion", {kernels::CudaFusion::kOff, kernels::CudaFusion::kOn},
      +[](kernels::CudaFusion choice) { return kernels::cuda_fusion_name(choice); }, "");
}

kernels::CacheCopies cuda_copies_option(const boost::program_options::variables_map& values,
                                        const std::string& device) {
  return cuda_choice(
      values, device, "cuda-copies",
      {kernels::CacheCopies::kKernels, kernels::CacheCopies::kCopyEngines},
      +[](kernels::CacheCopies choice) { return kernels::cache_copies_name(choice); },
      " (the CPU cache copies in host memory)");
}

kernels::CudaComputeDtype cuda_compute_dtype_option(
    const boost::program_options::variables_map& values, const std::string& device) {
  return cuda_choice(values, device, "compute-dtype",
                     {kernels::CudaComputeDtype::kBF16, kernels::CudaComputeDtype::kFP16,
                      kernels::CudaComputeDtype::kFP32},
                     &kernels::cuda_compute_dtype_name, " (the CPU engine is float32)");
}

std::unique_ptr<kernels::Tokenizer> load_model_tokenizer(const std::filesystem::path& path,
                                                         const config::ModelSpec& spec) {
  std::unique_ptr<kernels::Tokenizer> tokenizer = kernels::load_tokenizer(path);
  const auto tokens = static_cast<std::uint32_t>(tokenizer->vocab_size());
  if (tokens > spec.vocab_size()) {
    throw DataError("the tokenizer's " + std::to_string(tokens) +
                        " tokens do not fit the model's vocabulary of " +
                        std::to_string(spec.vocab_size()),
                    path.string());
  }
  if (tokenizer->kind() == "llama2.c" && tokens != spec.vocab_size()) {
    throw DataError("the tokenizer holds " + std::to_string(tokens) +
                        " tokens where the model has " + std::to_string(spec.vocab_size()) +
                        " (a llama2.c tokenizer has one entry per token id: truncated?)",
                    path.string());
  }
  return tokenizer;
}

std::vector<std::int32_t> encode_prompt_argument(
    const kernels::Tokenizer& tokenizer, const std::string& text,
    const boost::program_options::variables_map& values) {
  std::vector<std::int32_t> prompt;
  try {
    prompt = tokenizer.encode_prompt(text);
  } catch (const DataError& error) {
    if (!error.where().empty()) {
      throw;
    }
    throw DataError(error.what(), values.count("prompt-file") != 0U
                                      ? values["prompt-file"].as<std::string>()
                                      : std::string("--prompt"));
  }
  if (prompt.empty()) {
    throw ConfigError("the prompt is empty and the tokenizer has no BOS to start from");
  }
  return prompt;
}

std::filesystem::path find_tokenizer(const std::filesystem::path& model) {
  if (is_random_model(model.string())) {
    throw ConfigError("a random model has no tokenizer: name one with --tokenizer", model.string());
  }
  std::error_code error;
  if (std::filesystem::is_directory(model, error)) {
    return model;
  }
  const std::filesystem::path folder = model.parent_path().empty() ? "." : model.parent_path();
  if (std::filesystem::exists(folder / "tokenizer.bin", error)) {
    return folder / "tokenizer.bin";
  }
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("tok", 0) == 0 && entry.path().extension() == ".bin") {
      found.push_back(entry.path());
    }
  }
  if (found.size() != 1) {
    throw ConfigError("no tokenizer.bin and " +
                          std::string(found.empty() ? "no" : "more than one") +
                          " tok*.bin beside the checkpoint: name the tokenizer with --tokenizer",
                      model.string());
  }
  return found.front();
}

int report_failure(const std::exception_ptr& failure) {
  // Each line in one write: another process's output (an MPI launcher's) cannot split it.
  const auto print = [](const std::string& line) { std::cerr << line + "\n"; };
  try {
    std::rethrow_exception(failure);
  } catch (const Error& error) {
    for (const std::string& line : error.lines()) {
      print(line);
    }
    return static_cast<int>(error.exit_code());
  } catch (const po::error& error) {
    print(format_error_line(error.what(), "see --help"));
    return static_cast<int>(ExitCode::kUsageOrConfig);
  } catch (const std::exception& error) {
    print(format_error_line(error.what(), ""));
    return static_cast<int>(ExitCode::kRuntimeFailure);
  } catch (...) {
    print(format_error_line("unknown error", ""));
    return static_cast<int>(ExitCode::kRuntimeFailure);
  }
}

}  // namespace kvtier::app
