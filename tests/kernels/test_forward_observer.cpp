// The observer sees exactly the attention the forward pass used: probabilities that sum to one,
// that an independent recomputation from the cached keys and the queries reproduces, and that
// respect causality, grouping and sliding windows. Attaching it changes nothing.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "kernels/engine.hpp"
#include "kernels/hf_checkpoint.hpp"
#include "kernels/llama2c_checkpoint.hpp"
#include "tests/kernels/support/model_files.hpp"

namespace kk = kvtier::kernels;

namespace {

// Records everything: keys by (layer, position) and every attention step.
class RecordingObserver final : public kk::ForwardObserver {
 public:
  struct Step {
    kk::AttentionStep shape;
    std::vector<float> queries;
    std::vector<float> probabilities;
  };

  void on_key_value(const kk::KeyValueWrite& write) override {
    keys[{write.layer, write.position}] = {write.keys.begin(), write.keys.end()};
  }
  void on_attention(const kk::AttentionStep& step) override {
    Step copy{step,
              {step.queries.begin(), step.queries.end()},
              {step.probabilities.begin(), step.probabilities.end()}};
    // The engine's spans are valid only during the call: point them at the copies.
    copy.shape.queries = copy.queries;
    copy.shape.probabilities = copy.probabilities;
    steps.push_back(std::move(copy));
  }

  std::map<std::pair<int, int>, std::vector<float>> keys;
  std::vector<Step> steps;
};

// softmax(q . k / sqrt(d)) over the step's keys for one query head, from scratch in double.
std::vector<double> recompute(const RecordingObserver& observer,
                              const RecordingObserver::Step& step, int head) {
  const kk::AttentionStep& shape = step.shape;
  const int group = shape.query_heads / shape.kv_heads;
  const int kv_head = head / group;
  std::vector<double> scores;
  for (int key = 0; key < shape.key_count; ++key) {
    const std::vector<float>& k = observer.keys.at({shape.layer, shape.first_key_position + key});
    const auto dim = static_cast<std::size_t>(shape.head_dim);
    const std::size_t query_offset = static_cast<std::size_t>(head) * dim;
    const std::size_t key_offset = static_cast<std::size_t>(kv_head) * dim;
    double dot = 0.0;
    for (std::size_t i = 0; i < dim; ++i) {
      dot += static_cast<double>(step.queries[query_offset + i]) * k[key_offset + i];
    }
    scores.push_back(dot / std::sqrt(static_cast<double>(shape.head_dim)));
  }
  const double largest = *std::max_element(scores.begin(), scores.end());
  double total = 0.0;
  for (double& score : scores) {
    score = std::exp(score - largest);
    total += score;
  }
  for (double& score : scores) {
    score /= total;
  }
  return scores;
}

}  // namespace

TEST_CASE(
    "the observer sees every layer and position, and recomputing attention from the "
    "cached keys gives the same probabilities",
    "[kernels][observer]") {
  const auto weights = std::make_shared<const kk::ModelWeights>(
      kk::load_llama2c_checkpoint(kk::testing::stories_dir() / "stories260K.bin"));
  const auto engine = kk::make_cpu_engine(weights);
  const auto plain = kk::make_cpu_engine(weights);
  RecordingObserver observer;
  engine->set_observer(&observer);

  const std::vector<std::int32_t> prompt = {1, 403, 407, 261, 378};
  const auto observed_logits = engine->prefill(prompt);
  const std::vector<float> observed(observed_logits.begin(), observed_logits.end());
  const auto plain_logits = plain->prefill(prompt);
  CHECK(std::equal(observed.begin(), observed.end(), plain_logits.begin(), plain_logits.end()));
  static_cast<void>(engine->decode(432));
  static_cast<void>(engine->decode(383));

  constexpr std::size_t kLayersTimesPositions = 35;  // 5 layers x 7 positions
  CHECK(observer.keys.size() == kLayersTimesPositions);
  REQUIRE(observer.steps.size() == kLayersTimesPositions);
  int decode_steps = 0;
  for (const auto& step : observer.steps) {
    const kk::AttentionStep& shape = step.shape;
    CHECK(shape.query_heads == 8);
    CHECK(shape.kv_heads == 4);
    CHECK(shape.first_key_position == 0);
    CHECK(shape.key_count == shape.query_position + 1);  // causal: itself and everything before
    CHECK(shape.prefill == (shape.query_position < 5));
    decode_steps += shape.prefill ? 0 : 1;
    for (int head = 0; head < shape.query_heads; ++head) {
      const auto row = shape.head_probabilities(head);
      double sum = 0.0;
      for (const float p : row) {
        sum += p;
      }
      CHECK(sum == Approx(1.0).margin(1e-5));
      const std::vector<double> expected = recompute(observer, step, head);
      for (int key = 0; key < shape.key_count; ++key) {
        CHECK(row[static_cast<std::size_t>(key)] ==
              Approx(expected[static_cast<std::size_t>(key)]).margin(1e-5));
      }
    }
  }
  CHECK(decode_steps == 5 * 2);
}

TEST_CASE("a sliding window limits the keys each query sees", "[kernels][observer]") {
  const kk::testing::TempDir temp("observer-window");
  const auto spec = kk::testing::small_spec(kvtier::config::MISTRAL);  // window of 4 tokens
  kk::testing::write_random_hf_model(spec, temp.path(), 3);
  const auto engine = kk::make_cpu_engine(
      std::make_shared<const kk::ModelWeights>(kk::load_hf_checkpoint(temp.path())));
  RecordingObserver observer;
  engine->set_observer(&observer);
  static_cast<void>(engine->prefill(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7}));
  for (const auto& step : observer.steps) {
    const int position = step.shape.query_position;
    CHECK(step.shape.first_key_position == std::max(0, position - 3));
    CHECK(step.shape.key_count == std::min(position + 1, 4));
    for (int head = 0; head < step.shape.query_heads; ++head) {
      const std::vector<double> expected = recompute(observer, step, head);
      const auto row = step.shape.head_probabilities(head);
      for (std::size_t key = 0; key < expected.size(); ++key) {
        CHECK(row[key] == Approx(expected[key]).margin(1e-5));
      }
    }
  }
  engine->set_observer(nullptr);
  static_cast<void>(engine->decode(8));
  CHECK(observer.steps.size() == 14);  // 2 layers x 7 prompt positions; detached since
}
