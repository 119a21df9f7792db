#pragma once
// The synchronisation rules of the warp-specialised wgmma prefill kernel (paged_prefill_wgmma_kernel,
// prefill_wgmma.cuh), as plain constexpr functions: the kernel calls them, and tests/unit/test_ws_protocol.cpp
// runs them on the host against a model of the barriers under random interleavings (no deadlock, no stage
// refilled while it is read, no named-barrier arrival banked or left over). No CUDA header here.
//
// Roles: a producer fills K/V stage it % stages for step it; consumers 0 and 1 read every step.
//  * mbarrier full[stage]: one phase per step put there (the producer's arrivals); consumers wait on it;
//  * mbarrier empty[stage]: one phase per step read there (every consumer warp arrives); the producer waits on it
//    before refilling the stage;
//  * named barriers 1 and 2: consumer c's turn on the tensor cores is barrier 1 + c; a consumer syncs on its own
//    barrier before each turn (turns()) and then arrives on the other's.
namespace zipage::cuda::ws_protocol {

// The stage step `it` uses.
[[nodiscard]] constexpr int stage_of(int it, int stages) { return it % stages; }

// The parity of the `full` phase that completes when step `it` has landed (a fresh mbarrier is in phase 0).
[[nodiscard]] constexpr unsigned full_parity(int it, int stages) { return static_cast<unsigned>(it / stages) & 1u; }

// Whether the producer waits before putting step `it` in its stage (the stage held step it - stages), and the
// parity of the `empty` phase it waits for: the release of step it - stages.
[[nodiscard]] constexpr bool producer_waits(int it, int stages) { return it >= stages; }
[[nodiscard]] constexpr unsigned empty_parity(int it, int stages) {
  return static_cast<unsigned>(it / stages - 1) & 1u;
}

// Turns each consumer takes on the tensor cores over `nsteps` steps: one per step (FlashAttention-3's
// intra-warpgroup overlap: the S of the step with the P.V of the step before) and a last one for the last step's P.V.
[[nodiscard]] constexpr int turns(int nsteps) { return nsteps <= 0 ? 0 : nsteps + 1; }
// Consumer 1 gives consumer 0 the first turn with one arrival before its loop ...
[[nodiscard]] constexpr bool opens_turns(int consumer, int nturns) { return consumer == 1 && nturns > 0; }
// ... and does not hand over after its last turn, so that every arrival is matched by a sync.
[[nodiscard]] constexpr bool hands_over(int consumer, int turn, int nturns) {
  return !(consumer == 1 && turn == nturns - 1);
}

// The step whose stage a consumer releases at the end of step `it` (-1: none): the step before, whose V this step's
// P.V turn reads. The last step's stage is released after the last turn.
[[nodiscard]] constexpr int released_after_step(int it) { return it - 1; }

}  // namespace zipage::cuda::ws_protocol
