#pragma once
// Pieces every subcommand shares: output format, `--set` collection, the preset registry and
// the config loader.

#include <boost/program_options.hpp>

#include <exception>
#include <filesystem>
#include <initializer_list>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "configs/loader.hpp"
#include "configs/presets.hpp"
#include "configs/schema/policy.pb.h"
#include "kernels/cuda_engine.hpp"
#include "kernels/device_info.hpp"
#include "kernels/model_weights.hpp"
#include "kernels/sampler.hpp"
#include "kernels/tiered_cache.hpp"
#include "kernels/tokenizer.hpp"

namespace kvtier::kernels {
struct TraceContents;
}  // namespace kvtier::kernels

namespace kvtier::app {

enum class Format { kText, kJson, kHtml };

struct Context {
  std::ostream& out;
  const config::PresetRegistry& presets;
  const config::ConfigLoader& loader;
};

using Arguments = std::vector<std::string>;

// Parses `args` against `options` (+ positionals); --help prints `usage` and the options.
// Returns false when help was printed.
bool parse_arguments(const Arguments& args,
                     const boost::program_options::options_description& options,
                     const boost::program_options::positional_options_description& positional,
                     boost::program_options::variables_map& values, const std::string& usage,
                     std::ostream& out);

// --format: text or json, and html where the command offers a page (report/html_page.hpp).
void add_format_option(boost::program_options::options_description& options,
                       bool offers_html = false);
void add_set_option(boost::program_options::options_description& options);
[[nodiscard]] Format format_from(const boost::program_options::variables_map& values,
                                 bool offers_html = false);
[[nodiscard]] std::vector<config::Override> overrides_from(
    const boost::program_options::variables_map& values);

// Prints what a command's failure says on standard error ("kvtier: error: ..." lines) and
// returns the exit code it ends with.
int report_failure(const std::exception_ptr& failure);

int run_presets(const Arguments& args, Context& context);
int run_config(const Arguments& args, Context& context);
int run_devices(const Arguments& args, Context& context);
int run_sim(const Arguments& args, Context& context);
int run_validate(const Arguments& args, Context& context);
int run_policies(const Arguments& args, Context& context);
int run_trace(const Arguments& args, Context& context);
// `kvtier trace meta` (apps/cmd_trace_meta.cpp): the /meta record and HDF5 attributes of a
// trace, for writers outside kvtier (scripts/capture_hf.py).
int run_trace_meta(const Arguments& args, Context& context);
// --granularity (repeatable, comma-separated: mean, heads, topk:K; mean rows when none is
// named), --window, --key-norms and --dtype of trace capture and trace meta; ConfigError for a
// bad value.
[[nodiscard]] kernels::TraceContents parse_trace_contents(
    const boost::program_options::variables_map& values);
int run_replay(const Arguments& args, Context& context);
int run_plan(const Arguments& args, Context& context);
int run_sweep(const Arguments& args, Context& context);
// `kvtier live` (apps/cmd_live.cpp, docs/LIVE.md).
int run_live(const Arguments& args, Context& context);

// "full,tiered:hbm=0.5,evict=0.1,h2o" -> full | tiered:hbm=0.5,evict=0.1 | h2o: a piece with '='
// but no ':' is a parameter of the policy before it (--compare).
[[nodiscard]] std::vector<config::PolicySpec> parse_policy_list(const std::string& text);
// --policy and --compare (sim and plan): the run's policy and compared policies replaced by those
// given. The run is validated after them, so a policy given there counts as the file's would.
void apply_policy_options(const boost::program_options::variables_map& values,
                          config::RunSpec& run);
// Subcommands of `kvtier replay`.
int run_replay_run(const Arguments& args, Context& context);
int run_replay_search_budgets(const Arguments& args, Context& context);

// --model of live runs: a llama2.c checkpoint, a Hugging Face directory, or random:PRESET[@SEED],
// seeded random weights in a model preset's shapes (kernels/random_model.hpp; seed 1 by
// default), for timing runs. ConfigError for an unknown preset or a bad seed. (Trace capture
// takes checkpoints only: a trace of random weights' attention would describe no model.)
[[nodiscard]] kernels::ModelWeights load_model_argument(const std::string& text,
                                                        const Context& context);
[[nodiscard]] bool is_random_model(const std::string& text);

// A prompt file's text (`--prompt-file`, trace capture and live runs); DataError when unreadable.
[[nodiscard]] std::string read_prompt_file(const std::string& path);
// The tokenizer of a model (`--tokenizer` not given): a Hugging Face directory's own, or beside
// a llama2.c checkpoint tokenizer.bin or else the only tok*.bin; ConfigError otherwise.
[[nodiscard]] std::filesystem::path find_tokenizer(const std::filesystem::path& model);
// The prompt's tokens (encode_prompt), a DataError naming --prompt or the prompt file when the
// text cannot be encoded (not UTF-8 for a byte-level BPE), a ConfigError when it is empty and
// the tokenizer has no BOS to start from.
[[nodiscard]] std::vector<std::int32_t> encode_prompt_argument(
    const kernels::Tokenizer& tokenizer, const std::string& text,
    const boost::program_options::variables_map& values);
// The tokenizer at `path` for a model of `spec`: DataError when its tokens do not fit the model's
// vocabulary, or when a llama2.c tokenizer.bin (one entry per token id) holds fewer entries
// than the model has tokens, as a truncated file does.
[[nodiscard]] std::unique_ptr<kernels::Tokenizer> load_model_tokenizer(
    const std::filesystem::path& path, const config::ModelSpec& spec);

// A command line as a file records it (a trace's /meta, a measurement's provenance): `command`
// then the arguments, quoted for a POSIX shell where they need it, less the options in `dropped`
// and their values. A trace drops --out (its name is not its content) and --threads
// (the attention is the same bits for every count), so the same trace is the same bytes.
[[nodiscard]] std::string command_line(std::string command, const Arguments& args,
                                       std::initializer_list<std::string_view> dropped = {});

// Output paths are checked before any work, so a long capture or live run does not end in an
// error it could have given at once. An output file (`option`, e.g. "--out"): refused (exit 2)
// when empty, when a folder has its name, or when it is one of `inputs` — the same file by
// device and inode, so "./t.h5" and "t.h5" are one — which writing it would destroy.
void check_output_file(const std::string& option, const std::filesystem::path& path,
                       const std::vector<std::filesystem::path>& inputs = {});
// The paths given for `options` (each a single path or a list of them), for check_output_file's
// inputs; options not given are left out.
[[nodiscard]] std::vector<std::filesystem::path> given_paths(
    const boost::program_options::variables_map& values,
    std::initializer_list<const char*> options);
// A run's policy and compared policies against the policy registry (names and parameters: the
// schema knows a policy only as a name and a list), before anything runs. ConfigError naming
// where the bad one came from: --policy or --compare when `options` holds it, else the file's
// line:column and field (`compare[1]`).
void check_run_policies(const config::RunSpec& run, const config::LocationMap& locations,
                        const boost::program_options::variables_map* options = nullptr);
// The files a run reads, for check_output_file's inputs: those of `other_inputs` (given_paths),
// and through --model and --tokenizer each, every file of a folder among them, and the
// tokenizer find_tokenizer finds when none is given.
[[nodiscard]] std::vector<std::filesystem::path> model_input_paths(
    const boost::program_options::variables_map& values,
    std::initializer_list<const char*> other_inputs);
// An output folder: refused when empty or when a file has its name, or when one of the `files`
// the command writes into it exists as something a file cannot replace (a folder, a device).
void check_output_folder(const std::string& option, const std::filesystem::path& path,
                         std::initializer_list<const char*> files = {});

// --device of trace capture and live runs: cpu, or cuda where this build has the CUDA targets and
// a CUDA device is present; ConfigError (naming why) otherwise. Checked before a model loads.
// Returns the device the engine runs on (the host CPU, or CUDA device 0), for provenance.
kernels::DeviceInfo check_engine_device(const std::string& device);

// The options --temperature T, --top-p P and --seed S of commands that generate tokens, and
// their value: greedy when --temperature is 0 (its default); ConfigError for a negative or
// non-finite temperature or a top-p outside (0, 1].
[[nodiscard]] boost::program_options::options_description sampling_options();
[[nodiscard]] kernels::SamplingOptions sampling_option(
    const boost::program_options::variables_map& values);

// The option --threads N (the CPU engine's threads, docs/ENGINE.md) for commands that run an
// engine, and its value: 1 when not given; ConfigError below 1 or with a device other than cpu.
[[nodiscard]] boost::program_options::options_description cpu_engine_options();
[[nodiscard]] kernels::CpuEngineOptions cpu_engine_option(
    const boost::program_options::variables_map& values, const std::string& device);
// The value of the thread-count option --NAME (given): ConfigError outside 1 to 1024.
[[nodiscard]] int thread_count_option(const boost::program_options::variables_map& values,
                                      const std::string& name);
// The options --cuda-attention split-keys|per-head, --cuda-gemm cublas|warp-rows and
// --cuda-fusion off|on (the CUDA engine's attention kernel, small-call GEMM and fused kernels,
// docs/ENGINE.md), for commands that run an engine.
[[nodiscard]] boost::program_options::options_description cuda_engine_options();
// Their values: the engine's defaults when not given; ConfigError for another value, or when
// given with a device other than cuda.
[[nodiscard]] kernels::CudaAttention cuda_attention_option(
    const boost::program_options::variables_map& values, const std::string& device);
[[nodiscard]] kernels::CudaGemm cuda_gemm_option(
    const boost::program_options::variables_map& values, const std::string& device);
[[nodiscard]] kernels::CudaFusion cuda_fusion_option(
    const boost::program_options::variables_map& values, const std::string& device);
// --cuda-copies kernels|copy-engines of `kvtier live` (the CUDA cache's copies, docs/LIVE.md)
// likewise: kernels when not given.
[[nodiscard]] kernels::CacheCopies cuda_copies_option(
    const boost::program_options::variables_map& values, const std::string& device);
// --compute-dtype bf16|fp16|fp32 of `kvtier live` likewise: bf16 when not given.
[[nodiscard]] kernels::CudaComputeDtype cuda_compute_dtype_option(
    const boost::program_options::variables_map& values, const std::string& device);

// "kvtier 0.1.0 (commit abc123, CUDA on)"
[[nodiscard]] std::string version_line();

}  // namespace kvtier::app
