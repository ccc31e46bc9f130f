// libFuzzer target for the GGUF parser: any input must either parse or throw ds4::Error, never
// crash, hang, read out of bounds or allocate without bound. On success, every getter and every
// tensor byte is touched so that bad offsets would show up under ASan.
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "gguf/gguf_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        auto f = ds4::gguf::File::from_memory(data, size, "fuzz");
        for (const auto &[key, value] : f->metadata()) {
            try {
                (void)f->get_u32(key);
            } catch (const ds4::Error &) {
            }
            try {
                (void)f->get_f64(key);
            } catch (const ds4::Error &) {
            }
            try {
                (void)f->get_string_array(key);
            } catch (const ds4::Error &) {
            }
        }
        unsigned sum = 0;
        for (const auto &t : f->tensors())
            for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
        volatile unsigned sink = sum;
        (void)sink;
    } catch (const ds4::Error &) {
    }
    return 0;
}
