// cp.async (sm_80+ asynchronous global -> shared copies) for the CUDA
// emulation. A kernel source built with FP_CUDA_EMU routes its cp.async
// wrappers here instead of to inline PTX.
//
// Semantics kept: a copy is *not* in shared memory until the issuing thread
// waits for its group (cp.async.wait_group N lands every committed group but
// the newest N; copies not yet committed stay in flight), so a kernel that
// reads a tile before waiting sees the 0xFF poison, and the shadow checks of
// cuda_emu.h report reads of bytes in flight, reads of another thread's copy
// without a barrier in between, and copies issued over bytes another thread
// read since the last barrier (write after read).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "cuda_emu.h"

namespace fp_emu {

struct CpAsyncCopy {
    uint32_t dst;
    const void *src;
    int bytes;      // cp-size: 4, 8 or 16
    int src_bytes;  // read from src; the rest of the cp-size is zero-filled
};
struct CpAsyncState {
    std::vector<CpAsyncCopy> open;                 // issued, not committed
    std::deque<std::vector<CpAsyncCopy>> groups;  // committed, oldest first
};

// cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes;
inline void cp_async(uint32_t dst, const void *src, int bytes, int src_bytes) {
    pdl_require("cp.async");
    if (bytes != 4 && bytes != 8 && bytes != 16) kernel_fail("cp.async of %d bytes (4, 8 or 16)", bytes);
    if (src_bytes < 0 || src_bytes > bytes) kernel_fail("cp.async src-size %d of a %d-byte copy", src_bytes, bytes);
    if (dst % (uint32_t)bytes) kernel_fail("cp.async to shared address %u, not %d-byte aligned", dst, bytes);
    if (src_bytes > 0 && (uintptr_t)src % (uintptr_t)bytes)
        kernel_fail("cp.async from %p, not %d-byte aligned", src, bytes);
    smem_note_async_issue(dst, (size_t)bytes);
    thread_state<CpAsyncState>().open.push_back(CpAsyncCopy{dst, src, bytes, src_bytes});
}

inline void cp_async_land(const CpAsyncCopy &c) {
    unsigned char *d = smem_at(c.dst, (size_t)c.bytes);
    if (c.src_bytes) std::memcpy(d, c.src, (size_t)c.src_bytes);
    std::memset(d + c.src_bytes, 0, (size_t)(c.bytes - c.src_bytes));
    smem_note_async_complete(c.dst, (size_t)c.bytes);
}

// cp.async.commit_group
inline void cp_async_commit() {
    CpAsyncState &s = thread_state<CpAsyncState>();
    s.groups.push_back(std::move(s.open));
    s.open.clear();
}

// cp.async.wait_group n: all but the newest n committed groups have landed.
inline void cp_async_wait_group(int n) {
    CpAsyncState &s = thread_state<CpAsyncState>();
    bool landed = false;
    while ((int)s.groups.size() > n) {
        for (const CpAsyncCopy &c : s.groups.front()) cp_async_land(c);
        s.groups.pop_front();
        landed = true;
    }
    if (landed) note_progress();
}

// cp.async.wait_all: commit, then wait for everything.
inline void cp_async_wait_all() {
    cp_async_commit();
    cp_async_wait_group(0);
}

}  // namespace fp_emu
