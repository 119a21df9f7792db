// The warp-specialised wgmma prefill kernel's synchronisation rules (backend/cuda/ws_protocol.hpp, the functions
// the kernel calls) run on the host against a model of its barriers, one warpgroup per role, under random
// interleavings: every schedule finishes (no deadlock), a consumer always finds the step it waits for in its stage,
// the producer never refills a stage a consumer still reads, no mbarrier wait is two phases behind, and the named
// barriers never bank two arrivals nor keep one at the end; with the intra-warpgroup overlap's one turn per step
// (S of the step, P.V of the step before) and a last one. The device runs the same
// protocol on plain data in test_cuda_wgmma ("warp specialisation: ...").
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "zipage/backend/cuda/ws_protocol.hpp"

namespace {

namespace wp = zipage::cuda::ws_protocol;

struct mbarrier {
  int phase = 0;  // phases completed so far
  int count = 0;
  int expected = 1;
  void arrive() {
    if (++count == expected) {
      count = 0;
      ++phase;
    }
  }
  // try_wait.parity: true once the phase of that parity before the current one has completed.
  [[nodiscard]] bool done(unsigned parity) const { return (static_cast<unsigned>(phase) & 1u) != parity; }
};

struct model {
  int steps, stages;
  std::array<int, 2> consumer_steps;
  std::vector<mbarrier> full, empty;
  std::vector<int> stage_step;             // the step a stage holds, -1 while its copies are in flight
  std::vector<std::array<bool, 2>> reads;  // consumer c is reading stage s
  std::array<int, 3> banked{};             // named barriers 1 and 2: arrivals not yet matched by a sync
  std::string error;

  model(int n, int s, std::array<int, 2> work)
      : steps(n), stages(s), consumer_steps(work), full(s), empty(s), stage_step(s, -1), reads(s, {false, false}) {
    for (auto& b : empty) b.expected = 2;  // both consumers (each consumer's warps count as one here)
  }

  void fail(const std::string& what) {
    if (error.empty()) error = what;
  }
  // The awaited phase (number `phase`) must be the barrier's last completed one, not an older one.
  void check_not_behind(const mbarrier& b, int phase, const char* name) {
    if (b.phase != phase + 1) fail(std::string(name) + " wait is more than one phase behind");
  }
  void arrive_turn(int barrier) {
    if (++banked[static_cast<std::size_t>(barrier)] > 1) fail("a named barrier banked two arrivals");
  }
  bool sync_turn(int barrier) {
    if (banked[static_cast<std::size_t>(barrier)] == 0) return false;
    --banked[static_cast<std::size_t>(barrier)];
    return true;
  }
};

// One role as a resumable sequence of actions: step() performs the next action if it can (returns false when
// blocked).
struct producer {
  int it = 0, pc = 0;
  bool finished(const model& m) const { return it >= m.steps; }
  bool step(model& m) {
    const int st = wp::stage_of(it, m.stages);
    switch (pc) {
      case 0:  // wait until the stage's previous step is released
        if (wp::producer_waits(it, m.stages)) {
          if (!m.empty[st].done(wp::empty_parity(it, m.stages))) return false;
          m.check_not_behind(m.empty[st], it / m.stages - 1, "empty");
        }
        if (m.reads[st][0] || m.reads[st][1]) m.fail("the producer refills a stage that is being read");
        m.stage_step[st] = -1;  // copies in flight
        pc = 1;
        return true;
      default:  // the copies land: full's arrival
        m.stage_step[st] = it;
        m.full[st].arrive();
        pc = 0;
        ++it;
        return true;
    }
  }
};

// A consumer's program, as the kernel runs it: open the turns, then per step wait for it, take its turns (a turn
// issues the products: S reads the step's stage, so a stage is being read from its S turn until its release) and
// release a stage.
struct consumer {
  enum class op { open, wait_full, turn, release };
  struct action {
    op what;
    int step = -1;  // wait_full / release: the step; turn: the step whose stage S starts reading (-1: none)
    int turn = -1;  // turn: its number
    int pv = -1;    // turn: the step whose V its P.V reads (-1: none)
  };
  int c;
  std::vector<action> program;
  std::size_t pc = 0;

  consumer(int which, int steps, int work_steps) : c(which) {
    const int nturns = wp::turns(steps);
    program.push_back({op::open});
    for (int it = 0; it < steps; ++it) {
      const int reads = it < work_steps ? it : -1;
      program.push_back({op::wait_full, it});
      // S(it) with P(it-1).V(it-1)
      program.push_back({op::turn, reads, it, it >= 1 && it - 1 < work_steps ? it - 1 : -1});
      const int released = wp::released_after_step(it);
      if (released >= 0) program.push_back({op::release, released});
    }
    if (steps > 0) {
      program.push_back({op::turn, -1, steps, steps - 1 < work_steps ? steps - 1 : -1});  // the last P.V
      program.push_back({op::release, steps - 1});
    }
    turns_total = nturns;
  }
  int turns_total = 0;

  bool finished(const model&) const { return pc >= program.size(); }
  bool step(model& m) {
    const action& x = program[pc];
    const int my = 1 + c, other = 1 + (c ^ 1);
    switch (x.what) {
      case op::open:
        if (wp::opens_turns(c, turns_total)) m.arrive_turn(other);
        break;
      case op::wait_full: {
        const int st = wp::stage_of(x.step, m.stages);
        if (!m.full[st].done(wp::full_parity(x.step, m.stages))) return false;
        m.check_not_behind(m.full[st], x.step / m.stages, "full");
        if (m.stage_step[st] != x.step) m.fail("a consumer finds another step in its stage");
        break;
      }
      case op::turn:
        if (!m.sync_turn(my)) return false;
        if (x.step >= 0) m.reads[wp::stage_of(x.step, m.stages)][c] = true;
        if (x.pv >= 0) {  // V of step x.pv: its stage must still hold it, and is read until released
          const int st = wp::stage_of(x.pv, m.stages);
          if (m.stage_step[st] != x.pv) m.fail("a P.V reads a stage that was refilled");
          m.reads[st][c] = true;
        }
        if (wp::hands_over(c, x.turn, turns_total)) m.arrive_turn(other);
        break;
      case op::release: {
        const int st = wp::stage_of(x.step, m.stages);
        if (m.reads[st][c] && m.stage_step[st] != x.step) m.fail("a stage changed while a consumer read it");
        m.reads[st][c] = false;
        m.empty[st].arrive();
        break;
      }
    }
    ++pc;
    return true;
  }
};

std::string run(int steps, int stages, std::array<int, 2> work, unsigned seed) {
  model m(steps, stages, work);
  producer p;
  std::array<consumer, 2> cs{consumer(0, steps, work[0]), consumer(1, steps, work[1])};
  std::mt19937 rng(seed);
  for (int moves = 0; m.error.empty(); ++moves) {
    std::vector<int> runnable;
    if (!p.finished(m)) runnable.push_back(0);
    for (int c = 0; c < 2; ++c)
      if (!cs[static_cast<std::size_t>(c)].finished(m)) runnable.push_back(1 + c);
    if (runnable.empty()) break;
    // Try the roles in a random order; if none can move, the schedule is stuck.
    std::shuffle(runnable.begin(), runnable.end(), rng);
    bool moved = false;
    for (int r : runnable) {
      moved = r == 0 ? p.step(m) : cs[static_cast<std::size_t>(r - 1)].step(m);
      if (moved) break;
    }
    if (!moved) return "deadlock";
    if (moves > 1000000) return "no end";
  }
  if (!m.error.empty()) return m.error;
  if (m.banked[1] != 0 || m.banked[2] != 0) return "a named-barrier arrival is left at the end";
  return "ok";
}

}  // namespace

TEST_CASE("ws_protocol: stage hand-over and consumer turns finish and never race, for every step count") {
  int schedules = 0;
  for (const int stages : {3, 4})
    for (int steps = 0; steps <= 13; ++steps)
      for (int w0 = 0; w0 <= steps; ++w0)
        for (int w1 = 0; w1 <= steps; ++w1) {
          if (std::max(w0, w1) != steps) continue;  // the kernel's step count is the longer consumer's
          for (unsigned seed = 0; seed < 12; ++seed) {
            CAPTURE(stages);
            CAPTURE(steps);
            CAPTURE(w0);
            CAPTURE(w1);
            CAPTURE(seed);
            const std::string r = run(steps, stages, {w0, w1}, seed);
            if (r != "ok") {
              CHECK(r == "ok");
              return;
            }
            ++schedules;
          }
        }
  MESSAGE(schedules, " schedules");
  CHECK(schedules > 1000);
}

TEST_CASE("ws_protocol: a wrong rule is caught (the model can fail)") {
  // Without consumer 1's opening arrival consumer 0 never gets its first turn (the deadlock run() reports).
  model m(3, 3, {3, 3});
  consumer c0(0, 3, 3);
  CHECK(c0.step(m));        // consumer 0 opens nothing
  CHECK_FALSE(c0.step(m));  // step 0 has not landed
  producer p;
  CHECK(p.step(m));
  CHECK(p.step(m));
  CHECK(c0.step(m));        // step 0 has landed
  CHECK_FALSE(c0.step(m));  // its turn never comes: consumer 1 has not arrived
  // A stage read past its release is reported.
  model m2(4, 1, {4, 4});
  m2.reads[0][0] = true;
  producer p2;
  p2.it = 1;
  m2.empty[0].phase = 1;  // step 0 released (as far as the barrier knows)
  CHECK(p2.step(m2));
  CHECK(m2.error == "the producer refills a stage that is being read");
}
