// Test hooks of the emulated NCCL (tests/emu/nccl_emu.cpp): fault injection
// and a leak count. C-compatible, so C tests linked against fastpath_emu can
// use them too.
//
// An injection names a rank (its rank in the communicator it belongs to, -1:
// every rank) and a collective sequence number (each communicator counts its
// collectives 0, 1, 2, ... in host call order). It applies to every clique
// (a communicator made by ncclCommSplit counts from 0 again) until
// fp_nccl_emu_reset().
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

enum {
    // The rank's seq-th collective, on its stream, never joins the
    // rendezvous: it blocks that stream (and so every peer's) until the
    // clique is aborted (ncclCommAbort of any rank).
    FP_NCCL_EMU_HANG = 1,
    // Its stream work sleeps `arg` ms before joining the rendezvous (an abort
    // ends the sleep).
    FP_NCCL_EMU_DELAY = 2,
    // The host call returns ncclSystemError, enqueues nothing and does not
    // consume the sequence number. Fires once per communicator: the retry of
    // the call goes through.
    FP_NCCL_EMU_CALL_ERROR = 3,
    // At run time the operation sets its communicator's asynchronous error
    // to ncclSystemError and aborts the clique (the peers see
    // ncclRemoteError); no receive buffer is written.
    FP_NCCL_EMU_ASYNC_ERROR = 4,
};

void fp_nccl_emu_inject(int rank, unsigned long long seq, int fault, int arg);
// Removes every injection.
void fp_nccl_emu_reset(void);
// Communicators created and not yet destroyed or aborted (a leak check).
int fp_nccl_emu_live_comms(void);

#ifdef __cplusplus
}
#endif
