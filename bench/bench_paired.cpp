// Watched against unwatched in pairs: each iteration runs the same forward (or training step)
// once unwatched and once watched, back to back, in alternating order, and keeps the ratio of the
// two. The medians of the other cases compare repetitions half a second or more apart, and on a
// virtual machine the speed drifts by several percent over seconds; a pair is over in a tenth of
// a second (a forward) to a third of one (a training step), so drift mostly cancels within it.
// Counters: `ratio`, the median of the pairs' ratios, and `ratio_q1`, `ratio_q3`, their quartiles.
//
// The watchdog stays attached throughout; the unwatched run turns LibTorch's op callbacks off on
// its thread (at::RecordFunctionGuard), so none of the watchdog's code runs in it.
// `PairedNoWatchdog` checks that this is what no watchdog at all costs: its pairs are a run with
// no watchdog in the process and a run with one attached but switched off that way (ratio 1).
#include <ATen/record_function.h>
#include <benchmark/benchmark.h>
#include <sentinel/sentinel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <sstream>
#include <vector>

#include "bare_reads.h"
#include "conv_model.h"
#include "scripted_model.h"
#include "transformer_model.h"

namespace {

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `unwatched` and `watched` once each per iteration, the first of the two alternating; `before`
// (untimed) runs ahead of each with whether the watched one comes next.
void run_pairs(benchmark::State& state, const std::function<void()>& unwatched, const std::function<void()>& watched,
               const std::function<void(bool)>& before = [](bool) {}) {
  auto timed = [&](bool is_watched) {
    before(is_watched);
    return seconds_of(is_watched ? watched : unwatched);
  };
  for (int i = 0; i < 2; ++i) {  // warm-up: caches, the watchdog's first batch, the allocator
    timed(false);
    timed(true);
  }
  std::vector<double> ratios;
  bool watched_first = false;
  for (auto _ : state) {
    double u, w;
    if (watched_first) {
      w = timed(true);
      u = timed(false);
    } else {
      u = timed(false);
      w = timed(true);
    }
    watched_first = !watched_first;
    ratios.push_back(w / u);
  }
  if (ratios.empty()) return;
  std::sort(ratios.begin(), ratios.end());
  auto quantile = [&](double q) { return ratios[static_cast<size_t>(q * static_cast<double>(ratios.size() - 1) + 0.5)]; };
  state.counters["ratio"] = quantile(0.5);
  state.counters["ratio_q1"] = quantile(0.25);
  state.counters["ratio_q3"] = quantile(0.75);
}

// The unwatched half: the watchdog's callbacks off on this thread (and so in the backward, which
// LibTorch runs on it with the thread's callback state, for CPU tensors).
template <typename F>
void callbacks_off(F&& run) {
  at::RecordFunctionGuard off(false);
  run();
}

// A model, its input and its optimizer; a training step is forward, pow(2).mean().backward()
// and an SGD step.
template <typename Net>
struct Subject {
  Subject(Net net, std::vector<int64_t> input_shape, bool training) : model(std::move(net)), sgd(model->parameters(), 1e-4) {
    torch::manual_seed(0);
    model->train(training);
    x = torch::randn(input_shape);
  }
  void step() {
    sgd.zero_grad();
    model->forward(x).pow(2).mean().backward();
    sgd.step();
  }
  Net model;
  torch::optim::SGD sgd;
  torch::Tensor x;
};

Subject<bench::Encoder> transformer(bool training) {
  return {bench::Encoder(bench::kLayers, bench::kModel, bench::kHeads, bench::kFeedForward),
          {bench::kBatch, bench::kSeq, bench::kModel},
          training};
}
Subject<bench::ResNet> conv(bool training) { return {bench::ResNet(), {8, 3, 64, 64}, training}; }

sentinel::Options quiet(std::ostringstream& out) { return sentinel::Options().output(out); }

// reuse_parameters: Options::reuse_unchanged_parameter_reads (opt-in).
template <typename Net>
void paired_forward(benchmark::State& state, Subject<Net>& m, bool reuse_parameters = false) {
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow debug(m.model, quiet(out).reuse_unchanged_parameter_reads(reuse_parameters));
  run_pairs(
      state, [&] { callbacks_off([&] { benchmark::DoNotOptimize(m.model->forward(m.x)); }); },
      [&] { benchmark::DoNotOptimize(debug.forward(m.x)); });
}

// The floor: the same forward with only a bare callback that reads each op's tensors once
// (bench/bare_reads.h) against unwatched. Counters: `MB_read`, what it read per forward, and
// `read_GBps`, how fast, timed inside the callback (the model's own tensors, where they are).
template <typename Net>
void paired_bare_reads(benchmark::State& state, Subject<Net>& m) {
  torch::NoGradGuard no_grad;
  bench::BareReads reads;
  int64_t forwards = 0;
  run_pairs(
      state, [&] { callbacks_off([&] { benchmark::DoNotOptimize(m.model->forward(m.x)); }); },
      [&] {
        reads.begin();
        benchmark::DoNotOptimize(m.model->forward(m.x));
        reads.end();
        ++forwards;
      });
  const auto [bytes, seconds] = reads.take_bytes_and_seconds();
  if (forwards > 0) state.counters["MB_read"] = bytes / static_cast<double>(forwards) / 1e6;
  if (seconds > 0) state.counters["read_GBps"] = bytes / seconds / 1e9;
}

// Training steps: the unwatched one with the callbacks off, the watched one inside a batch.
void run_step_pairs(benchmark::State& state, sentinel::Watchdog& watch, const std::function<void()>& step) {
  run_pairs(
      state, [&] { callbacks_off(step); },
      [&] {
        auto batch = watch.batch();
        step();
        batch.finish();
      });
}

template <typename Net>
void paired_train_step(benchmark::State& state, Subject<Net>& m) {
  std::ostringstream out;
  sentinel::Watchdog watch(m.model.ptr(), quiet(out));
  run_step_pairs(state, watch, [&] { m.step(); });
}

void BM_PairedForward(benchmark::State& state) {
  auto m = transformer(false);
  paired_forward(state, m);
}
void BM_PairedForwardReusingParameters(benchmark::State& state) {
  auto m = transformer(false);
  paired_forward(state, m, true);
}
void BM_PairedTrainStep(benchmark::State& state) {
  auto m = transformer(true);
  paired_train_step(state, m);
}
void BM_PairedConvForward(benchmark::State& state) {
  auto m = conv(false);
  paired_forward(state, m);
}
void BM_PairedConvTrainStep(benchmark::State& state) {
  auto m = conv(true);
  paired_train_step(state, m);
}

void BM_PairedBareReads(benchmark::State& state) {
  auto m = transformer(false);
  paired_bare_reads(state, m);
}
void BM_PairedConvBareReads(benchmark::State& state) {
  auto m = conv(false);
  paired_bare_reads(state, m);
}

void BM_PairedScriptedForward(benchmark::State& state) {
  auto model = bench::load_scripted(state);
  if (!model) return;
  model->eval();
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  sentinel::DebugUnderflowOverflow<torch::jit::Module> debug(*model, quiet(out));
  const std::vector<c10::IValue> inputs{bench::scripted_input()};
  run_pairs(
      state, [&] { callbacks_off([&] { benchmark::DoNotOptimize(model->forward(inputs)); }); },
      [&] { benchmark::DoNotOptimize(debug.forward(inputs)); });
}

void BM_PairedScriptedTrainStep(benchmark::State& state) {
  auto model = bench::load_scripted(state);
  if (!model) return;
  bench::ScriptedStep s(*model);
  std::ostringstream out;
  sentinel::Watchdog watch(s.model, quiet(out));
  run_step_pairs(state, watch, [&] { s.step(); });
}

// The recipes against the step: three runs per iteration in rotating order, unwatched, watched
// with the statistics only, and watched with every recipe (delayed, current, MXFP8, NVFP4,
// Float8Block) probing every GEMM operand of every layer. Two watchdogs stay attached; each reads
// only inside its own batch. Counters: `recipes_vs_stats` (the goal: at most 1.5),
// `stats_vs_unwatched`, `recipes_vs_unwatched` (medians), the first's quartiles, and
// `recipe_metrics`, the metrics the recipes gave in the last step (slots x recipes).
void run_recipe_triples(benchmark::State& state, sentinel::Watchdog& stats_only, sentinel::Watchdog& recipes,
                        const std::function<void()>& step) {
  auto timed = [&](int which) {
    if (which == 0) return seconds_of([&] { callbacks_off(step); });
    sentinel::Watchdog& w = which == 1 ? stats_only : recipes;
    return seconds_of([&] {
      auto batch = w.batch();
      step();
      batch.finish();
    });
  };
  for (int i = 0; i < 2; ++i) {  // warm-up
    for (int which = 0; which < 3; ++which) timed(which);
  }
  std::vector<double> rs, su, ru;
  int first = 0;
  for (auto _ : state) {
    double t[3];
    for (int k = 0; k < 3; ++k) t[(first + k) % 3] = timed((first + k) % 3);
    first = (first + 1) % 3;
    rs.push_back(t[2] / t[1]);
    su.push_back(t[1] / t[0]);
    ru.push_back(t[2] / t[0]);
  }
  if (rs.empty()) return;
  auto quantile = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
  };
  state.counters["recipes_vs_stats"] = quantile(rs, 0.5);
  state.counters["recipes_vs_stats_q1"] = quantile(rs, 0.25);
  state.counters["recipes_vs_stats_q3"] = quantile(rs, 0.75);
  state.counters["stats_vs_unwatched"] = quantile(su, 0.5);
  state.counters["recipes_vs_unwatched"] = quantile(ru, 0.5);
  // What the recipes read in the last step: slots (layer x role) times recipes.
  state.counters["recipe_metrics"] = static_cast<double>(recipes.fp8_metrics().size());
}

sentinel::Options every_recipe(std::ostringstream& out) {
  using sentinel::fp8::ScalingRecipe;
  return quiet(out).fp8(sentinel::Fp8Options().enabled(true).recipes(
      {ScalingRecipe::Delayed, ScalingRecipe::Current, ScalingRecipe::MXFP8, ScalingRecipe::NVFP4,
       ScalingRecipe::Float8Block}));
}

void BM_RecipesTrainStep(benchmark::State& state) {
  auto m = transformer(true);
  std::ostringstream out;
  sentinel::Watchdog stats_only(m.model.ptr(), quiet(out));
  sentinel::Watchdog recipes(m.model.ptr(), every_recipe(out));
  run_recipe_triples(state, stats_only, recipes, [&] { m.step(); });
}

void BM_RecipesScriptedTrainStep(benchmark::State& state) {
  auto model = bench::load_scripted(state);
  if (!model) return;
  bench::ScriptedStep s(*model);
  std::ostringstream out;
  sentinel::Watchdog stats_only(s.model, quiet(out));
  sentinel::Watchdog recipes(s.model, every_recipe(out));
  run_recipe_triples(state, stats_only, recipes, [&] { s.step(); });
}

// The check of the unwatched half: no watchdog in the process against one attached and switched
// off on this thread (made and destroyed around its run, outside the timing).
void BM_PairedNoWatchdog(benchmark::State& state) {
  auto m = transformer(false);
  torch::NoGradGuard no_grad;
  std::ostringstream out;
  std::optional<sentinel::DebugUnderflowOverflow<bench::Encoder>> debug;
  run_pairs(
      state, [&] { benchmark::DoNotOptimize(m.model->forward(m.x)); },
      [&] { callbacks_off([&] { benchmark::DoNotOptimize(m.model->forward(m.x)); }); },
      [&](bool attached) {
        if (attached) {
          debug.emplace(m.model, quiet(out));
        } else {
          debug.reset();
        }
      });
}

}  // namespace

// Three seconds a repetition whatever --benchmark_min_time says: tens of pairs in each.
BENCHMARK(BM_PairedNoWatchdog)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedForward)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedForwardReusingParameters)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedBareReads)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedScriptedForward)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedConvForward)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedConvBareReads)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedTrainStep)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedScriptedTrainStep)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_PairedConvTrainStep)->Unit(benchmark::kMillisecond)->MinTime(3);
// A triple of training steps takes about 2 s here: ten seconds a repetition.
BENCHMARK(BM_RecipesTrainStep)->Unit(benchmark::kMillisecond)->MinTime(10);
BENCHMARK(BM_RecipesScriptedTrainStep)->Unit(benchmark::kMillisecond)->MinTime(10);
