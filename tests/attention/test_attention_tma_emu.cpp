// CPU model of the mbarrier / TMA pipeline of the Hopper flash attention
// kernel version 5 (kernels/attention/attention_flash_tma_sm90.cu), label
// cpu. The schedules are the kernel's own (fp_tma::producer_schedule and
// consumer_schedule of attention_tma_sm90.h, with the kernel's stage /
// phase / barrier-offset functions), instantiated with recorders; the
// recorded operations then run, interleaved at random, on a model of the
// hardware written here from the PTX ISA text, independently of the header:
//   mbarrier (PTX ISA "Parallel Synchronization and Communication
//   Instructions: mbarrier"): a phase completes when its pending arrival
//   count and its tx-count are both zero; then the pending count is reset to
//   the expected count and the phase advances. expect-tx adds to tx-count,
//   complete-tx (TMA delivering bytes) subtracts. try_wait.parity P answers
//   true when the phase of parity P, i.e. the one before the current
//   (incomplete) phase, has completed: (current phase & 1) != P.
//   cp.async.bulk.tensor: each box lands at some later time, then performs
//   complete-tx of its bytes (box[0] x box[1] x 2 from the tensor map) on
//   its barrier.
//   wgmma: an issued group reads its shared-memory stage until a
//   wait_group retires it (groups retire in order; wait_group N leaves the
//   N newest).
// Checks over many tile counts, stage counts, one or two consumer
// warpgroups and random interleavings: no consumer issues a wgmma on a stage
// before it waited on the stage's full barrier for that very fill, and the
// phase it waited for completed with exactly the tile's bytes, all of which
// belong to the tile it expects; the producer never issues a load into a
// stage that a consumer has not released (waited on, retired its wgmmas,
// arrived); a consumer never releases a stage a wgmma still reads; every
// successful wait saw exactly the phase it meant (no parity aliasing: the
// barrier never ran two phases ahead); no deadlock; and at the end every
// barrier is at rest (pending = expected, tx 0), nothing in flight, every
// stage released. Then deliberately broken variants (wrong parity, wrong
// byte count, early release, wrong arrival count, a ring without phase
// flips, wrong stage) must each be caught.
// v8's schedule (fp_tma::consumer_schedule_turns: the two consumer
// warpgroups take turns issuing their wgmmas) runs on the same model plus
// named barriers (PTX ISA "bar.sync / bar.arrive": a phase completes when
// its thread count has arrived; bar.sync waits for that, bar.arrive does
// not): on top of the checks above, every wgmma is issued inside its
// warpgroup's turn, the turns alternate (0, 1, 0, 1, ...: never two
// warpgroups in a turn at once), and every named barrier is at rest at
// exit. Its broken variants (no first turn handed over, the turn passed to
// oneself, a pass after the last warpgroup's last issue) must be caught too.
// v10's (the same schedule with three consumer warpgroups, the turn going
// round 0, 1, 2, 0, ...; one, two or three of them active) runs on the same
// model and checks, at head_dim 64 (its only one).
// v9's (fp_tma::producer_items / consumer_items: persistent CTAs, the K / V
// ring running on across a CTA's items, tickets through a two-slot ring
// guarded by item_full / item_empty mbarriers, Q double-buffered) runs on
// random item sequences (items without key tiles, without work): every
// consumer reads exactly the ticket the producer published for that draw,
// no slot is overwritten before both warpgroups read it, each item's
// wgmmas read its own tiles (tile ids tagged by ticket), its Q from the
// buffer its Q was loaded into, and the ring and turn checks above hold
// over the whole sequence. Broken variants: a publish without the empty
// wait, a read without the full wait, a producer that starts the ring over
// at each item, consumers reading the next ticket at an item's start while
// the producer draws it later (fp_tma::draw_tile). The order the tickets
// walk (fp_tma::order_item) is checked as a bijection, longest first per
// section, and for its balance.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention_tma_sm90.h"
#include "attn_emu_util.h"

static int g_failures = 0;

// ---- the recorded schedule ---------------------------------------------------

enum op_kind {
    OP_WAIT, OP_ARRIVE, OP_ARRIVE_TX, OP_TMA, OP_QK, OP_PV, OP_WGMMA_WAIT, OP_NB_SYNC, OP_NB_ARRIVE,
    OP_ITEM_ARRIVE, // v9: an arrival on an item barrier (the producer's publish, a consumer's read)
    OP_PUBLISH,     // v9: the producer stores a ticket in a slot
    OP_READ         // v9: a consumer loads a ticket from a slot
};
struct op {
    op_kind kind;
    int bar;    // barrier id (WAIT, ARRIVE*, TMA, ITEM_ARRIVE); named barrier id (NB_*); slot (PUBLISH, READ)
    int arg;    // parity (WAIT), arrivals (ARRIVE, ITEM_ARRIVE), bytes (ARRIVE_TX), stage (TMA, QK, PV),
                // N (WGMMA_WAIT), threads (NB_*), ticket (PUBLISH; READ: the one the consumer must see)
    int tile;   // TMA: tile id; WAIT: the tile id the kernel says it waits for (-1 producer, item barriers)
    int box;    // TMA: box index
    bool is_v;  // TMA / QK / PV / barrier family
};

// Deliberate bugs, applied by the recorders (the schedules stay the
// kernel's): each must make the model fail.
enum bug {
    BUG_NONE,
    BUG_PRODUCER_PARITY,  // producer waits empty with the consumers' parity
    BUG_CONSUMER_PARITY,  // consumer waits full with the producer's parity
    BUG_EXPECT_HALF,      // expect_tx of half the tile's bytes
    BUG_EARLY_RELEASE_K,  // K released right after Q K^T is issued (before its wait)
    BUG_EMPTY_COUNT,      // empty barriers expect one warpgroup's arrivals with two active
    BUG_NO_PHASE_FLIP,    // every wait uses parity 0 / 1 as if each stage were used once
    BUG_STAGE_SHIFT,      // consumer reads V from the next stage
    BUG_TURN_NO_START,    // (turns) the last warpgroup does not hand warpgroup 0 the first turn
    BUG_TURN_SELF,        // (turns) a warpgroup passes the turn to itself
    BUG_TURN_LAST_PASS,   // (turns) the last warpgroup passes the turn after its last issue too
    BUG_TURN_TWO_WAY,     // (turns, v10) v8's hand-over (to 1 - cw) with three warpgroups
    BUG_ITEM_NO_EMPTY,    // (v9) the producer publishes a ticket without waiting for the slot's readers
    BUG_ITEM_NO_FULL,     // (v9) a consumer reads a ticket slot without waiting for it
    BUG_RING_RESTART,     // (v9) the producer starts the K / V ring over at each item
    BUG_READ_EARLY,       // (v9) the consumers read the next ticket at an item's start, drawn later
    BUG_COUNT
};
static const char *bug_name[BUG_COUNT] = {"none",          "producer parity", "consumer parity",
                                          "expect_tx half", "early K release", "empty count",
                                          "no phase flip", "stage shift",     "turn: no start",
                                          "turn: to itself", "turn: last pass", "turn: two-way",
                                          "item: no empty wait", "item: no full wait", "ring restart",
                                          "item: read early"};
static bool turn_bug(int b) { return b >= BUG_TURN_NO_START; }
static bool item_bug(int b) { return b >= BUG_ITEM_NO_EMPTY; }
static bool three_wg_bug(int b) { return b == BUG_TURN_TWO_WAY; } // harmless with two warpgroups

// v9's items as the model runs them: ticket t's key tiles [begin, end)
// (none: a no-work item), and the CTA's ticket sequence (the last one >=
// the number of items: the end). Tile ids are ticket * kTileTag + t, so a
// stage holding the same tile index of another item is told apart.
constexpr int kTileTag = 1000;
struct item_plan {
    int begin, end;
    bool work;
};
struct items_cfg {
    std::vector<item_plan> items; // by ticket
    std::vector<int> tickets;     // the CTA's draws, in order, ending with one >= items.size()
    int lead = 0;                 // tile_order::lead: the draw's tile (fp_tma::draw_tile)
};

template <int D> struct ids {
    static constexpr int S = fp_tma::traits_v5<D>::kStages;
    // Barrier id from the kernel's byte offsets (8 bytes each): distinct
    // offsets give distinct ids, a collision would merge barriers. v9's
    // layout (two Q buffers) is checked to place the ring's barriers alike.
    static int bar(int kind, int stage) {
        return (int)((fp_tma::bar_offset<D>(kind, stage) - fp_tma::bar_offset<D>(0, 0)) / 8);
    }
    static int bar_v9(int kind, int stage) {
        return (int)((fp_tma::bar_offset<D, 2>(kind, stage) - fp_tma::bar_offset<D, 2>(0, 0)) / 8);
    }
    // v9's item barriers (BAR_ITEM_FULL / BAR_ITEM_EMPTY, slot 0 / 1), after the ring's
    static int item_bar(int kind, int slot) {
        return (int)((fp_tma::item_bar_offset<D>(kind, slot) - fp_tma::bar_offset<D, 2>(0, 0)) / 8);
    }
};

template <int D> struct producer_rec {
    std::vector<op> ops;
    bug b;
    uint32_t box_bytes; // per box, from the tensor map's box
    int tag = 0;        // the current item's ticket (v9), tile ids tag * kTileTag + t
    int local = 0;      // loads of K / V pairs in the current item (BUG_RING_RESTART)
    void wait_empty_k(int st, uint32_t par) { wait(fp_tma::BAR_EMPTY_K, st, par); }
    void wait_empty_v(int st, uint32_t par) { wait(fp_tma::BAR_EMPTY_V, st, par); }
    void restart(int &st, uint32_t &par) const { // as if the item's first load were the ring's first
        st = fp_tma::ring_stage(local, ids<D>::S);
        par = fp_tma::empty_parity(local, ids<D>::S);
    }
    void wait(int kind, int st, uint32_t par) {
        if (b == BUG_PRODUCER_PARITY) par ^= 1u;
        if (b == BUG_NO_PHASE_FLIP) par = 1u;
        if (b == BUG_RING_RESTART) restart(st, par);
        ops.push_back({OP_WAIT, ids<D>::bar(kind, st), (int)par, -1, 0, kind == fp_tma::BAR_EMPTY_V});
    }
    void load(int kind, int st, int t) {
        const bool v = kind == fp_tma::BAR_FULL_V;
        uint32_t bytes = fp_tma::stage_tx_bytes<D>();
        if (b == BUG_EXPECT_HALF) bytes /= 2;
        if (b == BUG_RING_RESTART) {
            uint32_t par;
            restart(st, par);
        }
        ops.push_back({OP_ARRIVE_TX, ids<D>::bar(kind, st), (int)bytes, tag * kTileTag + t, 0, v});
        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c)
            ops.push_back({OP_TMA, ids<D>::bar(kind, st), st, tag * kTileTag + t, c, v});
        if (v) ++local;
    }
    void load_k(int st, int t) { load(fp_tma::BAR_FULL_K, st, t); }
    void load_v(int st, int t) { load(fp_tma::BAR_FULL_V, st, t); }
    // v9's items (fp_tma::producer_items)
    const items_cfg *cfg = nullptr;
    size_t drawn = 0;
    int first_ticket() { return cfg->tickets[drawn++]; }
    int next_ticket() { return cfg->tickets[drawn++]; }
    bool valid(int t) const { return t < (int)cfg->items.size(); }
    int lead() const { return cfg->lead; }
    void wait_item_empty(int s, uint32_t par) {
        if (b == BUG_ITEM_NO_EMPTY) return;
        ops.push_back({OP_WAIT, ids<D>::item_bar(fp_tma::BAR_ITEM_EMPTY, s), (int)par, -1, 0, false});
    }
    void publish(int s, int t) {
        ops.push_back({OP_PUBLISH, s, t, -1, 0, false});
        ops.push_back({OP_ITEM_ARRIVE, ids<D>::item_bar(fp_tma::BAR_ITEM_FULL, s), 1, -1, 0, false});
    }
    bool item(int t, int *sb, int *se) {
        const item_plan &it = cfg->items[(size_t)t];
        if (!it.work) return false;
        tag = t;
        local = 0;
        *sb = it.begin;
        *se = it.end;
        return true;
    }
    bool finished = false;
    void done() { finished = true; }
};

template <int D> struct consumer_rec {
    std::vector<op> ops;
    bug b;
    int cw = 0;          // consumer warpgroup (turns)
    int nturn = 0;       // warpgroups taking turns
    bool synced = false; // has waited for a turn
    int tag = 0;         // the current item's ticket (v9)
    void wait(int kind, int st, uint32_t par, int t) {
        if (b == BUG_CONSUMER_PARITY) par ^= 1u;
        if (b == BUG_NO_PHASE_FLIP) par = 0u;
        ops.push_back({OP_WAIT, ids<D>::bar(kind, st), (int)par, tag * kTileTag + t, 0, kind == fp_tma::BAR_FULL_V});
    }
    void wait_full_k(int st, uint32_t par, int t) { wait(fp_tma::BAR_FULL_K, st, par, t); }
    void wait_full_v(int st, uint32_t par, int t) { wait(fp_tma::BAR_FULL_V, st, par, t); }
    void qk(int st) {
        ops.push_back({OP_QK, -1, st, 0, 0, false});
        if (b == BUG_EARLY_RELEASE_K) release(fp_tma::BAR_EMPTY_K, st);
    }
    void pv(int st) {
        if (b == BUG_STAGE_SHIFT) st = (st + 1) % ids<D>::S;
        ops.push_back({OP_PV, -1, st, 0, 0, true});
    }
    void wgmma_wait0() { ops.push_back({OP_WGMMA_WAIT, -1, 0, 0, 0, false}); }
    void wgmma_wait1() { ops.push_back({OP_WGMMA_WAIT, -1, 1, 0, 0, false}); }
    void release(int kind, int st) {
        ops.push_back({OP_ARRIVE, ids<D>::bar(kind, st), 128, 0, 0, kind == fp_tma::BAR_EMPTY_V});
    }
    void release_k(int st) {
        if (b != BUG_EARLY_RELEASE_K) release(fp_tma::BAR_EMPTY_K, st);
    }
    void release_v(int st) { release(fp_tma::BAR_EMPTY_V, st); }
    void softmax(int) {}
    void rescale_pack() {}
    void pack() {}
    void rescale() {}
    void nb_sync(int id, int n) {
        synced = true;
        ops.push_back({OP_NB_SYNC, id, n, 0, 0, false});
    }
    void nb_arrive(int id, int n) {
        if (b == BUG_TURN_NO_START && cw == nturn - 1 && !synced) return;
        if (b == BUG_TURN_SELF) id = fp_tma::turn_bar(cw);
        if (b == BUG_TURN_TWO_WAY && synced) id = fp_tma::turn_bar(1 - cw < 0 ? 0 : 1 - cw);
        ops.push_back({OP_NB_ARRIVE, id, n, 0, 0, false});
    }
    // v9's items (fp_tma::consumer_items)
    const items_cfg *cfg = nullptr;
    size_t reads = 0;
    bool valid(int t) const { return t < (int)cfg->items.size(); }
    int lead() const { return b == BUG_READ_EARLY ? 0 : cfg->lead; }
    int read_item(int s, uint32_t par) {
        const int t = cfg->tickets[reads++]; // what the producer published as this draw
        if (b != BUG_ITEM_NO_FULL)
            ops.push_back({OP_WAIT, ids<D>::item_bar(fp_tma::BAR_ITEM_FULL, s), (int)par, -1, 0, false});
        ops.push_back({OP_READ, s, t, -1, 0, false});
        ops.push_back({OP_ITEM_ARRIVE, ids<D>::item_bar(fp_tma::BAR_ITEM_EMPTY, s), 128, -1, 0, false});
        return t;
    }
    std::vector<int> q_loads; // Q buffer of each prefetch, and the buffers items read
    std::vector<int> q_uses;
    bool prefetch_q(int t, int qb, int *sb, int *se) {
        q_loads.push_back(qb);
        return peek_item(t, sb, se);
    }
    bool begin_item(int t, int qb, int *sb, int *se) {
        q_uses.push_back(qb);
        const item_plan &it = cfg->items[(size_t)t];
        if (!it.work) return false;
        tag = t;
        *sb = it.begin;
        *se = it.end;
        return true;
    }
    bool peek_item(int t, int *sb, int *se) const {
        const item_plan &it = cfg->items[(size_t)t];
        *sb = it.begin;
        *se = it.end;
        return it.work;
    }
    int chained = 0; // items begun inside the previous one's last iteration
    void begin_next(int t, int qb) {
        q_uses.push_back(qb);
        tag = t;
        ++chained;
    }
    int ended = 0;
    void end_item(bool) { ++ended; }
};

// ---- the hardware model ---------------------------------------------------------

struct mbarrier {
    int expected = 0, pending = 0;
    int64_t tx = 0;
    int64_t phase = 0;           // current (incomplete) phase number
    int64_t tx_in_phase = 0;     // complete-tx bytes of the current phase
    int64_t expect_in_phase = 0; // expect-tx bytes of the current phase
    std::vector<int64_t> done_bytes, done_expect; // per completed phase
    void init(int count) {
        expected = pending = count;
        tx = 0;
        phase = 0;
    }
    void complete_if_ready() {
        if (pending == 0 && tx == 0) {
            done_bytes.push_back(tx_in_phase);
            done_expect.push_back(expect_in_phase);
            tx_in_phase = expect_in_phase = 0;
            ++phase;
            pending = expected;
        }
    }
    void arrive(int n) {
        for (int i = 0; i < n; ++i) { // each thread's arrival on its own
            --pending;
            complete_if_ready();
        }
    }
    void expect_tx(int64_t bytes) {
        tx += bytes;
        expect_in_phase += bytes;
    }
    void complete_tx(int64_t bytes) {
        tx -= bytes;
        tx_in_phase += bytes;
        complete_if_ready();
    }
    bool try_wait_parity(int parity) const { return (phase & 1) != parity; }
};

struct stage_state {
    std::vector<int> box_tile;    // tile each box holds (-1 none)
    int in_flight = 0;            // boxes issued, not landed
    std::vector<int> holders;     // consumers that waited on this fill and have not released it
};

struct model_result {
    long violations = 0;
    bool deadlock = false;
    long steps = 0;
    std::string first;
};

// Runs the recorded ops of one producer and `nc` consumers with random
// interleaving (seed): a CTA's tiles [s_begin, s_end) (v5; turns: v8, and
// v10 with W = 3: up to three consumers), or, with `items` (v9: two
// consumers, turns), the CTA's items.
template <int D, int W = 2>
static model_result run_model(int s_begin, int s_end, int nc, bug b, uint64_t seed, bool turns,
                              const items_cfg *items = nullptr) {
    constexpr int S = fp_tma::traits_v5<D>::kStages;
    model_result R;
    auto fail = [&](const std::string &what) {
        if (!R.violations++) R.first = what;
    };
    // tensor-map box bytes, from the geometry the host encodes
    fp_tma::kv_map m;
    if (fp_tma::kv_map_geometry(0, D, 4096, 2, 2, 2 * D, D, 4096 * 2 * D, fp_tma::traits_v5<D>::kBc, &m) !=
        fp_tma::KV_MAP_OK) {
        fail("geometry refused");
        return R;
    }
    const int64_t box_bytes = (int64_t)m.box[0] * m.box[1] * m.box[2] * m.box[3] * 2;
    const int64_t tile_bytes = (int64_t)D * fp_tma::traits_v5<D>::kBc * 2;

    producer_rec<D> P;
    P.b = b;
    P.box_bytes = (uint32_t)box_bytes;
    P.cfg = items;
    // the tile ids every consumer must run, in order
    std::vector<int> expect;
    if (items) {
        for (size_t j = 0; j + 1 < items->tickets.size(); ++j) {
            const item_plan &it = items->items[(size_t)items->tickets[j]];
            if (it.work)
                for (int t = it.begin; t < it.end; ++t) expect.push_back(items->tickets[j] * kTileTag + t);
        }
        nc = 2;
        turns = true;
        for (int k = 0; k < 4; ++k) // v9's layout places the ring's barriers as v5's
            for (int x = 0; x < S; ++x)
                if (ids<D>::bar_v9(k, x) != ids<D>::bar(k, x)) fail("v9's ring barriers moved");
        fp_tma::producer_items<S>(P);
    } else {
        for (int t = s_begin; t < s_end; ++t) expect.push_back(t);
        fp_tma::producer_schedule<S>(s_begin, s_end, P);
    }
    // warpgroups taking turns, as the kernel passes it: v8 (W = 2) 2 or 0,
    // v10 the active ones (fewer than 2: none)
    const int nturn = !turns ? 0 : W == 2 ? (nc == 2 ? 2 : 0) : nc;
    std::vector<consumer_rec<D>> C(nc);
    for (int c = 0; c < nc; ++c) {
        C[c].b = b;
        C[c].cw = c;
        C[c].nturn = items ? 2 : nturn;
        C[c].cfg = items;
        if (items) {
            fp_tma::consumer_items<S>(c, C[c]);
            if (b == BUG_TURN_LAST_PASS && c == 1)
                C[c].ops.push_back({OP_NB_ARRIVE, fp_tma::turn_bar(0), fp_tma::kTurnThreads, 0, 0, false});
        } else if (turns) {
            fp_tma::consumer_schedule_turns<S, W>(s_begin, s_end, c, nturn, C[c]);
            if (b == BUG_TURN_LAST_PASS && nturn >= 2 && c == nturn - 1)
                C[c].ops.push_back({OP_NB_ARRIVE, fp_tma::turn_bar(0), fp_tma::kTurnThreads, 0, 0, false});
        } else {
            fp_tma::consumer_schedule<S>(s_begin, s_end, C[c]);
        }
    }
    // named barriers (v8's turns): threads arrived in the current phase,
    // its count, completed phases; per agent, the phase its bar.sync waits for
    struct named_bar {
        int arrived = 0, count = 0;
        int64_t phase = 0;
    };
    named_bar nb[16];
    std::vector<int64_t> nb_wait(1 + nc, -1); // -1: not inside a bar.sync
    int turn_owner = -1, last_turn = -1;
    long turns_taken = 0;
    // barriers: ids from the kernel's offsets; init as the kernel does (v9:
    // the item ring's four after the K / V ring's)
    const int nbar = 4 * S + (items ? 4 : 0);
    std::vector<mbarrier> bar(nbar);
    std::vector<int> seen(nbar, 0);
    for (int k = 0; k < 4; ++k)
        for (int s = 0; s < S; ++s) {
            const int id = ids<D>::bar(k, s);
            if (id < 0 || id >= nbar || seen[id]++) fail("barrier offsets collide");
        }
    if (items) {
        for (int k = fp_tma::BAR_ITEM_FULL; k <= fp_tma::BAR_ITEM_EMPTY; ++k)
            for (int s = 0; s < 2; ++s) {
                const int id = ids<D>::item_bar(k, s);
                if (id < 0 || id >= nbar || seen[id]++) fail("item barrier offsets collide");
            }
        // the ticket slots after every barrier, inside the shared memory the launch asks for
        if (fp_tma::item_slot_offset<D>(0) < fp_tma::item_bar_offset<D>(fp_tma::BAR_ITEM_EMPTY, 1) + 8 ||
            fp_tma::item_slot_offset<D>(1) + 4 + 1024 > fp_tma::smem_bytes_v9<D>() ||
            fp_tma::smem_bytes_v9<D>() > 232448)
            fail("v9's shared-memory layout");
    }
    if (R.violations) return R;
    const int empty_threads = b == BUG_EMPTY_COUNT ? 128 : (int)fp_tma::empty_count(nc);
    for (int s = 0; s < S; ++s) {
        bar[ids<D>::bar(fp_tma::BAR_FULL_K, s)].init(1);
        bar[ids<D>::bar(fp_tma::BAR_FULL_V, s)].init(1);
        bar[ids<D>::bar(fp_tma::BAR_EMPTY_K, s)].init(empty_threads);
        bar[ids<D>::bar(fp_tma::BAR_EMPTY_V, s)].init(empty_threads);
    }
    if (items)
        for (int s = 0; s < 2; ++s) {
            bar[ids<D>::item_bar(fp_tma::BAR_ITEM_FULL, s)].init(1);
            bar[ids<D>::item_bar(fp_tma::BAR_ITEM_EMPTY, s)].init((int)fp_tma::empty_count(nc));
        }
    int slot_val[2] = {-1, -1}, reads_left[2] = {0, 0}; // ticket slots
    stage_state stK[S], stV[S];
    for (int s = 0; s < S; ++s) {
        stK[s].box_tile.assign(fp_tma::boxes_per_tile<D>(), -1);
        stV[s].box_tile.assign(fp_tma::boxes_per_tile<D>(), -1);
    }
    auto stage_of_bar = [&](int id, bool &is_v, int &s) { // full/empty barrier -> its stage (-1: item barrier)
        for (int k = 0; k < 4; ++k)
            for (int x = 0; x < S; ++x)
                if (ids<D>::bar(k, x) == id) {
                    is_v = k == fp_tma::BAR_FULL_V || k == fp_tma::BAR_EMPTY_V;
                    s = x;
                    return k;
                }
        return -1;
    };
    struct tma_op {
        bool v;
        int stage, tile, box, bar;
    };
    std::vector<tma_op> flight;
    // per agent: program counter; visits per barrier (the phase it means)
    const int na = 1 + nc;
    std::vector<size_t> pc(na, 0);
    std::vector<std::vector<int64_t>> visits(na, std::vector<int64_t>(nbar, 0));
    // consumers: wgmma groups in flight (stage, is_v); tiles consumed so far
    std::vector<std::vector<std::pair<int, bool>>> groups(nc);
    std::vector<int> qk_count(nc, 0), pv_count(nc, 0);
    // what a consumer last waited for on each stage: the fill number
    emu_rng rng = {seed * 0x9E3779B97F4A7C15ULL + 1};
    auto ops_of = [&](int a) -> const std::vector<op> & { return a == 0 ? P.ops : C[a - 1].ops; };

    // One step of agent a: executes its next op if it can; false if blocked.
    auto step = [&](int a) -> bool {
        const op &o = ops_of(a)[pc[a]];
        const int c = a - 1;
        switch (o.kind) {
        case OP_WAIT: {
            mbarrier &B = bar[o.bar];
            if (!B.try_wait_parity(o.arg)) return false;
            // the phase this wait means: consumers, fill n of the stage
            // (phase n); the producer, its n-th visit to the stage (n >= 1:
            // phase n - 1 released; n = 0: passes on the fresh barrier)
            const int64_t n = visits[a][o.bar]++;
            const int64_t completed = B.phase; // phases completed so far
            bool item_v = false;
            int item_s = 0;
            const bool ring = stage_of_bar(o.bar, item_v, item_s) >= 0;
            if (a == 0) {
                if (n >= 1 && completed != n) fail("producer's empty wait saw phase " + std::to_string(completed) +
                                                   " completed, meant " + std::to_string(n));
                if (n == 0 && completed != 0) fail("producer's first empty wait: barrier already advanced");
            } else if (!ring) { // a ticket slot's full barrier: phase n is the slot's n-th ticket
                if (completed != n + 1)
                    fail("consumer's ticket wait: " + std::to_string(completed) + " phases completed, meant use " +
                         std::to_string(n));
            } else {
                if (completed != n + 1) {
                    fail("consumer's full wait: " + std::to_string(completed) + " phases completed, meant fill " +
                         std::to_string(n));
                } else {
                    // the fill: exactly the tile's bytes, all landed, all of the tile it waits for
                    if (B.done_bytes[n] != tile_bytes || B.done_expect[n] != tile_bytes)
                        fail("full phase completed with " + std::to_string(B.done_bytes[n]) + " bytes (expected " +
                             std::to_string(B.done_expect[n]) + "), tile is " + std::to_string(tile_bytes));
                }
                bool v = false;
                int s = 0;
                stage_of_bar(o.bar, v, s);
                stage_state &st = v ? stV[s] : stK[s];
                if (st.in_flight) fail("consumer passed a full wait with boxes of the stage still in flight");
                for (int t : st.box_tile)
                    if (t != o.tile) fail("stage holds tile " + std::to_string(t) + ", consumer waits for " +
                                          std::to_string(o.tile));
                st.holders.push_back(c);
            }
            break;
        }
        case OP_ARRIVE: { // consumer release of a stage
            bool v = false;
            int s = 0;
            stage_of_bar(o.bar, v, s);
            for (const auto &g : groups[c])
                if (g.first == s && g.second == v) fail("stage released while a wgmma still reads it");
            stage_state &st = v ? stV[s] : stK[s];
            bool held = false;
            for (size_t i = 0; i < st.holders.size(); ++i)
                if (st.holders[i] == c) {
                    st.holders.erase(st.holders.begin() + (long)i);
                    held = true;
                    break;
                }
            if (!held) fail("release of a stage the consumer does not hold");
            bar[o.bar].arrive(o.arg);
            break;
        }
        case OP_ITEM_ARRIVE:
            bar[o.bar].arrive(o.arg);
            break;
        case OP_PUBLISH:
            if (reads_left[o.bar] > 0) fail("ticket slot overwritten before every consumer read it");
            slot_val[o.bar] = o.arg;
            reads_left[o.bar] = nc;
            break;
        case OP_READ:
            if (reads_left[o.bar] <= 0 || slot_val[o.bar] != o.arg)
                fail("consumer read ticket " + std::to_string(slot_val[o.bar]) + " from slot " +
                     std::to_string(o.bar) + ", the producer published " + std::to_string(o.arg) + " for it");
            reads_left[o.bar]--;
            break;
        case OP_ARRIVE_TX: {
            bar[o.bar].expect_tx(o.arg);
            bar[o.bar].arrive(1);
            break;
        }
        case OP_TMA: {
            stage_state &st = o.is_v ? stV[o.arg] : stK[o.arg];
            if (!st.holders.empty()) fail("producer loads into a stage a consumer has not released");
            for (int x = 0; x < nc; ++x)
                for (const auto &g : groups[x])
                    if (g.first == o.arg && g.second == o.is_v) fail("producer loads into a stage a wgmma reads");
            st.in_flight++;
            st.box_tile[o.box] = -2; // being written
            flight.push_back({o.is_v, o.arg, o.tile, o.box, o.bar});
            break;
        }
        case OP_QK:
        case OP_PV: {
            const bool v = o.kind == OP_PV;
            stage_state &st = v ? stV[o.arg] : stK[o.arg];
            const int k = v ? pv_count[c] : qk_count[c]; // tiles in order
            const int want = k < (int)expect.size() ? expect[(size_t)k] : -3;
            (v ? pv_count[c] : qk_count[c])++;
            bool held = false;
            for (int h : st.holders) held |= h == c;
            if (!held) fail(std::string(v ? "P V" : "Q K^T") + " issued on a stage not acquired by a full wait");
            if (st.in_flight) fail("wgmma reads a stage with TMA boxes in flight");
            for (int t : st.box_tile)
                if (t != want) fail(std::string(v ? "P V" : "Q K^T") + " of tile " + std::to_string(want) +
                                    " reads a stage holding tile " + std::to_string(t));
            groups[c].push_back({o.arg, v});
            if (C[c].nturn >= 2 && turn_owner != c) fail("wgmma issued outside the warpgroup's turn");
            break;
        }
        case OP_WGMMA_WAIT:
            while ((int)groups[c].size() > o.arg) groups[c].erase(groups[c].begin());
            break;
        case OP_NB_SYNC:
        case OP_NB_ARRIVE: {
            if (o.bar < fp_tma::kTurnBar0 || o.bar > fp_tma::kTurnBar0 + nc - 1 || o.bar > 15 ||
                o.arg != fp_tma::kTurnThreads) {
                fail("named barrier " + std::to_string(o.bar) + " with " + std::to_string(o.arg) +
                     " threads: not a turn barrier");
                break;
            }
            named_bar &N = nb[o.bar];
            if (nb_wait[a] < 0) { // this agent's 128 threads arrive (once per op)
                if (N.arrived == 0) N.count = o.arg;
                else if (N.count != o.arg) fail("named barrier phase with two thread counts");
                const int64_t my_phase = N.phase;
                N.arrived += 128;
                if (N.arrived > N.count) fail("more arrivals than a named barrier phase counts");
                if (N.arrived >= N.count) {
                    N.arrived = 0;
                    ++N.phase;
                }
                if (o.kind == OP_NB_ARRIVE) {
                    if (turn_owner == c) turn_owner = -1; // the turn handed on
                    break;
                }
                nb_wait[a] = my_phase;
                return true; // moved (arrived); the wait is the op's next step
            }
            if (N.phase <= nb_wait[a]) return false; // bar.sync: the phase has not completed
            nb_wait[a] = -1;
            // a turn begins: nobody else in one, and the turn going round
            // (0 first, then each warpgroup after the one before it)
            if (turn_owner >= 0) fail("two warpgroups in their turns at once");
            if (c != (last_turn < 0 ? 0 : (last_turn + 1) % C[c].nturn))
                fail("warpgroup " + std::to_string(c) + " took the turn after warpgroup " + std::to_string(last_turn));
            turn_owner = last_turn = c;
            ++turns_taken;
            break;
        }
        }
        pc[a]++;
        return true;
    };
    for (;;) {
        ++R.steps;
        std::vector<int> runnable;
        for (int a = 0; a < na; ++a)
            if (pc[a] < ops_of(a).size()) runnable.push_back(a);
        if (runnable.empty() && flight.empty()) break;
        // random choice among agents and TMA deliveries; an agent that is
        // blocked is skipped; if nothing can move, deadlock
        bool moved = false;
        const size_t choices = runnable.size() + flight.size();
        const size_t first = rng.next_u32() % choices;
        for (size_t k = 0; k < choices && !moved; ++k) {
            const size_t i = (first + k) % choices;
            if (i < runnable.size()) {
                moved = step(runnable[i]);
            } else {
                const size_t f = i - runnable.size();
                const tma_op t = flight[f];
                flight.erase(flight.begin() + (long)f);
                stage_state &st = t.v ? stV[t.stage] : stK[t.stage];
                st.in_flight--;
                st.box_tile[t.box] = t.tile;
                bar[t.bar].complete_tx(box_bytes);
                moved = true;
            }
        }
        if (!moved) {
            R.deadlock = true;
            fail("deadlock");
            break;
        }
        if (R.violations > 50) break;
    }
    if (!R.deadlock && R.violations == 0) { // the final state
        for (int i = 0; i < nbar; ++i)
            if (bar[i].pending != bar[i].expected || bar[i].tx != 0) fail("barrier not at rest at exit");
        for (int s = 0; s < S; ++s)
            if (!stK[s].holders.empty() || !stV[s].holders.empty() || stK[s].in_flight || stV[s].in_flight)
                fail("stage held or loading at exit");
        for (int c = 0; c < nc; ++c) {
            if (!groups[c].empty()) fail("wgmma in flight at exit");
            if (qk_count[c] != (int)expect.size() || pv_count[c] != (int)expect.size()) fail("tiles skipped");
        }
        if (items) { // every draw read by both warpgroups, every Q buffer alternating, every work item ended
            for (int c = 0; c < nc; ++c) {
                if (C[c].reads != items->tickets.size()) fail("tickets not all read");
                int work = 0;
                for (size_t j = 0; j + 1 < items->tickets.size(); ++j)
                    work += items->items[(size_t)items->tickets[j]].work ? 1 : 0;
                if (C[c].ended != work) fail("items not all ended");
                for (size_t j = 0; j < C[c].q_uses.size(); ++j)
                    if (C[c].q_uses[j] != (int)(j & 1) || j >= C[c].q_loads.size() || C[c].q_loads[j] != C[c].q_uses[j])
                        fail("an item reads a Q buffer its Q was not loaded into");
            }
            if (P.drawn != items->tickets.size() || !P.finished) fail("producer: tickets not all drawn");
        }
        for (int i = 0; i < 16; ++i)
            if (nb[i].arrived) fail("named barrier " + std::to_string(i) + " not at rest at exit");
        // turns: one per issue section of each warpgroup (Q K^T of the first
        // tile, then one per tile), all taken; v9 chains an item with tiles
        // to the next draw when that has tiles too (the next item's first
        // Q K^T issued in this one's last turn: one turn fewer each)
        long want_turns = 0;
        if (items) {
            int chains = 0;
            for (size_t j = 0; j + 1 < items->tickets.size(); ++j) {
                const item_plan &it = items->items[(size_t)items->tickets[j]];
                if (!(it.work && it.end > it.begin)) continue;
                want_turns += 2L * (it.end - it.begin + 1);
                const int nt = items->tickets[j + 1];
                if (nt < (int)items->items.size()) {
                    const item_plan &nx = items->items[(size_t)nt];
                    if (nx.work && nx.end > nx.begin) {
                        want_turns -= 2;
                        ++chains;
                    }
                }
            }
            for (int c = 0; c < nc; ++c)
                if (C[c].chained != chains) fail("items not chained where both have tiles");
        } else {
            want_turns = (long)nturn * (s_end - s_begin + 1);
        }
        if ((items || nturn >= 2) && turns_taken != want_turns) fail("turns missing");
        const int n = (int)expect.size();
        for (int s = 0; s < S; ++s) { // fills and releases balance
            const int64_t fills = n / S + (s < n % S ? 1 : 0);
            if (bar[ids<D>::bar(fp_tma::BAR_FULL_K, s)].phase != fills ||
                bar[ids<D>::bar(fp_tma::BAR_EMPTY_V, s)].phase != fills)
                fail("phase count of a stage != its fills");
        }
    }
    return R;
}

template <int D, int W = 2> static void run_all(bug b, bool turns, long &runs, long &bad_runs, std::string &first) {
    for (int n = 1; n <= 13; ++n)
        for (int nc = 1; nc <= W; ++nc)
            for (uint64_t seed = 1; seed <= 12; ++seed) {
                const int s_begin = (int)(seed % 3);
                const model_result r =
                    run_model<D, W>(s_begin, s_begin + n, nc, b, seed * 131 + (uint64_t)n * 7 + nc, turns);
                ++runs;
                if (r.violations) {
                    if (!bad_runs && first.empty())
                        first = std::string(turns ? "turns " : "") + "D=" + std::to_string(D) + " W=" +
                                std::to_string(W) + " tiles " + std::to_string(n) + " consumers " +
                                std::to_string(nc) + ": " + r.first;
                    ++bad_runs;
                }
            }
}

// v9: random item sequences of one CTA (1-7 items of 0-7 key tiles, some
// without work, the CTA drawing a random increasing subset of the tickets),
// the next ticket drawn at an item's start (lead 0) or 1-4 tiles before its
// end: items shorter than the lead, as long, and longer than the lead and
// the ring together (where a consumer reading the ticket before the draw's
// tile would wait on a producer waiting on it: BUG_READ_EARLY).
template <int D> static void run_all_v9(bug b, long &runs, long &bad_runs, std::string &first) {
    for (uint64_t seed = 1; seed <= 120; ++seed) {
        emu_rng rng = {seed * 0x2545F4914F6CDD1DULL + 7};
        items_cfg cfg;
        cfg.lead = (int)(seed % 5);
        const int nitems = 1 + (int)(rng.next_u32() % 7);
        for (int i = 0; i < nitems; ++i) {
            const int n = (int)(rng.next_u32() % 8), begin = (int)(rng.next_u32() % 3);
            cfg.items.push_back({begin, begin + n, rng.next_u32() % 8 != 0});
        }
        for (int t = 0; t < nitems; ++t)
            if (t == 0 || rng.next_u32() % 3 != 0) cfg.tickets.push_back(t);
        cfg.tickets.push_back(nitems + (int)(rng.next_u32() % 3));
        const model_result r = run_model<D>(0, 0, 2, b, seed * 977 + (uint64_t)D, true, &cfg);
        ++runs;
        if (r.violations) {
            if (!bad_runs && first.empty())
                first = "v9 D=" + std::to_string(D) + " items " + std::to_string(nitems) + " draws " +
                        std::to_string(cfg.tickets.size()) + " lead " + std::to_string(cfg.lead) + ": " + r.first;
            ++bad_runs;
        }
    }
}

int main() {
    // the schedules as the kernels run them (v5; v8's turns): must be clean
    for (int turns = 0; turns < 2; ++turns) {
        long runs = 0, bad = 0;
        std::string first;
        run_all<128>(BUG_NONE, turns, runs, bad, first);
        run_all<64>(BUG_NONE, turns, runs, bad, first);
        printf("mbarrier/TMA model, %s schedule (stages %d at D=128, %d at D=64): %ld runs, %ld with "
               "violations%s%s\n",
               turns ? "v8 (turns)" : "v5", fp_tma::traits_v5<128>::kStages, fp_tma::traits_v5<64>::kStages, runs,
               bad, bad ? ": " : "", first.c_str());
        if (bad || !runs) g_failures++;
    }
    { // v10: three consumer warpgroups taking turns in a round (head_dim 64)
        long runs = 0, bad = 0;
        std::string first;
        run_all<64, 3>(BUG_NONE, true, runs, bad, first);
        // its shared-memory layout: the barriers where the model's ids put
        // them (v5's relative layout after a larger Q tile), K / V tiles on
        // 1024-byte boundaries (the 128-byte swizzle), within the opt-in
        // limit; the named barriers of its Q publication (2 + cw) below the
        // turns'
        int layout = 0;
        for (int k = 0; k < 4; ++k)
            for (int x = 0; x < fp_tma::traits_v5<64, 3>::kStages; ++x)
                if (fp_tma::bar_offset<64, 1, 3>(k, x) - fp_tma::bar_offset<64, 1, 3>(0, 0) !=
                    fp_tma::bar_offset<64>(k, x) - fp_tma::bar_offset<64>(0, 0))
                    layout++;
        for (int x = 0; x < fp_tma::traits_v5<64, 3>::kStages; ++x)
            if (fp_tma::k_offset<64, 1, 3>(x) % 1024 || fp_tma::v_offset<64, 1, 3>(x) % 1024) layout++;
        if (fp_tma::q_tile_bytes<64, 3>() != 192 * 64 * 2 || fp_tma::smem_bytes<64, 1, 3>() > 232448 ||
            2 + fp_tma::traits_v5<64, 3>::kConsumerWGs > fp_tma::kTurnBar0 ||
            fp_tma::kTurnBar0 + fp_tma::kMaxTurnWGs > 16)
            layout++;
        // active warpgroups of a CTA: one per 64 rows left, at most W
        const int act[][3] = {{1, 3, 1}, {64, 3, 1}, {65, 3, 2}, {128, 3, 2}, {129, 3, 3}, {192, 3, 3},
                              {1000, 3, 3}, {65, 2, 2}, {64, 2, 1}, {0, 3, 1}};
        for (const auto &a : act)
            if (fp_tma::active_consumer_wgs(a[0], a[1]) != a[2]) layout++;
        printf("mbarrier/TMA model, v10 schedule (three consumer warpgroups, turns in a round, %d stages): %ld "
               "runs, %ld with violations%s%s; layout / active warpgroups: %d wrong (%u bytes of shared memory)\n",
               fp_tma::traits_v5<64, 3>::kStages, runs, bad, bad ? ": " : "", first.c_str(), layout,
               fp_tma::smem_bytes<64, 1, 3>());
        if (bad || !runs || layout) g_failures++;
        for (int b = 1; b < BUG_COUNT; ++b) {
            if (item_bug(b)) continue;
            long bruns = 0, bbad = 0;
            std::string bfirst;
            run_all<64, 3>((bug)b, true, bruns, bbad, bfirst);
            printf("broken variant %-16s (v10): caught in %ld of %ld runs (%s)\n", bug_name[b], bbad, bruns,
                   bbad ? bfirst.c_str() : "NOT CAUGHT");
            if (!bbad) g_failures++;
        }
    }
    { // v9's items: the ring across items, the ticket slots, the Q buffers
        long runs = 0, bad = 0;
        std::string first;
        run_all_v9<128>(BUG_NONE, runs, bad, first);
        run_all_v9<64>(BUG_NONE, runs, bad, first);
        printf("mbarrier/TMA model, v9 schedule (items, tickets, turns): %ld runs, %ld with violations%s%s\n", runs,
               bad, bad ? ": " : "", first.c_str());
        if (bad || !runs) g_failures++;
    }
    for (int b = 1; b < BUG_COUNT; ++b) {
        if (three_wg_bug(b)) continue;
        long runs = 0, bad = 0;
        std::string first;
        run_all_v9<128>((bug)b, runs, bad, first);
        run_all_v9<64>((bug)b, runs, bad, first);
        printf("broken variant %-19s (v9): caught in %ld of %ld runs (%s)\n", bug_name[b], bad, runs,
               bad ? first.c_str() : "NOT CAUGHT");
        if (!bad) g_failures++;
    }
    // every deliberately broken variant must be caught (the ring's in both
    // schedules, the turns' in v8's)
    for (int turns = 0; turns < 2; ++turns)
        for (int b = 1; b < BUG_COUNT; ++b) {
            if ((turn_bug(b) && !turns) || item_bug(b) || three_wg_bug(b)) continue;
            long runs = 0, bad = 0;
            std::string first;
            run_all<128>((bug)b, turns, runs, bad, first);
            run_all<64>((bug)b, turns, runs, bad, first);
            // some bugs need 2 consumers or several passes over the ring to
            // show; over all runs, at least one must fail
            printf("broken variant %-16s (%s): caught in %ld of %ld runs (%s)\n", bug_name[b], turns ? "v8" : "v5",
                   bad, runs, bad ? first.c_str() : "NOT CAUGHT");
            if (!bad) g_failures++;
        }
    // v9's order: a bijection onto (query tile, unit), sections of at most
    // `section` units, longest first within a section; units -> (split,
    // head, batch) a bijection; the section rule; and the balance the
    // tickets give under a causal mask (below)
    {
        long wrong = 0;
        const int shapes[][5] = {{1, 1, 1, 1, 1},  {4, 3, 2, 2, 5},  {7, 1, 5, 3, 4},
                                 {32, 1, 16, 2, 12}, {3, 2, 3, 1, 2}, {128, 4, 2, 1, 3}};
        for (const auto &sh : shapes) { // m_tiles, splits, heads_kv, batch, section
            const fp_tma::tile_order o = fp_tma::make_tile_order(sh[0], sh[1], sh[2], sh[3], sh[4]);
            std::vector<int> seen((size_t)o.items, 0), useen((size_t)o.units, 0);
            int prev_section = -1, prev_m = 0;
            for (int r = 0; r < o.items; ++r) {
                int m, u;
                fp_tma::order_item(o, r, &m, &u);
                if (m < 0 || m >= o.m_tiles || u < 0 || u >= o.units) {
                    wrong++;
                    continue;
                }
                seen[(size_t)(u * o.m_tiles + m)]++;
                const int sec = u / o.section;
                if (sec < prev_section) wrong++;                     // sections in order
                if (sec == prev_section && m > prev_m) wrong++;      // longest first within one
                prev_section = sec;
                prev_m = m;
            }
            for (int x : seen) wrong += x != 1;
            for (int u = 0; u < o.units; ++u) {
                int sp, hk, b;
                fp_tma::unit_coords(o, u, &sp, &hk, &b);
                if (sp < 0 || sp >= sh[1] || hk < 0 || hk >= sh[2] || b < 0 || b >= sh[3]) wrong++;
                else useen[(size_t)((sp * sh[3] + b) * sh[2] + hk)]++;
            }
            for (int x : useen) wrong += x != 1;
        }
        // the section rule: 1 unmasked; banded: L2 / unit bytes, sms / 4, evened out
        const int64_t MiB = 1 << 20;
        if (fp_tma::order_section(50 * MiB, 2 * MiB, 32, 132, true) != 16) wrong++;  // 25 -> 2 sections of 16
        if (fp_tma::order_section(50 * MiB, 2 * MiB, 16, 132, true) != 16) wrong++;  // all
        if (fp_tma::order_section(50 * MiB, MiB / 2, 256, 132, true) != 32) wrong++; // sms / 4 = 33 -> 8 of 32
        if (fp_tma::order_section(50 * MiB, 64 * MiB, 8, 132, true) != 1) wrong++;   // a unit above the L2
        if (fp_tma::order_section(50 * MiB, 2 * MiB, 32, 2, true) != 1) wrong++;     // a 2-SM device
        if (fp_tma::order_section(50 * MiB, 2 * MiB, 32, 132, false) != 1) wrong++;  // unmasked: unit order
        if (fp_tma::order_section(50 * MiB, MiB / 2, 256, 132, false) != 1) wrong++;
        if (fp_tma::persistent_ctas(5, 132) != 5 || fp_tma::persistent_ctas(1000, 132) != 132 ||
            fp_tma::persistent_ctas(3, 0) != 1)
            wrong++;
        // balance (H100: 132 SMs, 50 MiB L2; head_dim 128, causal: tile m of
        // a unit runs m + 1 key tiles, plus 0.2 of a tile per item): a
        // list-scheduling simulation of the protocol, each CTA drawing its
        // next ticket when it starts an item (lead 0, session 19's rule) or
        // when the item has lead + kStages tiles of consumer time left (the
        // producer draws before the loads of draw_tile, a ring's depth ahead
        // of the consumers); the draws served in time order
        const int bal[][2] = {{4096, 32}, {4096, 16}, {8192, 16}, {16384, 4}, {4096, 128}, {1024, 256}};
        const int stages = fp_tma::traits_v5<128>::kStages;
        double worst[2] = {0, 0};
        for (const auto &bs : bal) {
            const int mt = bs[0] / 128, units = bs[1], g = 132;
            const fp_tma::tile_order o = fp_tma::make_tile_order(
                mt, 1, units, 1, fp_tma::order_section(50 * MiB, (int64_t)bs[0] * 128 * 2 * 2, units, g, true));
            double ratio[2];
            for (int late = 0; late < 2; ++late) {
                const double ahead = late ? fp_tma::kV9Lead + stages : 1e30; // tiles of time before the end
                const size_t n = (size_t)fp_tma::persistent_ctas(o.items, g);
                std::vector<double> end(n, 0.0), draw(n, 0.0);
                std::vector<bool> pending(n, true);
                double total = 0;
                auto start = [&](size_t c, int r, double t0) { // CTA c starts item r at t0
                    int m, u;
                    fp_tma::order_item(o, r, &m, &u);
                    const double len = 0.2 + (m + 1);
                    total += len;
                    end[c] = t0 + len;
                    draw[c] = len > ahead ? end[c] - ahead : t0;
                };
                for (size_t c = 0; c < n; ++c) start(c, (int)c, 0.0);
                int ticket = (int)n;
                for (;;) {
                    size_t c = n;
                    for (size_t x = 0; x < n; ++x)
                        if (pending[x] && (c == n || draw[x] < draw[c])) c = x;
                    if (c == n) break;
                    if (ticket >= o.items) {
                        pending[c] = false; // drew past the end
                        continue;
                    }
                    start(c, ticket++, end[c]);
                }
                double last = 0;
                for (double e : end) last = e > last ? e : last;
                ratio[late] = last / (total / g);
                worst[late] = ratio[late] > worst[late] ? ratio[late] : worst[late];
            }
            printf("v9 order, causal %5d keys x %3d heads (section %2d): makespan %.3f x the perfect balance drawn "
                   "at an item's start, %.3f drawn %d tiles before its end\n",
                   bs[0], units, o.section, ratio[0], ratio[1], fp_tma::kV9Lead);
            // session 19's rule within 10%; the late draw within 3%, never
            // behind the early one
            if (ratio[0] > 1.10 || ratio[1] > 1.03 || ratio[1] > ratio[0] + 1e-9) {
                fprintf(stderr, "v9 order, causal %d keys x %d heads: makespan %.3f / %.3f x the perfect balance\n",
                        bs[0], units, ratio[0], ratio[1]);
                wrong++;
            }
        }
        printf("v9 order: bijection, sections, longest first, section rule, balance (worst %.3f x perfect drawn "
               "at the start, %.3f late); %ld wrong\n",
               worst[0], worst[1], wrong);
        if (wrong) g_failures++;
    }
    // ring index functions: stage cycles, phase flips once per pass
    long bad = 0;
    for (int S = 2; S <= 4; ++S)
        for (int i = 0; i < 64; ++i) {
            if (fp_tma::ring_stage(i, S) != i % S) bad++;
            if (fp_tma::full_parity(i, S) != (uint32_t)((i / S) % 2)) bad++;
            if (fp_tma::empty_parity(i, S) == fp_tma::full_parity(i, S)) bad++;
        }
    printf("ring index functions: %ld wrong\n", bad);
    if (bad) g_failures++;
    // the register split's precondition (launch_v5 refuses a kernel whose
    // numRegs it rejects): targets, the file, the launch, .dec / .inc
    // directions, the CTA pool
    {
        struct reg_case {
            int regs, pt, pr, ct, cr, file, want;
        };
        const int F = fp_tma::kRegisterFile;
        const reg_case cases[] = {
            {168, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_OK},           // v5: 384 x 168 = 128 x 24 + 256 x 240
            {164, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_OK},           // allocated in 8s: 168 a thread
            {160, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_POOL_SHORT},   // 61440 < 64512: .inc waits forever
            {128, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_POOL_SHORT},
            {176, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_LAUNCH},       // 384 x 176 > 65536
            {255, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_LAUNCH},
            {168, 128, 24, 256, 256, F, fp_tma::REG_SPLIT_OVER_FILE},    // 3072 + 65536 > 65536
            {168, 128, 32, 256, 240, F, fp_tma::REG_SPLIT_POOL_SHORT},   // the file's 65536 > the CTA's 64512
            {16, 128, 24, 256, 240, F, fp_tma::REG_SPLIT_DEC},           // .dec 24 from 16
            {248, 128, 24, 128, 240, F, fp_tma::REG_SPLIT_INC},          // .inc 240 from 248
            {136, 128, 40, 128, 232, F, fp_tma::REG_SPLIT_OK},           // 256 threads: 128 x 40 + 128 x 232
            {168, 128, 20, 256, 240, F, fp_tma::REG_SPLIT_BAD_TARGET},   // not a multiple of 8
            {168, 128, 24, 256, 264, F, fp_tma::REG_SPLIT_BAD_TARGET},   // above 256
            {168, 128, 24, 256, 240, 32768, fp_tma::REG_SPLIT_OVER_FILE} // a smaller file
        };
        int wrong = 0;
        for (const reg_case &c : cases) {
            const int got = fp_tma::reg_split_check(c.regs, c.pt, c.pr, c.ct, c.cr, c.file);
            if (got != c.want) {
                fprintf(stderr, "reg_split_check(%d, %d x %d + %d x %d, file %d) = %d (%s), want %d (%s)\n", c.regs,
                        c.pt, c.pr, c.ct, c.cr, c.file, got, fp_tma::reg_split_status_text(got), c.want,
                        fp_tma::reg_split_status_text(c.want));
                wrong++;
            }
        }
        // v5's own constants: exactly the counts that allocate 168 a thread
        int accepted_lo = 0, accepted_hi = 0, accepted = 0;
        for (int n = 1; n <= 255; ++n)
            if (fp_tma::v5_reg_split_check<128>(n) == fp_tma::REG_SPLIT_OK &&
                fp_tma::v5_reg_split_check<64>(n) == fp_tma::REG_SPLIT_OK) {
                if (!accepted++) accepted_lo = n;
                accepted_hi = n;
            }
        if (accepted_lo != 161 || accepted_hi != 168 || accepted != 8) wrong++;
        if (fp_tma::v5_entry_regs<128>() != 168 || fp_tma::v5_entry_regs<64>() != 168) wrong++;
        // v9's split (producer 32, consumers 232): the same entry count and accepted range; v5 / v8's
        // through the version-aware functions are traits_v5's
        int v9_lo = 0, v9_hi = 0, v9_n = 0;
        for (int n = 1; n <= 255; ++n)
            if (fp_tma::split_check<128, 9>(n) == fp_tma::REG_SPLIT_OK &&
                fp_tma::split_check<64, 9>(n) == fp_tma::REG_SPLIT_OK) {
                if (!v9_n++) v9_lo = n;
                v9_hi = n;
            }
        if (v9_lo != 161 || v9_hi != 168 || v9_n != 8 || fp_tma::entry_regs<128, 9>() != 168) wrong++;
        if (fp_tma::producer_regs<128, 9>() != 40 || fp_tma::consumer_regs<64, 9>() != 232 ||
            fp_tma::producer_regs<128, 8>() != 24 || fp_tma::consumer_regs<128, 5>() != 240)
            wrong++;
        for (int n = 1; n <= 255; ++n)
            if (fp_tma::split_check<128, 8>(n) != fp_tma::v5_reg_split_check<128>(n)) wrong++;
        // v10's split (512 threads, producer 32, consumers 3 x 128 x 160 =
        // the whole file): exactly the counts that allocate 128 a thread
        // (what __launch_bounds__(512, 1) gives ptxas)
        int v10_lo = 0, v10_hi = 0, v10_n = 0;
        for (int n = 1; n <= 255; ++n)
            if (fp_tma::split_check<64, 10>(n) == fp_tma::REG_SPLIT_OK) {
                if (!v10_n++) v10_lo = n;
                v10_hi = n;
            }
        if (v10_lo != 121 || v10_hi != 128 || v10_n != 8 || fp_tma::entry_regs<64, 10>() != 128 ||
            fp_tma::threads_of<10>() != 512 || fp_tma::consumer_wgs<10>() != 3 || fp_tma::producer_regs<64, 10>() != 32 ||
            fp_tma::consumer_regs<64, 10>() != 160 || fp_tma::threads_of<8>() != fp_tma::kThreads)
            wrong++;
        if (fp_tma::split_check<64, 10>(136) != fp_tma::REG_SPLIT_LAUNCH ||
            fp_tma::split_check<64, 10>(120) != fp_tma::REG_SPLIT_POOL_SHORT)
            wrong++;
        printf("register split check: %d cases, v5 / v8 accept numRegs %d..%d (allocated 168 a thread), v9 (40 + "
               "232) %d..%d, v10 (512 threads: 32 + 3 x 160) %d..%d; %d wrong\n",
               (int)(sizeof cases / sizeof cases[0]), accepted_lo, accepted_hi, v9_lo, v9_hi, v10_lo, v10_hi, wrong);
        if (wrong) g_failures++;
    }
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
