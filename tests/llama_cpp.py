"""llama.cpp as the GGUF oracle: its converter, its gguf-py and its quantizer (libllama through ctypes), all from
llama-cpp-python's source distribution, which vendors llama.cpp; scripts/llama_cpp builds it into .cache/."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.3.36"  # llama-cpp-python, as scripts/llama_cpp fetches it
HOME = Path(os.environ.get("SYMPARAM_LLAMA_CPP", ROOT / ".cache" / f"llama-cpp-python-{VERSION}"))
SOURCE = HOME / "src" / "vendor" / "llama.cpp"
LIBRARY = HOME / "build" / "bin" / "libllama.so"

# The converter without a tokenizer: a tiny random model has none, and the quantizer never reads the vocabulary.
CONVERT = """
import sys
src, model_dir, out, outtype = sys.argv[1:5]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion
found = conversion.get_model_class
def without_vocab(name, mmproj=False):
    cls = found(name, mmproj)
    cls.set_vocab = lambda self: None
    return cls
conversion.get_model_class = without_vocab
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype]
convert_hf_to_gguf.main()
"""


def available() -> str | None:
    """Why the oracle cannot run here, or None."""
    if not (SOURCE / "convert_hf_to_gguf.py").exists() or not LIBRARY.exists():
        return f"llama.cpp not built at {HOME}: run scripts/llama_cpp"
    return None


@cache
def gguf():
    """The gguf-py package vendored with this llama.cpp (the reader and writer of the same version)."""
    sys.path.insert(0, str(SOURCE / "gguf-py"))
    import gguf as module

    return module


def convert(model_dir: Path, out: Path, outtype: str = "bf16") -> None:
    """convert_hf_to_gguf.py on a saved transformers model."""
    done = subprocess.run([sys.executable, "-c", CONVERT, str(SOURCE), str(model_dir), str(out), outtype], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {model_dir}: {done.stderr[-600:]}")


class ImatrixEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)), ("size", ctypes.c_size_t)]


class QuantizeParams(ctypes.Structure):  # llama.h's llama_model_quantize_params, this version
    _fields_ = [
        ("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
        ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool), ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool), ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.POINTER(ImatrixEntry)), ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t),
    ]


LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_log: list[str] = []
_collect = LOG(lambda level, text, data: _log.append(text.decode(errors="replace")))
# llama_model_quantize's line per tensor: "[  3/ 99]  blk.0.attn_v.weight - [ 256, 64, 1, 1], type = bf16, size = ..."
# with "converting to q6_K .. " when it changes the type, or "-> x MiB (q6_K)" in a dry run
TENSOR_LINE = re.compile(r"\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), (?:converting to (\S+) \.\. )?size =\s*[\d.]+ MiB(?: ->\s*[\d.]+ MiB(?: \((\S+)\))?)?")


@cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(LIBRARY))
    lib.llama_model_quantize_default_params.restype = QuantizeParams
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_log_set.argtypes = [LOG, ctypes.c_void_p]
    lib.llama_log_set(_collect, None)
    lib.llama_backend_init()
    return lib


def quantize(inp: Path, out: Path, ftype: int, imatrix: dict[str, int] | None = None, dry_run: bool = False) -> dict[str, str]:
    """llama_model_quantize, as llama-quantize runs it; `imatrix` gives each tensor's importance-vector length (all
    ones). The type it gives each tensor, from its log (a dry run writes no file: llama-quantize --dry-run)."""
    lib = library()
    params = lib.llama_model_quantize_default_params()
    params.ftype = ftype
    params.dry_run = dry_run
    params.nthread = 2
    keep = []
    if imatrix:
        entries = (ImatrixEntry * (len(imatrix) + 1))()
        for k, (name, size) in enumerate(imatrix.items()):
            ones = (ctypes.c_float * size)(*([1.0] * size))
            keep.append(ones)
            entries[k] = ImatrixEntry(name.encode(), ctypes.cast(ones, ctypes.POINTER(ctypes.c_float)), size)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(ImatrixEntry))
        keep.append(entries)
    _log.clear()
    if lib.llama_model_quantize(str(inp).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for ftype {ftype}: {''.join(_log)[-300:]}")
    return {name: (new or planned or old).upper() for name, old, new, planned in TENSOR_LINE.findall("".join(_log))}


def read(path: Path) -> tuple[dict[str, tuple[str, int, tuple[int, ...]]], int]:
    """Each tensor of a GGUF file as (type, bytes, shape in PyTorch order), and the bytes of its data section."""
    reader = gguf().GGUFReader(str(path))
    tensors = {t.name: (t.tensor_type.name, int(t.n_bytes), tuple(int(x) for x in reversed(t.shape))) for t in reader.tensors}
    start = min(int(t.data_offset) for t in reader.tensors)
    return tensors, path.stat().st_size - start


# llama.cpp's own type-selection test API (src/llama-ext.h, C++ symbols): a model described by its sizes, its tensors
# as shapes without data; the types llama_tensor_get_type gives them, for real configs of any size, without files.
class ModelDesc(ctypes.Structure):
    _fields_ = [("architecture", ctypes.c_char_p)] + [(k, ctypes.c_uint32) for k in (
        "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "n_expert", "n_embd_head_k", "n_embd_head_v")]


class GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


EXT = {
    "model": "_Z31llama_quant_model_from_metadataPK22llama_quant_model_desc",
    "init": "_Z16llama_quant_initPK11llama_modelPK27llama_model_quantize_params",
    "allows": "_Z38llama_quant_tensor_allows_quantizationPK19quantize_state_implPK11ggml_tensor",
    "compute": "_Z25llama_quant_compute_typesP19quantize_state_impl11llama_ftypePP11ggml_tensorP9ggml_typem",
    "free": "_Z16llama_quant_freeP19quantize_state_impl",
}


@cache
def _ext():
    lib = library()
    ggml = ctypes.CDLL(str(LIBRARY.parent / "libggml-base.so"))
    ggml.ggml_init.argtypes, ggml.ggml_init.restype = [GgmlInitParams], ctypes.c_void_p
    ggml.ggml_tensor_overhead.restype = ctypes.c_size_t
    ggml.ggml_new_tensor_4d.argtypes = [ctypes.c_void_p, ctypes.c_int, *[ctypes.c_int64] * 4]
    ggml.ggml_new_tensor_4d.restype = ctypes.c_void_p
    ggml.ggml_set_name.argtypes, ggml.ggml_set_name.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
    ggml.ggml_free.argtypes = [ctypes.c_void_p]
    ggml.ggml_type_name.argtypes, ggml.ggml_type_name.restype = [ctypes.c_int], ctypes.c_char_p
    f = {k: lib[v] for k, v in EXT.items()}
    f["model"].argtypes, f["model"].restype = [ctypes.POINTER(ModelDesc)], ctypes.c_void_p
    f["init"].argtypes, f["init"].restype = [ctypes.c_void_p, ctypes.POINTER(QuantizeParams)], ctypes.c_void_p
    f["allows"].argtypes, f["allows"].restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_bool
    f["compute"].argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_size_t]
    f["free"].argtypes = [ctypes.c_void_p]
    lib.llama_model_free.argtypes = [ctypes.c_void_p]
    return lib, ggml, f


def choose_types(desc: dict[str, int | str], tensors: list[tuple[str, tuple[int, ...]]], ftypes: list[int]) -> dict[int, dict[str, str]]:
    """For each ftype, the type llama.cpp chooses for each tensor it would quantize (names and PyTorch-order shapes)."""
    lib, ggml, f = _ext()
    d = ModelDesc(str(desc["architecture"]).encode(), *(int(desc.get(k, 0)) for k, _ in ModelDesc._fields_[1:]))
    model = f["model"](ctypes.byref(d))
    params = lib.llama_model_quantize_default_params()
    qs = f["init"](model, ctypes.byref(params))
    ctx = ggml.ggml_init(GgmlInitParams(len(tensors) * ggml.ggml_tensor_overhead() + 4096, None, True))
    try:
        made = []
        for name, shape in tensors:
            ne = [*reversed(shape), *[1] * (4 - len(shape))]
            t = ggml.ggml_new_tensor_4d(ctx, 0, *ne)
            ggml.ggml_set_name(t, name.encode())
            if f["allows"](qs, t):
                made.append((name, t))
        out = {}
        for ftype in ftypes:
            array = (ctypes.c_void_p * len(made))(*[t for _, t in made])
            types = (ctypes.c_int * len(made))()
            f["compute"](qs, ftype, array, types, len(made))
            out[ftype] = {name: ggml.ggml_type_name(types[k]).decode().upper() for k, (name, _) in enumerate(made)}
        return out
    finally:
        ggml.ggml_free(ctx)
        f["free"](qs)
        lib.llama_model_free(model)
