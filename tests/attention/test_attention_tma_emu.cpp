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
// oneself, a pass after warpgroup 1's last issue) must be caught too.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/attention_tma_sm90.h"
#include "attn_emu_util.h"

static int g_failures = 0;

// ---- the recorded schedule ---------------------------------------------------

enum op_kind { OP_WAIT, OP_ARRIVE, OP_ARRIVE_TX, OP_TMA, OP_QK, OP_PV, OP_WGMMA_WAIT, OP_NB_SYNC, OP_NB_ARRIVE };
struct op {
    op_kind kind;
    int bar;    // barrier id (WAIT, ARRIVE*, TMA); named barrier id (NB_*)
    int arg;    // parity (WAIT), arrivals (ARRIVE), bytes (ARRIVE_TX), stage (TMA, QK, PV), N (WGMMA_WAIT),
                // threads (NB_*)
    int tile;   // TMA: tile; WAIT: the tile the kernel says it waits for (-1 producer)
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
    BUG_TURN_NO_START,    // (turns) warpgroup 1 does not hand warpgroup 0 the first turn
    BUG_TURN_SELF,        // (turns) a warpgroup passes the turn to itself
    BUG_TURN_LAST_PASS,   // (turns) warpgroup 1 passes the turn after its last issue too
    BUG_COUNT
};
static const char *bug_name[BUG_COUNT] = {"none",          "producer parity", "consumer parity",
                                          "expect_tx half", "early K release", "empty count",
                                          "no phase flip", "stage shift",     "turn: no start",
                                          "turn: to itself", "turn: last pass"};
static bool turn_bug(int b) { return b >= BUG_TURN_NO_START; }

template <int D> struct ids {
    static constexpr int S = fp_tma::traits_v5<D>::kStages;
    // Barrier id from the kernel's byte offsets (8 bytes each): distinct
    // offsets give distinct ids, a collision would merge barriers.
    static int bar(int kind, int stage) {
        return (int)((fp_tma::bar_offset<D>(kind, stage) - fp_tma::bar_offset<D>(0, 0)) / 8);
    }
};

template <int D> struct producer_rec {
    std::vector<op> ops;
    bug b;
    uint32_t box_bytes; // per box, from the tensor map's box
    void wait_empty_k(int st, uint32_t par) { wait(fp_tma::BAR_EMPTY_K, st, par); }
    void wait_empty_v(int st, uint32_t par) { wait(fp_tma::BAR_EMPTY_V, st, par); }
    void wait(int kind, int st, uint32_t par) {
        if (b == BUG_PRODUCER_PARITY) par ^= 1u;
        if (b == BUG_NO_PHASE_FLIP) par = 1u;
        ops.push_back({OP_WAIT, ids<D>::bar(kind, st), (int)par, -1, 0, kind == fp_tma::BAR_EMPTY_V});
    }
    void load(int kind, int st, int t) {
        const bool v = kind == fp_tma::BAR_FULL_V;
        uint32_t bytes = fp_tma::stage_tx_bytes<D>();
        if (b == BUG_EXPECT_HALF) bytes /= 2;
        ops.push_back({OP_ARRIVE_TX, ids<D>::bar(kind, st), (int)bytes, t, 0, v});
        for (int c = 0; c < fp_tma::boxes_per_tile<D>(); ++c)
            ops.push_back({OP_TMA, ids<D>::bar(kind, st), st, t, c, v});
    }
    void load_k(int st, int t) { load(fp_tma::BAR_FULL_K, st, t); }
    void load_v(int st, int t) { load(fp_tma::BAR_FULL_V, st, t); }
};

template <int D> struct consumer_rec {
    std::vector<op> ops;
    bug b;
    int cw = 0;          // consumer warpgroup (turns)
    bool synced = false; // has waited for a turn
    void wait(int kind, int st, uint32_t par, int t) {
        if (b == BUG_CONSUMER_PARITY) par ^= 1u;
        if (b == BUG_NO_PHASE_FLIP) par = 0u;
        ops.push_back({OP_WAIT, ids<D>::bar(kind, st), (int)par, t, 0, kind == fp_tma::BAR_FULL_V});
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
        if (b == BUG_TURN_NO_START && cw == 1 && !synced) return;
        if (b == BUG_TURN_SELF) id = fp_tma::turn_bar(cw);
        ops.push_back({OP_NB_ARRIVE, id, n, 0, 0, false});
    }
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

// Runs the recorded ops of one producer and `nc` consumers over a CTA's
// tiles [s_begin, s_end) with random interleaving (seed).
template <int D>
static model_result run_model(int s_begin, int s_end, int nc, bug b, uint64_t seed, bool turns) {
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
    fp_tma::producer_schedule<S>(s_begin, s_end, P);
    std::vector<consumer_rec<D>> C(nc);
    for (int c = 0; c < nc; ++c) {
        C[c].b = b;
        C[c].cw = c;
        if (turns) {
            fp_tma::consumer_schedule_turns<S>(s_begin, s_end, c, nc == 2, C[c]);
            if (b == BUG_TURN_LAST_PASS && c == 1 && nc == 2)
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
    // barriers: ids from the kernel's offsets; init as the kernel does
    const int nbar = 4 * S;
    std::vector<mbarrier> bar(nbar);
    std::vector<int> seen(nbar, 0);
    for (int k = 0; k < 4; ++k)
        for (int s = 0; s < S; ++s) {
            const int id = ids<D>::bar(k, s);
            if (id < 0 || id >= nbar || seen[id]++) fail("barrier offsets collide");
        }
    if (R.violations) return R;
    const int empty_threads = b == BUG_EMPTY_COUNT ? 128 : (int)fp_tma::empty_count(nc);
    for (int s = 0; s < S; ++s) {
        bar[ids<D>::bar(fp_tma::BAR_FULL_K, s)].init(1);
        bar[ids<D>::bar(fp_tma::BAR_FULL_V, s)].init(1);
        bar[ids<D>::bar(fp_tma::BAR_EMPTY_K, s)].init(empty_threads);
        bar[ids<D>::bar(fp_tma::BAR_EMPTY_V, s)].init(empty_threads);
    }
    stage_state stK[S], stV[S];
    for (int s = 0; s < S; ++s) {
        stK[s].box_tile.assign(fp_tma::boxes_per_tile<D>(), -1);
        stV[s].box_tile.assign(fp_tma::boxes_per_tile<D>(), -1);
    }
    auto stage_of_bar = [&](int id, bool &is_v, int &s) { // full/empty barrier -> its stage
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
            if (a == 0) {
                if (n >= 1 && completed != n) fail("producer's empty wait saw phase " + std::to_string(completed) +
                                                   " completed, meant " + std::to_string(n));
                if (n == 0 && completed != 0) fail("producer's first empty wait: barrier already advanced");
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
            const int want = (v ? pv_count[c] : qk_count[c]) + s_begin; // tiles in order
            (v ? pv_count[c] : qk_count[c])++;
            bool held = false;
            for (int h : st.holders) held |= h == c;
            if (!held) fail(std::string(v ? "P V" : "Q K^T") + " issued on a stage not acquired by a full wait");
            if (st.in_flight) fail("wgmma reads a stage with TMA boxes in flight");
            for (int t : st.box_tile)
                if (t != want) fail(std::string(v ? "P V" : "Q K^T") + " of tile " + std::to_string(want) +
                                    " reads a stage holding tile " + std::to_string(t));
            groups[c].push_back({o.arg, v});
            if (turns && nc == 2 && turn_owner != c) fail("wgmma issued outside the warpgroup's turn");
            break;
        }
        case OP_WGMMA_WAIT:
            while ((int)groups[c].size() > o.arg) groups[c].erase(groups[c].begin());
            break;
        case OP_NB_SYNC:
        case OP_NB_ARRIVE: {
            if (o.bar < fp_tma::kTurnBar0 || o.bar > fp_tma::kTurnBar0 + 1 || o.bar > 15 ||
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
            // a turn begins: nobody else in one, and not the same warpgroup twice
            if (turn_owner >= 0) fail("two warpgroups in their turns at once");
            if (last_turn == c) fail("warpgroup " + std::to_string(c) + " took two turns in a row");
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
            if (qk_count[c] != s_end - s_begin || pv_count[c] != s_end - s_begin) fail("tiles skipped");
        }
        for (int i = 0; i < 16; ++i)
            if (nb[i].arrived) fail("named barrier " + std::to_string(i) + " not at rest at exit");
        // turns: one per issue section of each warpgroup (Q K^T of the first
        // tile, then one per tile), all taken
        if (turns && nc == 2 && turns_taken != 2L * (s_end - s_begin + 1)) fail("turns missing");
        const int n = s_end - s_begin;
        for (int s = 0; s < S; ++s) { // fills and releases balance
            const int64_t fills = n / S + (s < n % S ? 1 : 0);
            if (bar[ids<D>::bar(fp_tma::BAR_FULL_K, s)].phase != fills ||
                bar[ids<D>::bar(fp_tma::BAR_EMPTY_V, s)].phase != fills)
                fail("phase count of a stage != its fills");
        }
    }
    return R;
}

template <int D> static void run_all(bug b, bool turns, long &runs, long &bad_runs, std::string &first) {
    for (int n = 1; n <= 13; ++n)
        for (int nc = 1; nc <= 2; ++nc)
            for (uint64_t seed = 1; seed <= 12; ++seed) {
                const int s_begin = (int)(seed % 3);
                const model_result r =
                    run_model<D>(s_begin, s_begin + n, nc, b, seed * 131 + (uint64_t)n * 7 + nc, turns);
                ++runs;
                if (r.violations) {
                    if (!bad_runs && first.empty())
                        first = std::string(turns ? "turns " : "") + "D=" + std::to_string(D) + " tiles " + std::to_string(n) + " consumers " +
                                std::to_string(nc) + ": " + r.first;
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
    // every deliberately broken variant must be caught (the ring's in both
    // schedules, the turns' in v8's)
    for (int turns = 0; turns < 2; ++turns)
        for (int b = 1; b < BUG_COUNT; ++b) {
            if (turn_bug(b) && !turns) continue;
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
        printf("register split check: %d cases, v5 accepts numRegs %d..%d (allocated 168 a thread); %d wrong\n",
               (int)(sizeof cases / sizeof cases[0]), accepted_lo, accepted_hi, wrong);
        if (wrong) g_failures++;
    }
    if (g_failures) fprintf(stderr, "%d check(s) failed\n", g_failures);
    return g_failures ? 1 : 0;
}
