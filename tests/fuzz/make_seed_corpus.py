#!/usr/bin/env python3
"""Writes small valid GGUF seeds for the parser fuzzer with gguf-py's GGUFWriter (an
independent writer). valid_small.gguf is also used by the unit tests' truncation check.
    python3 tests/fuzz/make_seed_corpus.py
"""
import os

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType, GGUFValueType

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def write(name, alignment=None, with_tensors=True):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, "deepseek4")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ｜DSML｜")
    w.add_array("t.arr_u32", [1, 2, 3])
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_key_value("t.arr_nested", [[1, 2], [3]], GGUFValueType.ARRAY, sub_type=GGUFValueType.ARRAY)
    if with_tensors:
        rng = np.random.default_rng(1)
        w.add_tensor("f32", rng.standard_normal((2, 8)).astype(np.float32))
        w.add_tensor("f16", rng.standard_normal((4,)).astype(np.float16))
        w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(3, 2))
        q8 = np.frombuffer(rng.integers(0, 255, 34 * 2, dtype=np.uint8).tobytes(), dtype=np.uint8)
        q8 = q8.reshape(2, 34).copy()
        q8[:, 1] = 0x3c  # f16 scale 1.0-ish: keep the block finite
        q8[:, 0] = 0
        w.add_tensor("q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    write("valid_small.gguf")
    write("valid_align64.gguf", alignment=64)
    write("valid_no_tensors.gguf", with_tensors=False)
    print("wrote seeds to", OUT)


if __name__ == "__main__":
    main()
