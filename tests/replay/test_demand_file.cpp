// Demand files (exact round trip, refusal of bad files), trace content hashes and the demand
// cache (hits do not replay, keys follow the trace's content and the canonical policy).

#include <catch2/catch.hpp>

#include <hdf5.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "replay/demand_cache.hpp"
#include "replay/demand_file.hpp"
#include "replay/engine.hpp"
#include "replay/parameters.hpp"
#include "replay/registry.hpp"
#include "tests/replay/synthetic_source.hpp"
#include "tests/support/cli_runner.hpp"
#include "tests/traces/trace_fixture.hpp"

namespace {

namespace fs = std::filesystem;
namespace config = kvtier::config;
namespace replay = kvtier::replay;
namespace traces = kvtier::traces;
using kvtier::DataError;
using kvtier::test::slurp;
using kvtier::test::tiny_meta;
using kvtier::test::trace_scratch;

fs::path scratch(const std::string& name) {
  return trace_scratch() / name;
}

// A demand with every kind of record: tiered with compression moves tokens through all tiers.
replay::ReplayDemand sample_demand() {
  replay::InMemoryAttention source = kvtier::test::synthetic_attention(3, 20, 90, 7);
  auto policy = replay::builtin_policies().create(
      replay::parse_policy_string("tiered:hbm=0.4,evict=0.2,compress=0.5,delta=8,recent=8"),
      {3, 20, 90});
  replay::ReplayDemand demand = replay::replay(source, *policy);
  // On this attention tiered compresses only out of HBM (new tokens rank lowest); one record
  // gets a T1 -> T2 recode too, so that /compressed and /compressed_from_hbm differ.
  for (std::uint64_t step = 0; step < demand.steps(); ++step) {
    replay::StepLayerRecord& record = demand.at(step, 1);
    if (record.compressed > 0) {
      record.compressed_from_hbm = record.compressed - 1;
      break;
    }
  }
  return demand;
}

replay::DemandProvenance sample_provenance() {
  replay::DemandProvenance provenance;
  provenance.trace_hash = "0123456789abcdef0123456789abcdef";
  provenance.trace_file = "trace.h5";
  provenance.policy = "tiered:hbm=0.4,evict=0.2,delta=8,compress=0.5,recent=8,sinks=4";
  provenance.prompt_tokens = 20;
  provenance.first_layer = 2;
  provenance.model = "stories260K";
  provenance.from_topk = true;
  return provenance;
}

void require_same_demand(const replay::ReplayDemand& a, const replay::ReplayDemand& b) {
  REQUIRE(a.steps() == b.steps());
  REQUIRE(a.layers() == b.layers());
  REQUIRE(a.compressed_format() == b.compressed_format());
  for (std::uint64_t step = 0; step < a.steps(); ++step) {
    for (std::uint32_t layer = 0; layer < a.layers(); ++layer) {
      const replay::StepLayerRecord& x = a.at(step, layer);
      const replay::StepLayerRecord& y = b.at(step, layer);
      INFO("step " << step << ", layer " << layer);
      REQUIRE(x.tokens == y.tokens);
      REQUIRE(x.mass == y.mass);
      REQUIRE(x.promoted == y.promoted);
      REQUIRE(x.demoted == y.demoted);
      REQUIRE(x.compressed == y.compressed);
      REQUIRE(x.evicted == y.evicted);
      REQUIRE(x.newly_host == y.newly_host);
      REQUIRE(x.promoted_from_compressed == y.promoted_from_compressed);
      REQUIRE(x.compressed_from_hbm == y.compressed_from_hbm);
      REQUIRE(x == y);
    }
  }
  for (std::uint32_t layer = 0; layer < a.layers(); ++layer) {
    INFO("start, layer " << layer);
    REQUIRE(a.start(layer) == b.start(layer));
  }
}

// The DataError reading `path` raises; fails the test when there is none.
DataError refusal(const fs::path& path) {
  try {
    (void)replay::read_demand_file(path);
  } catch (const DataError& error) {
    return error;
  }
  FAIL("the demand file was accepted: " << path);
  return DataError("unreachable");
}

// Opens a demand file for editing with HDF5 directly (to damage it on purpose).
struct Editable {
  explicit Editable(const fs::path& path) : file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    REQUIRE(file >= 0);
  }
  Editable(const Editable&) = delete;
  Editable& operator=(const Editable&) = delete;
  ~Editable() { H5Fclose(file); }

  void replace_uint_attribute(const char* name, std::uint32_t value) const {
    REQUIRE(H5Adelete(file, name) >= 0);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(file, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attribute, H5T_NATIVE_UINT32, &value) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
  }
  void replace_string_attribute(const char* name, const std::string& value) const {
    REQUIRE(H5Adelete(file, name) >= 0);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, value.size());
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attribute = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attribute, type, value.data()) >= 0);
    H5Aclose(attribute);
    H5Sclose(space);
    H5Tclose(type);
  }
  // Replaces a dataset with one of `dims`, element `type`, filled with `fill`.
  template <typename T>
  void replace_dataset(const char* path, hid_t type, hid_t memory_type,
                       const std::vector<hsize_t>& dims, T fill) const {
    REQUIRE(H5Ldelete(file, path, H5P_DEFAULT) >= 0);
    std::size_t count = 1;
    for (const hsize_t d : dims) {
      count *= d;
    }
    const std::vector<T> values(count, fill);
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t dataset =
        H5Dcreate2(file, path, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
    H5Dclose(dataset);
    H5Sclose(space);
  }
  // Overwrites element `index` (row-major) of a dataset.
  template <typename T>
  void poke(const char* path, hid_t memory_type, const std::vector<hsize_t>& index, T value) const {
    const hid_t dataset = H5Dopen2(file, path, H5P_DEFAULT);
    const hid_t space = H5Dget_space(dataset);
    REQUIRE(H5Sselect_elements(space, H5S_SELECT_SET, 1, index.data()) >= 0);
    const hsize_t one = 1;
    const hid_t memory = H5Screate_simple(1, &one, nullptr);
    REQUIRE(H5Dwrite(dataset, memory_type, memory, space, H5P_DEFAULT, &value) >= 0);
    H5Sclose(memory);
    H5Sclose(space);
    H5Dclose(dataset);
  }

  hid_t file;
};

// A fresh copy of a valid demand file to damage.
fs::path valid_copy(const std::string& name) {
  static const fs::path original = [] {
    const fs::path path = scratch("valid_demand.h5");
    replay::write_demand_file(path, sample_demand(), sample_provenance());
    return path;
  }();
  const fs::path copy = scratch(name);
  fs::copy_file(original, copy, fs::copy_options::overwrite_existing);
  return copy;
}

// Replays observed per step, through a test registry; "counting" places like `full`.
int observed_steps = 0;

class CountingPolicy final : public replay::Policy {
 public:
  explicit CountingPolicy(std::vector<replay::PolicyInput> inputs) : inputs_(std::move(inputs)) {}
  [[nodiscard]] std::vector<replay::PolicyInput> inputs() const override { return inputs_; }
  void observe(const replay::StepView& /*view*/,
               std::vector<replay::LayerPlacement>& /*placement*/) override {
    ++observed_steps;
  }

 private:
  std::vector<replay::PolicyInput> inputs_;
};

replay::PolicyRegistry counting_registry() {
  std::vector<replay::PolicyInfo> policies;
  replay::ParamSpec level{"level", replay::ParamType::kInteger, "1", "unused", 0, 10, {}};
  policies.push_back({"counting",
                      "counts steps",
                      "tests",
                      {level},
                      [](const replay::PolicyParameters&, const replay::ReplayShape&) {
                        return std::make_unique<CountingPolicy>(std::vector<replay::PolicyInput>{});
                      }});
  policies.push_back({"needs-norms",
                      "reads key norms",
                      "tests",
                      {},
                      [](const replay::PolicyParameters&, const replay::ReplayShape&) {
                        return std::make_unique<CountingPolicy>(
                            std::vector<replay::PolicyInput>{replay::PolicyInput::kKeyNorms});
                      }});
  return replay::PolicyRegistry(std::move(policies));
}

// A small mean-only trace; `producer` changes the file's bytes but not its rows.
fs::path make_trace(const std::string& name, const std::string& producer = "test",
                    std::uint32_t steps = 30) {
  const fs::path path = scratch(name);
  traces::WriterOptions options;
  options.producer = producer;
  options.created = "2026-01-01T00:00:00Z";
  options.compression_threads = 0;
  kvtier::test::write_test_trace(path, tiny_meta(16, steps, {config::GRANULARITY_MEAN}), options);
  return path;
}

}  // namespace

TEST_CASE("demand files round-trip exactly", "[replay][demand]") {
  const replay::ReplayDemand demand = sample_demand();
  REQUIRE(demand.summary().evicted > 0);  // the sample exercises every field
  REQUIRE(demand.summary().demoted > 0);
  // ... and every source of promotions and compressions: T1 -> T0, T2 -> T0, T0 -> T2, T1 -> T2.
  std::uint64_t promoted_from_compressed = 0;
  std::uint64_t compressed_from_hbm = 0;
  std::uint64_t compressed = 0;
  for (std::uint64_t step = 0; step < demand.steps(); ++step) {
    for (std::uint32_t layer = 0; layer < demand.layers(); ++layer) {
      promoted_from_compressed += demand.at(step, layer).promoted_from_compressed;
      compressed_from_hbm += demand.at(step, layer).compressed_from_hbm;
      compressed += demand.at(step, layer).compressed;
    }
  }
  REQUIRE(promoted_from_compressed > 0);
  REQUIRE(demand.summary().promoted > promoted_from_compressed);
  REQUIRE(compressed_from_hbm > 0);
  REQUIRE(compressed == compressed_from_hbm + 1);
  REQUIRE(demand.compressed_format() == replay::kInt8HeadScaled);
  const replay::DemandProvenance provenance = sample_provenance();
  const fs::path path = scratch("demand.h5");
  replay::write_demand_file(path, demand, provenance);
  const replay::DemandFile read = replay::read_demand_file(path);
  require_same_demand(read.demand, demand);
  replay::DemandProvenance expected = provenance;
  expected.producer = replay::demand_producer();
  CHECK(read.provenance == expected);
  CHECK_THAT(read.provenance.producer, Catch::StartsWith("kvtier "));

  // Incomplete provenance or an empty demand is a programming error, refused before writing.
  replay::DemandProvenance no_hash = provenance;
  no_hash.trace_hash.clear();
  CHECK_THROWS_AS(replay::write_demand_file(scratch("no_hash.h5"), demand, no_hash),
                  std::invalid_argument);
  CHECK_THROWS_AS(
      replay::write_demand_file(scratch("empty.h5"), replay::ReplayDemand(3, 0), provenance),
      std::invalid_argument);
  CHECK_FALSE(fs::exists(scratch("no_hash.h5")));

  // The start placement round-trips too: streaming drops the prompt outside its window at start
  // (20 − 4 sinks − 8 window = 8 tokens a layer), and step 0's moves include the start's.
  replay::InMemoryAttention source = kvtier::test::synthetic_attention(3, 20, 90, 7);
  const auto streaming = replay::builtin_policies().create(
      replay::parse_policy_string("streaming:sinks=4,window=8"), {3, 20, 90});
  const replay::ReplayDemand windowed = replay::replay(source, *streaming);
  for (std::uint32_t layer = 0; layer < windowed.layers(); ++layer) {
    CHECK(windowed.start(layer).tokens == std::array<std::uint32_t, 4>{12, 0, 0, 8});
    CHECK(windowed.start(layer).evicted == 8);
    CHECK(windowed.at(0, layer).evicted == 8 + 1);  // the start's and the step's own
  }
  const fs::path windowed_path = scratch("demand_windowed.h5");
  replay::write_demand_file(windowed_path, windowed, provenance);
  require_same_demand(replay::read_demand_file(windowed_path).demand, windowed);

  // No timestamps: the same demand gives the same bytes; no temporary file is left.
  const fs::path again = scratch("demand_again.h5");
  replay::write_demand_file(again, demand, provenance);
  CHECK(slurp(path) == slurp(again));
  for (const auto& entry : fs::directory_iterator(trace_scratch())) {
    CHECK(entry.path().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("bad demand files are refused, naming the file and the dataset", "[replay][demand]") {
  SECTION("missing, not HDF5, truncated") {
    CHECK(refusal(scratch("no_such.h5")).where() == scratch("no_such.h5").string());
    const fs::path text = scratch("text.h5");
    std::ofstream(text) << "not a demand file\n";
    CHECK_THAT(refusal(text).what(), Catch::Contains("not an HDF5 file"));
    const fs::path cut = valid_copy("cut.h5");
    fs::resize_file(cut, fs::file_size(cut) / 2);
    CHECK_THAT(refusal(cut).where(), Catch::Contains(cut.string()));
  }
  SECTION("a trace file is not a demand file") {
    const fs::path trace = make_trace("not_demand.h5");
    CHECK_THAT(refusal(trace).what(), Catch::Contains("not a replay demand file"));
  }
  SECTION("attributes") {
    const fs::path version = valid_copy("version.h5");
    Editable(version).replace_uint_attribute("version", 3);
    CHECK_THAT(refusal(version).what(), Catch::Contains("version 3"));
    // Version 1 lacks what copy volumes need; it is refused, with what to do.
    const fs::path old = valid_copy("version1.h5");
    Editable(old).replace_uint_attribute("version", 1);
    CHECK_THAT(refusal(old).what(),
               Catch::Contains("version 1") && Catch::Contains("replay the trace again"));
    const fs::path scales = valid_copy("no_scales.h5");
    REQUIRE(H5Adelete(Editable(scales).file, "compressed_scale_bytes_per_head_vector") >= 0);
    CHECK_THAT(refusal(scales).what(),
               Catch::Contains("missing attribute 'compressed_scale_bytes_per_head_vector'"));
    const fs::path hash = valid_copy("hash.h5");
    Editable(hash).replace_string_attribute("trace_hash", "xyz");
    CHECK_THAT(refusal(hash).what(), Catch::Contains("trace_hash"));
    const fs::path steps = valid_copy("steps.h5");
    Editable(steps).replace_uint_attribute("steps", 91);
    const DataError error = refusal(steps);
    CHECK_THAT(error.what(), Catch::Contains("wrong shape"));
    CHECK(error.where() == steps.string() + ", dataset /tier_tokens");
    const fs::path missing = valid_copy("missing_attr.h5");
    REQUIRE(H5Adelete(Editable(missing).file, "policy") >= 0);
    CHECK_THAT(refusal(missing).what(), Catch::Contains("missing attribute 'policy'"));
  }
  SECTION("datasets: missing, wrong shape, wrong type") {
    const fs::path missing = valid_copy("missing_dataset.h5");
    REQUIRE(H5Ldelete(Editable(missing).file, "/tier_mass", H5P_DEFAULT) >= 0);
    CHECK(refusal(missing).where() == missing.string() + ", dataset /tier_mass");
    const fs::path shape = valid_copy("shape.h5");
    Editable(shape).replace_dataset<std::uint32_t>("/evicted", H5T_STD_U32LE, H5T_NATIVE_UINT32,
                                                   {90, 4}, 0);
    const DataError wrong_shape = refusal(shape);
    CHECK(wrong_shape.where() == shape.string() + ", dataset /evicted");
    CHECK_THAT(wrong_shape.what(), Catch::Contains("wrong shape"));
    const fs::path type = valid_copy("type.h5");
    Editable(type).replace_dataset<std::int32_t>("/promoted", H5T_STD_I32LE, H5T_NATIVE_INT32,
                                                 {90, 3}, 0);
    const DataError wrong_type = refusal(type);
    CHECK(wrong_type.where() == type.string() + ", dataset /promoted");
    CHECK_THAT(wrong_type.what(), Catch::Contains("uint32"));
  }
  SECTION("values: token counts that do not add up, masses that are not finite") {
    const fs::path tokens = valid_copy("tokens.h5");
    Editable(tokens).poke<std::uint32_t>("/tier_tokens", H5T_NATIVE_UINT32, {40, 1, 2}, 1000);
    const DataError counts = refusal(tokens);
    CHECK(counts.where() == tokens.string() + ", dataset /tier_tokens");
    CHECK_THAT(counts.what(), Catch::Contains("step 40, layer 1"));
    const fs::path mass = valid_copy("mass.h5");
    Editable(mass).poke<float>("/tier_mass", H5T_NATIVE_FLOAT, {3, 0, 0}, std::nanf(""));
    CHECK(refusal(mass).where() == mass.string() + ", dataset /tier_mass");
    const fs::path part = valid_copy("part.h5");
    Editable(part).poke<std::uint32_t>("/compressed_from_hbm", H5T_NATIVE_UINT32, {5, 2}, 1000);
    CHECK_THAT(refusal(part).what(),
               Catch::Contains("exceeds its total") && Catch::Contains("step 5, layer 2"));
    // The start: tokens adding up to the prompt, moves within step 0's.
    const fs::path start = valid_copy("start_tokens.h5");
    Editable(start).poke<std::uint32_t>("/start_tier_tokens", H5T_NATIVE_UINT32, {1, 3}, 5);
    const DataError start_counts = refusal(start);
    CHECK(start_counts.where() == start.string() + ", dataset /start_tier_tokens");
    CHECK_THAT(start_counts.what(), Catch::Contains("layer 1") && Catch::Contains("20"));
    const fs::path start_moves = valid_copy("start_moves.h5");
    Editable(start_moves).poke<std::uint32_t>("/start_moves", H5T_NATIVE_UINT32, {2, 1}, 1000);
    const DataError above = refusal(start_moves);
    CHECK(above.where() == start_moves.string() + ", dataset /start_moves");
    CHECK_THAT(above.what(), Catch::Contains("step 0") && Catch::Contains("layer 2"));
  }
}

TEST_CASE("trace content hash is XXH3-128 of the bytes", "[replay][demand]") {
  const fs::path empty = scratch("empty.bin");
  std::ofstream(empty).close();
  // Reference values from xxhsum -H2 (xxHash 0.8.1).
  CHECK(replay::trace_content_hash(empty) == "99aa06d3014798d86001c324468d497f");
  const fs::path abc = scratch("abc.bin");
  std::ofstream(abc) << "abc";
  CHECK(replay::trace_content_hash(abc) == "06b05ab6733a618578af5f94892f3950");
  // Longer than one 8 MiB read: the streamed hash equals the one-shot one.
  const fs::path big = scratch("big.bin");
  {
    std::vector<char> bytes((std::size_t{20} << 20) + 123);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>((i * 31 + 7) % 251);
    }
    std::ofstream(big, std::ios::binary).write(bytes.data(), static_cast<long>(bytes.size()));
  }
  CHECK(replay::trace_content_hash(big) == "9c2765be9088166ea9dcfe49b269ac8a");
  // Rewritten with other bytes of the same size: a new hash, not the remembered one.
  std::ofstream(abc) << "abd";
  CHECK(replay::trace_content_hash(abc) != "06b05ab6733a618578af5f94892f3950");
  CHECK_THROWS_AS(replay::trace_content_hash(scratch("absent.bin")), DataError);
}

TEST_CASE("cache: a hit says whether the policy's attention reads T2, as a replay does",
          "[replay][cache]") {
  // Not stored in the entry: the policy string, part of the entry's name, fixes it.
  const fs::path trace = make_trace("attends.h5");
  const fs::path cache = scratch("cache_attends");
  const replay::PolicyRegistry registry = replay::builtin_policies();
  for (const auto& [policy, attends] :
       std::vector<std::pair<std::string, bool>>{{"monarch:window=16,max_hot=32", false},
                                                 {"monarch:window=16,max_hot=32,attend=all", true},
                                                 {"tiered", true}}) {
    CAPTURE(policy);
    const config::PolicySpec spec = replay::parse_policy_string(policy);
    const replay::CachedReplay first = replay::cached_replay(trace, spec, cache, registry);
    REQUIRE(first.outcome == replay::CacheOutcome::kMiss);
    const replay::CachedReplay second = replay::cached_replay(trace, spec, cache, registry);
    REQUIRE(second.hit());
    CHECK(first.demand.attends_compressed() == attends);
    CHECK(second.demand.attends_compressed() == attends);
  }
}

TEST_CASE("cache: a hit returns the same demand without replaying", "[replay][cache]") {
  const fs::path trace = make_trace("cached.h5");
  const fs::path cache = scratch("cache_hit");
  const replay::PolicyRegistry registry = counting_registry();
  const config::PolicySpec spec = replay::parse_policy_string("counting:level=3");

  observed_steps = 0;
  const replay::CachedReplay first = replay::cached_replay(trace, spec, cache, registry);
  CHECK(first.outcome == replay::CacheOutcome::kMiss);
  CHECK(observed_steps == 30);
  REQUIRE(fs::exists(first.file));
  CHECK(first.file.parent_path() == cache);
  CHECK(first.file.filename().string() ==
        replay::demand_cache_file_name(first.provenance.trace_hash, "counting:level=3"));
  CHECK(first.provenance.trace_hash == replay::trace_content_hash(trace));
  CHECK(first.provenance.policy == "counting:level=3");
  CHECK(first.provenance.trace_file == "cached.h5");
  CHECK(first.provenance.model == "stories260K");
  const auto written = fs::last_write_time(first.file);

  const replay::CachedReplay second = replay::cached_replay(trace, spec, cache, registry);
  CHECK(second.hit());
  CHECK(observed_steps == 30);  // not replayed again
  CHECK(fs::last_write_time(second.file) == written);
  CHECK(second.file == first.file);
  CHECK(second.provenance == first.provenance);
  require_same_demand(second.demand, first.demand);

  // The default left out or spelt out: one canonical policy, one entry.
  const replay::CachedReplay left_out =
      replay::cached_replay(trace, replay::parse_policy_string("counting"), cache, registry);
  CHECK(left_out.outcome == replay::CacheOutcome::kMiss);  // level=1, another policy
  const replay::CachedReplay defaulted = replay::cached_replay(
      trace, replay::parse_policy_string("counting:level=1"), cache, registry);
  CHECK(defaulted.hit());
  CHECK(defaulted.file == left_out.file);
  CHECK(observed_steps == 60);

  // Without a cache folder: replayed, nothing written.
  const replay::CachedReplay off = replay::cached_replay(trace, spec, {}, registry);
  CHECK(off.outcome == replay::CacheOutcome::kOff);
  CHECK(off.file.empty());
  CHECK(observed_steps == 90);
  // The hash index and two entries: nothing else.
  std::size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(cache)) {
    entries += entry.path().extension() == ".h5" ? 1 : 0;
  }
  CHECK(entries == 2);
  CHECK(fs::exists(cache / "trace-hashes"));
}

TEST_CASE("cache: the key follows the trace's content", "[replay][cache]") {
  const fs::path cache = scratch("cache_content");
  const replay::PolicyRegistry registry = counting_registry();
  const config::PolicySpec spec = replay::parse_policy_string("counting");
  const fs::path trace = make_trace("content.h5", "writer A");
  const replay::CachedReplay a = replay::cached_replay(trace, spec, cache, registry);
  CHECK(a.outcome == replay::CacheOutcome::kMiss);

  // Rewritten byte for byte: the same key, a hit (the key is the content, not the file's time).
  fs::remove(trace);
  (void)make_trace("content.h5", "writer A");
  const replay::CachedReplay same = replay::cached_replay(trace, spec, cache, registry);
  CHECK(same.hit());
  CHECK(same.file == a.file);

  // Same rows, other bytes (another producer attribute): a new key.
  (void)make_trace("content.h5", "writer B");
  const replay::CachedReplay b = replay::cached_replay(trace, spec, cache, registry);
  CHECK(b.outcome == replay::CacheOutcome::kMiss);
  CHECK(b.file != a.file);
  CHECK(b.provenance.trace_hash != a.provenance.trace_hash);

  // Other rows: a new key and a different demand.
  (void)make_trace("content.h5", "writer B", 31);
  const replay::CachedReplay c = replay::cached_replay(trace, spec, cache, registry);
  CHECK(c.outcome == replay::CacheOutcome::kMiss);
  CHECK(c.demand.steps() == 31);
}

TEST_CASE("cache: damaged and mismatched entries are replaced", "[replay][cache]") {
  const fs::path trace = make_trace("replaced.h5");
  const fs::path cache = scratch("cache_replaced");
  const replay::PolicyRegistry registry = counting_registry();
  const config::PolicySpec spec = replay::parse_policy_string("counting:level=2");
  const replay::CachedReplay first = replay::cached_replay(trace, spec, cache, registry);

  fs::resize_file(first.file, 100);
  observed_steps = 0;
  const replay::CachedReplay damaged = replay::cached_replay(trace, spec, cache, registry);
  CHECK(damaged.outcome == replay::CacheOutcome::kReplaced);
  CHECK_THAT(damaged.note, Catch::Contains(first.file.string()));
  CHECK(observed_steps == 30);
  require_same_demand(damaged.demand, first.demand);
  CHECK(replay::cached_replay(trace, spec, cache, registry).hit());

  // Another policy's entry under this key (a collision or a copied file) is not trusted.
  const replay::CachedReplay other = replay::cached_replay(
      trace, replay::parse_policy_string("counting:level=4"), cache, registry);
  fs::copy_file(other.file, first.file, fs::copy_options::overwrite_existing);
  const replay::CachedReplay mismatched = replay::cached_replay(trace, spec, cache, registry);
  CHECK(mismatched.outcome == replay::CacheOutcome::kReplaced);
  CHECK_THAT(mismatched.note, Catch::Contains("counting:level=4"));
  CHECK(replay::read_demand_file(first.file).provenance.policy == "counting:level=2");

  // An entry whose T2 format is not the policy's (its code changed within a version).
  replay::DemandFile entry = replay::read_demand_file(first.file);
  entry.demand.set_compressed_format({16.0, 0});
  replay::write_demand_file(first.file, entry.demand, entry.provenance);
  const replay::CachedReplay reformatted = replay::cached_replay(trace, spec, cache, registry);
  CHECK(reformatted.outcome == replay::CacheOutcome::kReplaced);
  CHECK_THAT(reformatted.note, Catch::Contains("compressed format"));
  CHECK(reformatted.demand.compressed_format() == replay::kInt8HeadScaled);
}

TEST_CASE("cache: the hash index follows the trace file", "[replay][cache]") {
  // trace-hashes/<XXH3-64 of the absolute path>.txt remembers the hash for the file's identity
  // (tests/cli/test_replay_cli.cpp checks that another process uses it); a rewritten file is
  // hashed again and the entry updated.
  const fs::path trace = make_trace("indexed.h5");
  const fs::path cache = scratch("cache_index");
  const fs::path index =
      cache / "trace-hashes" /
      (replay::policy_key(fs::absolute(trace).lexically_normal().string()) + ".txt");
  const config::PolicySpec spec = replay::parse_policy_string("counting");
  const replay::CachedReplay before =
      replay::cached_replay(trace, spec, cache, counting_registry());
  CHECK_THAT(slurp(index), Catch::StartsWith("kvtier-trace-hash 1\npath ") &&
                               Catch::EndsWith("xxh3-128 " + before.provenance.trace_hash + "\n"));
  (void)make_trace("indexed.h5", "another writer");
  const replay::CachedReplay after = replay::cached_replay(trace, spec, cache, counting_registry());
  CHECK(after.outcome == replay::CacheOutcome::kMiss);
  CHECK(after.provenance.trace_hash != before.provenance.trace_hash);
  CHECK_THAT(slurp(index), Catch::EndsWith("xxh3-128 " + after.provenance.trace_hash + "\n"));
}

TEST_CASE("cache: errors pass through", "[replay][cache]") {
  const fs::path trace = make_trace("errors.h5");
  const fs::path cache = scratch("cache_errors");
  try {
    (void)replay::cached_replay(trace, replay::parse_policy_string("needs-norms"), cache,
                                counting_registry());
    FAIL("a policy reading key norms ran on a trace without them");
  } catch (const DataError& error) {
    CHECK_THAT(std::string(error.what()),
               Catch::Contains(trace.string()) && Catch::Contains("key norms"));
  }
  CHECK_THROWS_AS(replay::cached_replay(trace, replay::parse_policy_string("nonesuch"), cache,
                                        counting_registry()),
                  kvtier::ConfigError);
  CHECK_THROWS_AS(replay::cached_replay(trace, replay::parse_policy_string("counting:depth=2"),
                                        cache, counting_registry()),
                  kvtier::ConfigError);
  CHECK_THROWS_AS(
      replay::cached_replay(scratch("absent_trace.h5"), replay::parse_policy_string("counting"),
                            cache, counting_registry()),
      DataError);
}

TEST_CASE("cache entries record top-k reconstruction and sliced layers", "[replay][cache]") {
  config::TraceMeta meta = tiny_meta(8, 12, {config::GRANULARITY_TOP_K});
  meta.set_top_k(4);
  meta.set_first_layer(1);
  meta.set_num_layers(2);
  const fs::path trace = scratch("topk_sliced.h5");
  traces::WriterOptions options;
  options.compression_threads = 0;
  kvtier::test::write_test_trace(trace, meta, options);
  const replay::CachedReplay result = replay::cached_replay(
      trace, replay::parse_policy_string("streaming:sinks=2,window=6"), scratch("cache_topk"));
  CHECK(result.provenance.from_topk);
  CHECK(result.provenance.first_layer == 1);
  CHECK(result.demand.layers() == 2);
  const replay::DemandFile file = replay::read_demand_file(result.file);
  CHECK(file.provenance.from_topk);
  CHECK(file.provenance.first_layer == 1);
  CHECK(file.provenance.policy == "streaming:sinks=2,window=6");
}
