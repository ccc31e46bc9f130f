#!/usr/bin/env python3
"""Writes the corpus of hand-made broken GGUF files in malformed/ and malformed/manifest.json.

Each file has one defect; the manifest maps the file to a substring that our reader's error
message must contain (the defect named precisely). The bytes are packed here by hand, not by any
GGUF library, so that each defect is exactly the one intended. Rerun after changing a case:
    python3 tests/gguf/make_malformed.py
"""
import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "malformed")

MAGIC = 0x46554747
T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64 = 4, 5, 6, 7, 8, 9, 10
F32, Q8_0 = 0, 8


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def header(n_tensors, n_kv, version=3, magic=MAGIC):
    return struct.pack("<IIQQ", magic, version, n_tensors, n_kv)


def tinfo(name, ne, gtype, offset):
    return s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + \
        struct.pack("<IQ", gtype, offset)


def pad(b, align=32):
    return b + b"\0" * ((-len(b)) % align)


def file_with(kvs=(), tensors=(), data=b"", align=32, **hk):
    body = header(len(tensors), len(kvs), **hk) + b"".join(kvs) + b"".join(tensors)
    return pad(body, align) + data


name_kv = kv("general.name", T_STRING, s("broken"))
f32x8 = struct.pack("<8f", *range(8))

cases = {
    "empty.gguf": (b"", "empty file"),
    "bad_magic.gguf": (file_with(magic=0x46554746), "bad magic"),
    "version_2.gguf": (file_with(version=2), "GGUF version 2 is not supported"),
    "truncated_header.gguf": (header(0, 0)[:12], "truncated file: tensor count"),
    "kv_count_huge.gguf": (header(0, 1 << 60) + name_kv, "metadata count 1152921504606846976 cannot fit"),
    "tensor_count_huge.gguf": (header(1 << 59, 0), "tensor count 576460752303423488 cannot fit"),
    "key_length_huge.gguf": (header(0, 1) + struct.pack("<Q", 1 << 40) + b"abc" + b"\0" * 16,
                             "metadata key #0 has length 1099511627776"),
    "string_value_truncated.gguf": (header(0, 1) + s("general.name") + struct.pack("<IQ", T_STRING, 100) + b"short",
                                    "metadata key 'general.name' has length 100"),
    "unknown_value_type.gguf": (header(0, 1) + s("k") + struct.pack("<I", 13) + b"\0" * 8,
                                "metadata key 'k' has unknown value type 13"),
    "bool_invalid.gguf": (header(0, 1) + kv("flag", T_BOOL, b"\x02") + b"\0" * 8, "bool byte is 2"),
    "array_count_huge.gguf": (header(0, 1) + kv("arr", T_ARRAY, struct.pack("<IQ", T_U32, 1 << 62)) + b"\0" * 64,
                              "array of 4611686018427387904 u32 items cannot fit"),
    "array_unknown_item_type.gguf": (header(0, 1) + kv("arr", T_ARRAY, struct.pack("<IQ", 77, 1)) + b"\0" * 8,
                                     "unknown array item type 77"),
    "array_too_deep.gguf": (header(0, 1) + s("deep") + struct.pack("<I", T_ARRAY) +
                            struct.pack("<IQ", T_ARRAY, 1) * 9 + struct.pack("<IQ", T_U32, 0) + b"\0" * 8,
                            "arrays nested deeper than 8"),
    "duplicate_key.gguf": (file_with(kvs=[name_kv, name_kv]), "duplicate metadata key 'general.name'"),
    "alignment_wrong_type.gguf": (file_with(kvs=[kv("general.alignment", T_U64, struct.pack("<Q", 32))]),
                                  "general.alignment has type u64, expected u32"),
    "alignment_not_pow2.gguf": (file_with(kvs=[kv("general.alignment", T_U32, struct.pack("<I", 48))]),
                                "general.alignment is 48, expected a non-zero power of two"),
    "n_dims_zero.gguf": (file_with(tensors=[s("t") + struct.pack("<I", 0) + struct.pack("<IQ", F32, 0)], data=f32x8),
                         "tensor 't' has 0 dimensions"),
    "n_dims_nine.gguf": (file_with(tensors=[tinfo("t", [1] * 9, F32, 0)], data=f32x8),
                         "tensor 't' has 9 dimensions"),
    "dims_overflow.gguf": (file_with(tensors=[tinfo("t", [1 << 32, 1 << 32], F32, 0)], data=f32x8),
                           "overflows the element count"),
    "dim_too_large.gguf": (file_with(tensors=[tinfo("t", [1 << 63], F32, 0)], data=f32x8),
                           "ne[0] = 9223372036854775808 is too large"),
    "unknown_ggml_type.gguf": (file_with(tensors=[tinfo("t", [8], 99, 0)], data=f32x8),
                               "tensor 't' has unknown ggml type 99"),
    "row_not_block_multiple.gguf": (file_with(tensors=[tinfo("w", [33, 2], Q8_0, 0)], data=b"\0" * 136),
                                    "row length ne[0] = 33 is not a multiple of the Q8_0 block size 32"),
    "offset_misaligned.gguf": (file_with(tensors=[tinfo("t", [2], F32, 8)], data=pad(f32x8)),
                               "tensor 't' offset 8 is not a multiple of the alignment 32"),
    "tensor_past_end.gguf": (file_with(tensors=[tinfo("t", [64], F32, 0)], data=f32x8),
                             "tensor 't' (F32 [64], 256 bytes at data offset 0) extends past the end"),
    "tensor_offset_huge.gguf": (file_with(tensors=[tinfo("t", [8], F32, 1 << 63)], data=f32x8),
                                "extends past the end of the file"),
    "tensors_overlap.gguf": (file_with(tensors=[tinfo("a", [16], F32, 0), tinfo("b", [8], F32, 32)],
                                       data=pad(f32x8 * 4)),
                             "tensors 'a' (bytes 0..64) and 'b' (bytes 32..64) overlap"),
    "duplicate_tensor.gguf": (file_with(tensors=[tinfo("t", [8], F32, 0), tinfo("t", [8], F32, 32)],
                                        data=pad(f32x8) + pad(f32x8)),
                              "duplicate tensor name 't'"),
    "truncated_tensor_info.gguf": (header(1, 0) + s("t" * 40) + struct.pack("<I", 2) + struct.pack("<Q", 8),
                                   "truncated file: tensor '" + "t" * 40 + "' ne[1] needs 8 bytes"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        if old.endswith(".gguf"):
            os.remove(os.path.join(OUT, old))
    manifest = {}
    for name, (blob, expect) in sorted(cases.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(blob)
        manifest[name] = expect
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(cases)} malformed files to {OUT}")


if __name__ == "__main__":
    main()
