#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "zipage/block/block_pool.hpp"
#include "zipage/kv/block_manager.hpp"
#include "zipage/kv/block_table.hpp"

using namespace zipage;

TEST_CASE("block_pool hands out distinct blocks until exhausted") {
  block_pool pool(4);
  CHECK(pool.num_free() == 4);
  std::set<block_id> seen;
  for (int i = 0; i < 4; ++i) seen.insert(pool.allocate());
  CHECK(seen.size() == 4);
  CHECK(pool.num_free() == 0);
  CHECK_FALSE(pool.can_allocate(1));
  CHECK_THROWS_AS((void)pool.allocate(), zipage::error);
  CHECK_THROWS_WITH_AS((void)pool.allocate(2), "block_pool: asked for 2 blocks, 0 free", zipage::error);
  CHECK(pool.peak_used() == 4);
}

TEST_CASE("block_pool reference counts: a block is freed by its last release") {
  block_pool pool(2);
  const block_id b = pool.allocate();
  pool.retain(b);
  CHECK(pool.ref_count(b) == 2);
  pool.release(b);
  CHECK(pool.ref_count(b) == 1);
  CHECK(pool.num_free() == 1);
  pool.release(b);
  CHECK(pool.ref_count(b) == 0);
  CHECK(pool.num_free() == 2);
  CHECK(pool.total_references() == 0);
  CHECK_THROWS_AS(pool.release(b), zipage::error);  // double free is caught
  CHECK_THROWS_AS(pool.retain(b), zipage::error);   // retaining a free block is caught
  CHECK_THROWS_AS(pool.release(7), zipage::error);  // out of range
}

TEST_CASE("block_pool reuses the longest-free block first") {
  block_pool pool(3);
  const auto blocks = pool.allocate(3);
  pool.release(blocks[1]);
  pool.release(blocks[0]);
  CHECK(pool.allocate() == blocks[1]);
  CHECK(pool.allocate() == blocks[0]);
}

TEST_CASE("block_pool rejects an empty pool") { CHECK_THROWS_AS(block_pool(0), zipage::error); }

TEST_CASE("block_table maps physical slots to pool slots") {
  block_table t;
  t.push_back(5);
  t.push_back(2);
  CHECK(t.slot(0, 4) == 20);
  CHECK(t.slot(3, 4) == 23);
  CHECK(t.slot(4, 4) == 8);
  CHECK(t.slot(7, 4) == 11);
  CHECK_THROWS_AS((void)t.slot(8, 4), zipage::error);
  CHECK(blocks_for_tokens(0, 4) == 0);
  CHECK(blocks_for_tokens(1, 4) == 1);
  CHECK(blocks_for_tokens(4, 4) == 1);
  CHECK(blocks_for_tokens(5, 4) == 2);
}

TEST_CASE("block_manager allocates a prompt, then a block only at each boundary") {
  block_pool pool(8);
  block_manager bm(pool, 4);
  sequence s;
  s.tokens = {1, 2, 3, 4, 5};
  s.prompt_len = 5;
  CHECK(bm.blocks_needed(s) == 2);
  REQUIRE(bm.can_allocate(s));
  bm.allocate(s);
  CHECK(s.table.num_blocks() == 2);
  s.num_computed = s.kv_len = 5;
  for (int next = 6; next <= 9; ++next) {  // tokens 6..8 fit the second block, token 9 needs a third
    s.tokens.push_back(next);
    bm.may_append(s);
    CHECK(s.table.num_blocks() == (next <= 8 ? 2 : 3));
    s.num_computed = s.kv_len = next;
  }
  bm.deallocate(s);
  CHECK(s.table.empty());
  CHECK(pool.num_free() == 8);
  CHECK(pool.total_references() == 0);
}
