// fp_torch_malloc_or_throw (the alloc_fn PyTorch gets): a failed allocation
// throws a std::exception naming out-of-memory instead of returning NULL
// (PyTorch's CUDAPluggableAllocator stores the pointer unchecked; its Python
// bindings turn a std::exception into a RuntimeError). Driven on the CPU
// through the process-wide table with host instances capped at 8 MiB.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

extern "C" {
#include "alloc/alloc_internal.h"
#include "fastpath/alloc.h"
}


static int failures = 0;
#define EXPECT(c)                                                              \
    do {                                                                       \
        if (!(c)) {                                                            \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static fp_status make_capped(void *, int, const fp_alloc_config *cfg, fp_allocator **out) {
    fp_alloc_config c = *cfg;
    c.memory_cap_bytes = (size_t)8 << 20;
    fp_alloc_upstream up = fp_alloc_upstream_host();
    return fp_alloc_create(&up, nullptr, &c, out);
}

// What the call did: 'p' a pointer, 'n' NULL, 't' threw (message in what).
static char call(ssize_t size, int device, std::string *what, void **p) {
    try {
        *p = fp_torch_malloc_or_throw(size, device, nullptr);
        return *p ? 'p' : 'n';
    } catch (const std::exception &e) {
        *what = e.what();
        return 't';
    }
}

int main() {
    EXPECT(fp_torch_global_set_factory(make_capped, nullptr, 2) == FP_OK);
    std::string what;
    void *p = nullptr;
    EXPECT(call(0, 0, &what, &p) == 'n'); // size 0: NULL, as PyTorch's own allocator
    EXPECT(call(1 << 20, 0, &what, &p) == 'p');
    void *q = nullptr;
    EXPECT(call((ssize_t)64 << 20, 0, &what, &q) == 't'); // over the cap
    EXPECT(what.find("out of memory") != std::string::npos && what.find("67108864") != std::string::npos);
    std::printf("out of memory throws: %s\n", what.c_str());
    what.clear();
    EXPECT(call(1024, 5, &what, &q) == 't'); // no such device
    EXPECT(what.find("failed") != std::string::npos);
    what.clear();
    EXPECT(call(-1, 0, &what, &q) == 't'); // negative size
    fp_torch_free(p, 1 << 20, 0, nullptr);
    if (failures) std::fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
