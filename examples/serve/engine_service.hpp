#pragma once
// The engine behind zipage-serve, on a thread of its own. HTTP handler threads never touch the engine: they
// submit jobs to a queue and read their request's events from a channel; the engine thread takes the
// queue between steps (add_request, cancel), runs step() and hands the step's events, as one batch, to a
// dispatcher thread that pushes each into the channel of the request it belongs to. Pushing an event is a
// short lock on that channel plus a wake of its handler; done on the engine thread for 256 requests that
// was ~1 ms of every step (a futex wake per waiting handler), so the engine pays one lock and one wake per
// step instead, and a slow client never holds up a step.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "metrics.hpp"
#include "zipage/engine/engine.hpp"

namespace zipage_serve {

using clock_type = std::chrono::steady_clock;

// One generated token (or the end) of one choice of a request.
struct choice_event {
  int choice = 0;
  zipage::token_id token = -1;
  std::string text;        // the output text this event adds (zipage::step_event::text: stop-string safe)
  std::string token_text;  // the token's own text (for logprobs)
  // When the request asked for logprobs (a row with no finite logit gives NaN: written as -9999, never dropped).
  std::optional<float> logprob;
  std::vector<zipage::token_logprob> top_logprobs;  // when it asked for top_logprobs > 0
  bool finished = false;
  // On the last event: "stop", "length", "cancelled" or "error", vLLM's stop_reason (the engine's: the stop
  // token's id or the stop string, none for the model's EOS or length), the complete output text (stop strings
  // cut, as the engine cuts them) and the number of generated tokens.
  std::string finish_reason;
  zipage::stopped_by stop_reason;
  std::string error;
  std::string final_text;
  int completion_tokens = 0;
};

// A request's mailbox: the engine thread writes, the request's HTTP handler reads.
class channel {
 public:
  void push(choice_event e) {
    {
      std::lock_guard lock(m_);
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  // Everything queued, waiting up to `timeout` for the first event or the client's hang-up.
  std::vector<choice_event> pop_all(std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty() || hung_up_; });
    return take(lock);
  }
  // Everything queued, waiting up to `timeout` for the first event only (draining a cancelled request,
  // whose hang-up would otherwise end every wait at once).
  std::vector<choice_event> pop_events(std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    return take(lock);
  }
  // The request's client closed its connection (reported by the hang-up watch); wakes pop_all.
  void hang_up() {
    {
      std::lock_guard lock(m_);
      hung_up_ = true;
    }
    cv_.notify_all();
  }
  [[nodiscard]] bool hung_up() {
    std::lock_guard lock(m_);
    return hung_up_;
  }
  // The engine thread's answer to the submission: 1 accepted, -1 refused (with `refusal`).
  void settle(int state, std::string refusal = {}) {
    {
      std::lock_guard lock(m_);
      accepted_ = state;
      refusal_ = std::move(refusal);
    }
    cv_.notify_all();
  }
  // Waits for settle(); returns the state (0 if the engine thread never answered in time).
  int wait_settled(std::chrono::milliseconds timeout, std::string& refusal) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, timeout, [&] { return accepted_ != 0; });
    refusal = refusal_;
    return accepted_;
  }

 private:
  std::vector<choice_event> take(std::unique_lock<std::mutex>&) {
    std::vector<choice_event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<choice_event> events_;
  int accepted_ = 0;
  bool hung_up_ = false;
  std::string refusal_;
};

// One choice to run: the tokens, the sampling, and where its events go.
struct job {
  std::vector<zipage::token_id> prompt;
  zipage::sampling_params params;
  // params.bad_words encoded and params.guided compiled, as the server did to check them (shared by the request's
  // choices), so the engine does not do it again on its thread; each part null when the request has none.
  zipage::prepared_request prepared;
  int choice = 0;
};

// The engine behind a small virtual interface, so the HTTP side is compiled once and not per policy.
class engine_driver {
 public:
  virtual ~engine_driver() = default;
  virtual zipage::request_id add(std::vector<zipage::token_id> prompt, const zipage::sampling_params& p,
                                 const zipage::prepared_request& prepared) = 0;
  virtual bool cancel(zipage::request_id id) = 0;
  virtual std::vector<zipage::step_event> step() = 0;
  virtual bool has_unfinished() const = 0;
  virtual zipage::request_output take(zipage::request_id id) = 0;
  virtual std::optional<float> last_logprob(zipage::request_id id) const = 0;
  virtual std::vector<zipage::token_logprob> last_top_logprobs(zipage::request_id id) const = 0;
  virtual zipage::engine_stats stats() const = 0;
};

template <class Engine>
class driver_for final : public engine_driver {
 public:
  explicit driver_for(Engine& eng) : eng_(eng) {}
  zipage::request_id add(std::vector<zipage::token_id> prompt, const zipage::sampling_params& p,
                         const zipage::prepared_request& prepared) override {
    return eng_.add_request(std::move(prompt), p, prepared);
  }
  bool cancel(zipage::request_id id) override { return eng_.cancel(id); }
  std::vector<zipage::step_event> step() override { return eng_.step(); }
  bool has_unfinished() const override { return eng_.has_unfinished(); }
  zipage::request_output take(zipage::request_id id) override { return eng_.take_output(id); }
  std::optional<float> last_logprob(zipage::request_id id) const override {
    const auto& lp = eng_.request(id).logprobs;
    return lp.empty() ? std::nullopt : std::optional<float>(lp.back());
  }
  std::vector<zipage::token_logprob> last_top_logprobs(zipage::request_id id) const override {
    const auto& top = eng_.request(id).top_logprobs;
    return top.empty() ? std::vector<zipage::token_logprob>{} : top.back();
  }
  zipage::engine_stats stats() const override { return eng_.stats(); }

 private:
  Engine& eng_;
};

// Delivers batches of events to their channels on a thread of its own, in the order they were posted (so a
// request's tokens, and its end after them, arrive in order). Drains everything posted before it stops.
class event_dispatcher {
 public:
  struct delivery {
    std::shared_ptr<channel> ch;
    choice_event event;
  };
  event_dispatcher() : thread_([this] { loop(); }) {}
  ~event_dispatcher() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  event_dispatcher(const event_dispatcher&) = delete;
  event_dispatcher& operator=(const event_dispatcher&) = delete;

  void post(std::vector<delivery> batch) {
    if (batch.empty()) return;
    {
      std::lock_guard lock(m_);
      batches_.push_back(std::move(batch));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::deque<std::vector<delivery>> todo;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stop_ || !batches_.empty(); });
        if (batches_.empty()) return;  // stopping, and everything posted was delivered
        todo.swap(batches_);
      }
      for (auto& batch : todo)
        for (auto& d : batch) d.ch->push(std::move(d.event));
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::vector<delivery>> batches_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members above exist
};

class engine_service {
 public:
  engine_service(engine_driver& driver, server_metrics& metrics) : driver_(driver), metrics_(metrics) {
    metrics_.engine = driver_.stats();
  }
  ~engine_service() { stop(); }

  void start() { thread_ = std::thread([this] { loop(); }); }

  // Cancels whatever is still running and joins the engine thread.
  void stop() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Queues every choice of one HTTP request; the engine thread settles `ch` (accepted, or refused with the
  // engine's reason) before it runs a step with them. `arrival` is when the HTTP request came in.
  void submit(std::shared_ptr<channel> ch, std::vector<job> jobs, clock_type::time_point arrival) {
    {
      std::lock_guard lock(m_);
      submissions_.push_back({std::move(ch), std::move(jobs), arrival});
    }
    cv_.notify_all();
  }

  // Cancels every choice of the request that owns `ch` (its client went away); each gets a "cancelled" end.
  void cancel(const std::shared_ptr<channel>& ch) {
    {
      std::lock_guard lock(m_);
      cancels_.push_back(ch);
    }
    cv_.notify_all();
  }

  // Cancels every request in flight (shutdown past its timeout).
  void cancel_all() {
    {
      std::lock_guard lock(m_);
      cancel_all_ = true;
    }
    cv_.notify_all();
  }

  // Choices accepted and not yet finished (running, waiting or swapped), for the queue bound.
  [[nodiscard]] int active_choices() const { return active_.load(); }
  // Reserves `n` choices if the total stays within `limit`; false otherwise.
  bool reserve(int n, int limit) {
    int cur = active_.load();
    while (cur + n <= limit)
      if (active_.compare_exchange_weak(cur, cur + n)) return true;
    return false;
  }
  void release(int n) { active_ -= n; }

 private:
  struct submission {
    std::shared_ptr<channel> ch;
    std::vector<job> jobs;
    clock_type::time_point arrival;
  };
  struct running {
    std::shared_ptr<channel> ch;
    int choice = 0;
    bool logprobs = false;
    int top_logprobs = 0;
    clock_type::time_point arrival, last_token;
    bool has_token = false;
  };

  void loop() {
    for (;;) {
      std::vector<submission> subs;
      std::vector<std::shared_ptr<channel>> cancels;
      bool all = false, stopping = false;
      {
        std::unique_lock lock(m_);
        if (!driver_.has_unfinished())
          cv_.wait(lock, [&] { return stop_ || cancel_all_ || !submissions_.empty() || !cancels_.empty(); });
        subs.swap(submissions_);
        cancels.swap(cancels_);
        all = std::exchange(cancel_all_, false) || stop_;
        stopping = stop_;
      }
      for (auto& s : subs) admit(s);
      for (auto& ch : cancels) cancel_channel(ch.get());
      if (all) cancel_channel(nullptr);
      if (stopping) {
        dispatcher_.post(std::exchange(outbox_, {}));
        publish_stats();
        return;
      }
      if (driver_.has_unfinished()) {
        std::vector<zipage::step_event> events;
        try {
          events = driver_.step();
        } catch (const std::exception& e) {
          // An engine failure fails every request in flight; the server keeps answering (503s would follow).
          fail_all(e.what());
        }
        const auto now = clock_type::now();
        {
          // One metrics lock per step, not per event.
          std::lock_guard lock(metrics_.mutex);
          for (auto& ev : events) route(ev, now);
        }
      }
      dispatcher_.post(std::exchange(outbox_, {}));
      publish_stats();
    }
  }

  void admit(submission& s) {
    std::vector<zipage::request_id> added;
    try {
      for (auto& j : s.jobs) {
        const bool lp = j.params.logprobs;
        const int top = j.params.top_logprobs;
        const zipage::request_id id = driver_.add(std::move(j.prompt), j.params, j.prepared);
        added.push_back(id);
        live_.emplace(id, running{s.ch, j.choice, lp, top, s.arrival, s.arrival, false});
      }
    } catch (const std::exception& e) {
      for (auto id : added) {
        driver_.cancel(id);
        (void)driver_.take(id);
        live_.erase(id);
      }
      release(static_cast<int>(s.jobs.size()));
      s.ch->settle(-1, e.what());
      return;
    }
    s.ch->settle(1);
  }

  // Cancels the choices of `ch` (every choice when null).
  void cancel_channel(const channel* ch) {
    for (auto it = live_.begin(); it != live_.end();) {
      if (ch != nullptr && it->second.ch.get() != ch) {
        ++it;
        continue;
      }
      driver_.cancel(it->first);
      const auto out = driver_.take(it->first);
      choice_event e;
      e.choice = it->second.choice;
      e.finished = true;
      e.finish_reason = "cancelled";
      e.final_text = out.text;
      e.completion_tokens = static_cast<int>(out.output.size());
      outbox_.push_back({it->second.ch, std::move(e)});
      {
        std::lock_guard lock(metrics_.mutex);
        ++metrics_.cancelled;
      }
      release(1);
      it = live_.erase(it);
    }
  }

  void fail_all(const std::string& what) {
    for (auto& [id, r] : live_) {
      driver_.cancel(id);
      (void)driver_.take(id);
      choice_event e;
      e.choice = r.choice;
      e.finished = true;
      e.finish_reason = "error";
      e.error = "engine failure: " + what;
      outbox_.push_back({r.ch, std::move(e)});
      release(1);
    }
    live_.clear();
  }

  // One step event into the outbox; the caller holds metrics_.mutex.
  void route(const zipage::step_event& ev, clock_type::time_point now) {
    const auto it = live_.find(ev.id);
    if (it == live_.end()) return;
    running& r = it->second;
    choice_event e;
    e.choice = r.choice;
    e.token = ev.token;
    e.text = ev.text;
    e.token_text = ev.token_text;
    if (r.logprobs && ev.reason != zipage::finish_reason::error) e.logprob = driver_.last_logprob(ev.id);
    if (r.top_logprobs > 0 && ev.reason != zipage::finish_reason::error) e.top_logprobs = driver_.last_top_logprobs(ev.id);
    if (ev.reason != zipage::finish_reason::error) {
      if (!r.has_token) metrics_.ttft.observe(std::chrono::duration<double>(now - r.arrival).count());
      else metrics_.itl.observe(std::chrono::duration<double>(now - r.last_token).count());
    }
    if (ev.finished) metrics_.e2e.observe(std::chrono::duration<double>(now - r.arrival).count());
    r.has_token = true;
    r.last_token = now;
    if (ev.finished) {
      const auto out = driver_.take(ev.id);
      e.finished = true;
      e.final_text = out.text;
      e.completion_tokens = static_cast<int>(out.output.size());
      e.stop_reason = out.stop_reason;
      switch (out.reason) {
        case zipage::finish_reason::length: e.finish_reason = "length"; break;
        case zipage::finish_reason::error:
          e.finish_reason = "error";
          e.error = out.error_message;
          break;
        default: e.finish_reason = "stop"; break;
      }
      if (e.finish_reason == "length") ++metrics_.finished_length;
      else if (e.finish_reason == "stop") ++metrics_.finished_stop;
      else ++metrics_.finished_error;
      outbox_.push_back({r.ch, std::move(e)});
      release(1);
      live_.erase(it);
      return;
    }
    outbox_.push_back({r.ch, std::move(e)});
  }

  void publish_stats() {
    const auto st = driver_.stats();
    std::lock_guard lock(metrics_.mutex);
    metrics_.engine = st;
  }

  engine_driver& driver_;
  server_metrics& metrics_;
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<submission> submissions_;
  std::vector<std::shared_ptr<channel>> cancels_;
  bool cancel_all_ = false;
  bool stop_ = false;
  std::atomic<int> active_{0};
  std::unordered_map<zipage::request_id, running> live_;  // engine thread only
  std::vector<event_dispatcher::delivery> outbox_;         // engine thread only: this step's events
  event_dispatcher dispatcher_;
};

}  // namespace zipage_serve
