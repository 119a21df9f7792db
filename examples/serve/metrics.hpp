#pragma once
// zipage-serve's /metrics: Prometheus text exposition (format 0.0.4) of the engine's gauges and counters and
// the server's own counters and latency histograms.
#include <array>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "zipage/engine/engine.hpp"

namespace zipage_serve {

// A label value as the exposition format spells it: backslash, double quote and newline escaped.
inline std::string prometheus_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// A cumulative histogram with fixed upper bounds (seconds), as prometheus_client writes one.
class histogram {
 public:
  explicit histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

  void observe(double v) {
    std::size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
  }

  // `labels`: the series' other labels, e.g. model_name="m" (escaped), written before le.
  void write(std::ostringstream& os, const std::string& name, const std::string& help, const std::string& labels) const {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
      cumulative += counts_[i];
      os << name << "_bucket{" << labels << ",le=\"" << bounds_[i] << "\"} " << cumulative << "\n";
    }
    cumulative += counts_.back();
    os << name << "_bucket{" << labels << ",le=\"+Inf\"} " << cumulative << "\n";
    os << name << "_sum{" << labels << "} " << sum_ << "\n" << name << "_count{" << labels << "} " << count_ << "\n";
  }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

// What the engine thread and the HTTP handlers record; every member is guarded by `mutex`.
struct server_metrics {
  std::mutex mutex;
  zipage::engine_stats engine;  // the engine thread's latest snapshot
  std::int64_t request_prompt_tokens = 0;      // prompt tokens of accepted requests (each choice once)
  std::int64_t request_generation_tokens = 0;  // tokens streamed to clients
  std::int64_t finished_stop = 0, finished_length = 0, finished_error = 0, cancelled = 0;
  std::int64_t rejected_queue_full = 0, rejected_invalid = 0, rejected_shutting_down = 0;
  int http_in_flight = 0;
  histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}};
  histogram itl{{0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}};
  histogram e2e{{0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0}};

  std::string render(const std::string& model_name) {
    std::lock_guard lock(mutex);
    const auto& s = engine;
    std::ostringstream os;
    os.precision(10);
    const std::string model_label = "model_name=\"" + prometheus_label_value(model_name) + "\"";
    const std::string label = "{" + model_label + "}";
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
      os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << label << " " << v << "\n";
    };
    metric("zipage_num_requests_running", "gauge", "Requests in the running batch (their KV on the device).", s.running);
    metric("zipage_num_requests_waiting", "gauge", "Requests queued for their first or next admission.", s.waiting);
    metric("zipage_num_requests_swapped", "gauge", "Compressed requests swapped out to host memory.", s.swapped);
    metric("zipage_num_requests_compressing", "gauge", "Requests whose compression is in flight.", s.compressing);
    metric("zipage_kv_blocks_used", "gauge", "KV blocks in use.", s.blocks_in_use);
    metric("zipage_kv_blocks_total", "gauge", "KV blocks in the pool.", s.num_blocks);
    metric("zipage_kv_cache_usage_perc", "gauge", "Share of the KV pool in use (0..1).",
           s.num_blocks > 0 ? static_cast<double>(s.blocks_in_use) / s.num_blocks : 0.0);
    metric("zipage_kv_blocks_peak", "gauge", "Most KV blocks in use at once since start.", s.peak_blocks_used);
    metric("zipage_query_slots_used", "gauge", "Query-window slots held by running requests.", s.slots_in_use);
    metric("zipage_query_slots_total", "gauge", "Query-window slots (Compressed PagedAttention).", s.num_query_slots);
    metric("zipage_compressions_total", "counter", "KV compressions (evictions back to the budget).", static_cast<double>(s.compressions));
    metric("zipage_tokens_evicted_total", "counter", "KV tokens dropped by compression.", static_cast<double>(s.tokens_evicted));
    metric("zipage_preemptions_total", "counter", "Requests preempted by recomputation.", static_cast<double>(s.preemptions));
    metric("zipage_swaps_total", "counter", "Compressed requests swapped out to host memory.", static_cast<double>(s.swaps));
    metric("zipage_prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / all prompt tokens.", s.prefix_hit_rate());
    metric("zipage_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV came from the prefix cache.",
           static_cast<double>(s.prefix_hit_tokens));
    metric("zipage_prompt_tokens_total", "counter", "Prompt tokens of accepted requests (each choice counted).",
           static_cast<double>(request_prompt_tokens));
    metric("zipage_generation_tokens_total", "counter", "Tokens generated for requests (cancelled ones included).",
           static_cast<double>(s.generated_tokens));
    metric("zipage_prefill_tokens_total", "counter", "Tokens fed through prefill steps (recomputation included).",
           static_cast<double>(s.prompt_tokens));
    metric("zipage_engine_steps_total", "counter", "Engine steps.", static_cast<double>(s.steps));
    metric("zipage_http_requests_in_flight", "gauge", "Generation requests being served over HTTP.", http_in_flight);
    os << "# HELP zipage_request_success_total Finished choices by finish reason.\n# TYPE zipage_request_success_total counter\n";
    os << "zipage_request_success_total{" << model_label << ",finished_reason=\"stop\"} " << finished_stop << "\n";
    os << "zipage_request_success_total{" << model_label << ",finished_reason=\"length\"} " << finished_length << "\n";
    metric("zipage_request_failure_total", "counter", "Choices the engine failed.", static_cast<double>(finished_error));
    metric("zipage_request_cancelled_total", "counter", "Choices cancelled (client disconnected, or shutdown).",
           static_cast<double>(cancelled));
    os << "# HELP zipage_request_rejected_total Requests refused before they reached the engine.\n"
          "# TYPE zipage_request_rejected_total counter\n";
    os << "zipage_request_rejected_total{" << model_label << ",reason=\"queue_full\"} " << rejected_queue_full << "\n";
    os << "zipage_request_rejected_total{" << model_label << ",reason=\"invalid\"} " << rejected_invalid << "\n";
    os << "zipage_request_rejected_total{" << model_label << ",reason=\"shutting_down\"} " << rejected_shutting_down << "\n";
    ttft.write(os, "zipage_time_to_first_token_seconds", "Time from a request's arrival to its first token.", model_label);
    itl.write(os, "zipage_inter_token_latency_seconds", "Time between two consecutive tokens of a request.", model_label);
    e2e.write(os, "zipage_e2e_request_latency_seconds", "Time from a request's arrival to its last token.", model_label);
    return os.str();
  }
};

}  // namespace zipage_serve
