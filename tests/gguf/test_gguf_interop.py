"""GGUF interop with gguf-py, the reference Python implementation (an independent oracle).

1. gguf-py's GGUFWriter writes files with every value type and many tensor types; our reader
   (through ds4-gguf-dump --json --hash) must see exactly what gguf-py's GGUFReader sees.
2. Our writer writes a file (ds4-test-gguf-write-sample); gguf-py's GGUFReader must read back
   exactly the values and tensor bytes our writer says it wrote.
"""
import hashlib
import json
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402

VT_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def unhex(v):
    """ds4-gguf-dump encodes strings as {"hex": ...}; decode recursively to python values."""
    if isinstance(v, dict) and "hex" in v:
        return bytes.fromhex(v["hex"]).decode("utf-8")
    if isinstance(v, dict) and "items" in v:
        return [unhex(x) for x in v["items"]]
    return v


def flatten(v):
    if isinstance(v, list):
        out = []
        for x in v:
            out.extend(flatten(x))
        return out
    return [v]


def reader_fields(path):
    r = GGUFReader(path)
    fields = {}
    for name, f in r.fields.items():
        if name.startswith("GGUF."):
            continue
        fields[name] = (VT_NAMES[f.types[0]], f.contents())
    tensors = {}
    for t in r.tensors:
        raw = np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        tensors[t.name] = dict(type_id=int(t.tensor_type), ne=[int(x) for x in t.shape],
                               n_bytes=int(t.n_bytes), sha256=hashlib.sha256(raw).hexdigest(), raw=raw)
    return r, fields, tensors


def write_with_gguf_py(path, alignment=None):
    rng = np.random.default_rng(7)
    w = GGUFWriter(str(path), "deepseek4")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("a.u8", 7)
    w.add_int8("a.i8", -7)
    w.add_uint16("a.u16", 65535)
    w.add_int16("a.i16", -32768)
    w.add_uint32("a.u32", 1 << 31)
    w.add_int32("a.i32", -(1 << 31))
    w.add_float32("a.f32", -0.1)
    w.add_uint64("a.u64", (1 << 64) - 1)
    w.add_int64("a.i64", -(1 << 63))
    w.add_float64("a.f64", 1e300)
    w.add_bool("a.bool", True)
    w.add_string("a.str", "ｄｓｍｌ ｜DSML｜ \n\t")
    w.add_array("a.ints", [1, -2, 3])
    w.add_array("a.floats", [0.25, -1.5])
    w.add_array("a.strs", ["Ġ", "ĊĊ", "<｜begin▁of▁sentence｜>"])
    w.add_key_value("a.nested", [[1, 2], [3, 4, 5]], GGUFValueType.ARRAY, sub_type=GGUFValueType.ARRAY)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    w.add_tensor("i32", rng.integers(-5, 5, (4, 6)).astype(np.int32))
    for name, qt, rows, row_bytes in [("q8_0", Q.Q8_0, 3, 34 * 2), ("q2_k", Q.Q2_K, 2, 84),
                                      ("q4_k", Q.Q4_K, 2, 144 * 2), ("iq2_xxs", Q.IQ2_XXS, 2, 66),
                                      ("mxfp4", Q.MXFP4, 4, 17), ("bf16", Q.BF16, 2, 16)]:
        raw = rng.integers(0, 256, (rows, row_bytes), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_our_reader_reads_gguf_py_files(tool, tmp, alignment):
    path = tmp / "from_gguf_py.gguf"
    write_with_gguf_py(path, alignment)
    ours = json.loads(subprocess.run([tool("ds4-gguf-dump"), "--json", "--hash", str(path)],
                                     check=True, capture_output=True).stdout)
    r, fields, tensors = reader_fields(str(path))
    assert ours["alignment"] == r.alignment
    assert ours["data_offset"] == r.data_offset
    assert [m["key"] for m in ours["metadata"]] == list(fields)
    for m in ours["metadata"]:
        vtype, contents = fields[m["key"]]
        assert m["type"] == vtype, m["key"]
        ours_value = unhex(m["value"])
        # gguf-py flattens nested arrays when it reports contents.
        if isinstance(ours_value, list) and ours_value and isinstance(ours_value[0], list):
            ours_value = flatten(ours_value)
        if vtype in ("f32",):
            assert np.float32(ours_value) == np.float32(contents), m["key"]
        else:
            assert ours_value == contents, m["key"]
    assert [t["name"] for t in ours["tensors"]] == list(tensors)
    for t in ours["tensors"]:
        ref = tensors[t["name"]]
        assert t["type_id"] == ref["type_id"], t["name"]
        assert t["ne"] == ref["ne"], t["name"]
        assert t["n_bytes"] == ref["n_bytes"], t["name"]
        assert t["sha256"] == ref["sha256"], t["name"]


@pytest.mark.parametrize("alignment", [None, 64, 4096])
def test_gguf_py_reads_our_files(tool, tmp, alignment):
    path = tmp / "from_ds4.gguf"
    cmd = [tool("ds4-test-gguf-write-sample"), str(path)] + ([str(alignment)] if alignment else [])
    wrote = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
    r, fields, tensors = reader_fields(str(path))
    assert r.alignment == wrote["alignment"]
    assert [m["key"] for m in wrote["metadata"]] == list(fields)
    for m in wrote["metadata"]:
        vtype, contents = fields[m["key"]]
        assert vtype == m["type"], m["key"]
        expect = m["value"]
        if isinstance(expect, list) and expect and isinstance(expect[0], list):
            expect = flatten(expect)
        if vtype == "f32":
            assert np.float32(contents) == np.float32(expect), m["key"]
        else:
            assert contents == expect, m["key"]
    assert [t["name"] for t in wrote["tensors"]] == list(tensors)
    for t in wrote["tensors"]:
        ref = tensors[t["name"]]
        assert ref["type_id"] == t["type_id"], t["name"]
        assert ref["ne"] == t["ne"], t["name"]
        assert ref["raw"] == bytes.fromhex(t["hex"]), t["name"]
        offset = r.tensors[list(tensors).index(t["name"])].data_offset
        assert offset % wrote["alignment"] == 0, t["name"]


def test_malformed_file_exit_code(tool, tmp):
    path = tmp / "bad.gguf"
    path.write_bytes(b"GGUF\x02\x00\x00\x00" + b"\x00" * 16)
    p = subprocess.run([tool("ds4-gguf-dump"), str(path)], capture_output=True, text=True)
    assert p.returncode == 2
    assert "GGUF version 2 is not supported" in p.stderr
