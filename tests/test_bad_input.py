"""Bad input gets one line naming the field and the problem, exit code 2, no traceback, nothing written, an answer within
seconds: the config loader, the CLI's options and every kind of bad input the fuzz report found, each fixed at its root."""

import contextlib
import io
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from symparam.cli import main
from symparam.config import MAX_CONFIG, read_preset, resolve
from symparam.errors import SymparamError
from symparam.files import write_atomic
from symparam.model import Model
from symparam.whatif import MAX_ROWS

LLAMA = read_preset("llama-2-7b")
OLMOE = {"model_type": "olmoe", "vocab_size": 10, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 1, "num_experts": 2, "num_experts_per_tok": 1}
QWEN3_MOE = read_preset("qwen3-235b-a22b")


def config_error(capsys, tmp_path, text: str) -> str:
    """Run `count --config` on a file with this text; return stderr after checking the error contract."""
    path = tmp_path / "config.json"
    path.write_text(text)
    code = main(["count", "--config", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("symparam: error: ") and err.count("\n") == 1
    return err


def with_(base, **changes):
    return json.dumps({**base, **changes})


def without(base, key):
    return json.dumps({k: v for k, v in base.items() if k != key})


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ("42", "expected a JSON object"),
        (without(LLAMA, "hidden_size"), "hidden_size"),
        (without(LLAMA, "vocab_size"), "vocab_size"),
        (with_(LLAMA, hidden_size="4096"), "hidden_size"),
        (with_(LLAMA, hidden_size=True), "hidden_size"),
        (with_(LLAMA, hidden_size=0), "hidden_size"),
        (with_(LLAMA, num_hidden_layers=-3), "num_hidden_layers"),
        (with_(LLAMA, intermediate_size=11008.5), "intermediate_size"),
        (with_(LLAMA, hidden_size=4096.0), "hidden_size"),
        (with_(LLAMA, num_key_value_heads=5), "num_key_value_heads"),
        (with_(LLAMA, model_type="not-a-model", architectures=["NotAModelForCausalLM"]), "model_type"),  # a known class would be read as its family
        (json.dumps({k: v for k, v in LLAMA.items() if k not in ("model_type", "architectures")}), "model_type"),  # with a known class it reads as that family
        (with_(LLAMA, tie_word_embeddings="yes"), "tie_word_embeddings"),
        (with_(LLAMA, tie_word_embeddings=None), "tie_word_embeddings: expected true or false, got null"),
        (with_(LLAMA, attention_bias=1), "attention_bias"),
        (with_(LLAMA, hidden_size=4000, num_attention_heads=3), "head_dim"),
        (with_(QWEN3_MOE, num_experts_per_tok=200), "num_experts_per_tok"),
        (with_(QWEN3_MOE, decoder_sparse_step=0), "decoder_sparse_step"),
        (with_(QWEN3_MOE, mlp_only_layers="0,1"), "mlp_only_layers"),
        (with_(LLAMA, hidden_size=float("nan")), "hidden_size: expected a positive integer (hidden size), got nan"),
        (with_(LLAMA, hidden_size=float("inf")), "hidden_size: expected a positive integer (hidden size), got inf"),
        # OLMoE sizes k_norm by hidden_size // heads: 70 // 4 would silently floor, so we refuse it
        (with_(OLMOE, hidden_size=70, head_dim=16), "k_norm"),
    ],
)
def test_bad_config_names_the_field(capsys, tmp_path, text, names):
    assert names in config_error(capsys, tmp_path, text)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["count", "--model", "gpt5"], "gpt5"),
        (["count", "--arch", "transformer-xl", "--set", "d=1"], "transformer-xl"),
        (["count", "--config", "/no/such/config.json"], "/no/such/config.json"),
        (["count", "--model", "gpt2", "--set", "depth=3"], "depth"),
        (["count", "--model", "gpt2", "--set", "d=12.5"], "--set d"),
        (["count", "--model", "gpt2", "--set", "d"], "SYMBOL=INT"),
        (["count", "--arch", "llama", "--set", "d=4096"], "num_hidden_layers"),
        (["count", "--recipe", "/no/such/recipe.toml"], "/no/such/recipe.toml"),
        (["count"], "--model"),
        (["count", "--model", "gpt2", "--arch", "llama"], "model_type: 'gpt2' is not a llama config"),
        (["derive", "--model", "nope", "--markdown"], "nope"),
        (["count", "--model", "gpt2", "--as", "nope"], "--as: unknown family 'nope'"),
        (["count", "--arch", "llama", "--as", "qwen3"], "--as: give it with --model or --config, not with --arch or --recipe"),
        (["count", "--as", "qwen3"], "--as: reads a config as a family; give --model NAME or --config FILE"),
    ],
)
def test_bad_arguments_name_the_problem(capsys, argv, names):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert names in err and err.count("\n") == 1


def test_derive_of_an_empty_config_names_the_missing_model_type(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{}")
    code = main(["derive", "--config", str(path), "--markdown"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "model_type" in err and err.count("\n") == 1


NEMOTRON = {"model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
            "mamba_num_heads": 2, "mamba_head_dim": 8, "n_groups": 1, "ssm_state_size": 4}
HEADER = 'family = "x"\nmodel_types = ["x"]\n'
GPT_OSS = {"model_type": "gpt_oss", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 2,
           "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1}


@pytest.mark.parametrize(
    ("recipe", "names"),
    [
        (HEADER + "[attention]\nkind = \"linear\"\n", "unknown section 'attention'"),
        (HEADER + "[bogus]\n", "bogus"),
        ('family = "x"\n', "model_types"),
        ("family = ", "not valid TOML"),
        (HEADER + '[blocks.decoder_layer]\nextra = { shape = ["d", "zz"] }\n', "unknown symbol 'zz'"),
        (HEADER + '[symbols]\na1 = { latex = "a_1", meaning = "a", default = "a2" }\na2 = { latex = "a_2", meaning = "b", default = "a1" }\n', "cycle: a1 -> a2 -> a1"),
        (HEADER + '[symbols]\nq1 = { latex = "q_1" }\n', "a new symbol needs latex and meaning"),
        (HEADER + '[blocks.decoder_layer]\nmlp = { block = "no_such_block" }\n', "unknown block 'no_such_block'"),
        (HEADER + '[blocks.decoder_layer]\nmlp = { block = "mlp", width = "d" }\n', "has no argument 'width'"),
        (HEADER + '[switches]\nqk_norm = "__import__(1)"\n', "qk_norm"),
        (HEADER + '[symbols]\nN_dense = { layers = "i <" }\n', "N_dense"),
        (HEADER + '[blocks.decoder_layer]\nmlp = [{ block = "mlp", count = "d" }, { block = "moe" }]\n', "count 'd' is not a layer-count symbol"),
        (HEADER + '[blocks.decoder_layer]\nextra = { shape = ["d/3"] }\n', "not a whole number"),
    ],
)
def test_bad_recipe_names_the_problem(capsys, tmp_path, recipe, names):
    path = tmp_path / "r.toml"
    path.write_text(recipe)
    code = main(["count", "--recipe", str(path), "--set", "V=10", "d=8", "N=1", "h=2", "d_ff=16"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and names in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({**GPT_OSS, "layer_types": ["sliding_attention"]}, "layer_types: has 1 entries, expected N (num_hidden_layers = 2)"),
        ({**GPT_OSS, "layer_types": ["sliding_attention", "linear_attention"]}, "layer_types: unknown kind 'linear_attention' at layer 1"),
        ({**GPT_OSS, "layer_types": "sliding_attention"}, "layer_types: expected a list"),
        ({**NEMOTRON, "layers_block_type": ["mamba", "hybrid"]}, "layers_block_type: unknown kind 'hybrid' at layer 1; known: linear_attention, moe, full_attention, mlp (and the legacy mamba, attention)"),
        ({**NEMOTRON, "layers_block_type": ["mamba", "attention", "mlp"], "num_hidden_layers": 4}, "layers_block_type: has 3 entries, expected N (num_hidden_layers = 4)"),
        ({**NEMOTRON, "hybrid_override_pattern": "M*X"}, "hybrid_override_pattern: unknown kind 'X' at layer 2"),
        ({**NEMOTRON, "num_hidden_layers": 52}, "hybrid_override_pattern: has 4 entries (transformers' default, the config gives none), expected N (num_hidden_layers = 52)"),
        ({**OLMOE, "model_type": "deepseek_v3", "first_k_dense_replace": "1", "n_routed_experts": 2, "kv_lora_rank": 4,
          "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4, "moe_intermediate_size": 8}, "first_k_dense_replace"),
    ],
)
def test_bad_layer_layout_names_the_field(capsys, tmp_path, config, names):
    err = config_error(capsys, tmp_path, json.dumps(config))
    assert names in err, err


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"model_type": "llava", "vision_config": {}}, "text_config: missing; a llava config keeps its language model (llama) there"),
        ({"model_type": "llava", "text_config": {}}, "text_config: empty; a llava config keeps the config of its language model (llama) there"),
        ({"model_type": "llava", "text_config": [1, 2]}, "text_config: expected an object, the config of a llava config's language model (llama); got [1, 2]"),
        ({"model_type": "llava", "text_config": "llama"}, 'text_config: expected an object'),
        ({"model_type": "my_vlm", "text_config": {"model_type": "not_a_model", "hidden_size": 64}}, "text_config.model_type: unsupported 'not_a_model'; nearest families"),
        ({"model_type": "my_vlm", "text_config": {"hidden_size": 64}}, "text_config.model_type: unsupported None"),
        ({"model_type": "florence2", "text_config": {"model_type": "bart"}}, "text_config.model_type: 'bart' is out of scope: the decoder of an encoder-decoder model"),
        ({"model_type": "jev", "text_config": {"model_type": "qwen3_5_text"}}, "model_type: a jev config is not counted: a decision model"),
        ({"model_type": "my_vlm", "tie_word_embeddings": "yes", "text_config": LLAMA}, "tie_word_embeddings: expected true or false, got \"yes\""),
        ({"model_type": "ovis2", "tie_word_embeddings": False, "text_config": LLAMA},
         "vocab_size: this ovis2 config sizes its untied LM head by its own vocab_size (151643) and its language model by text_config's (32000)"),
    ],
)
def test_a_wrapper_without_a_language_model_it_can_count_is_one_line(capsys, tmp_path, config, says):
    """A multimodal config whose language sub-config is missing, empty, not an object or of a type no family reads."""
    assert says in config_error(capsys, tmp_path, json.dumps(config))


def test_a_json_document_nested_100000_deep_is_the_usual_error(capsys, tmp_path):
    err = config_error(capsys, tmp_path, "[" * 100_000 + "]" * 100_000)
    assert "nested too deeply" in err


def test_a_utf8_bom_is_accepted(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA), encoding="utf-8-sig")
    assert main(["count", "--config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 6_738_415_616  # Llama-2-7B, the published figure


def test_a_duplicate_key_warns_and_the_last_wins(capsys, tmp_path):
    path = tmp_path / "config.json"
    text = json.dumps(LLAMA)[:-1] + ', "num_hidden_layers": 1}'  # LLAMA has 32 layers; the repeat says 1
    path.write_text(text)
    assert main(["count", "--config", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "num_hidden_layers" in captured.err and "last value wins" in captured.err and captured.err.count("\n") == 1
    d, d_ff, V = 4096, 11008, 32000
    assert json.loads(captured.out)["total"] == 2 * V * d + d + (4 * d * d + 3 * d * d_ff + 2 * d)  # one Llama layer


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from([LLAMA, QWEN3_MOE, read_preset("deepseek-v3"), read_preset("gpt2")]), data=st.data())
def test_fuzzed_configs_either_count_exactly_or_fail_cleanly(base, data):
    keys = st.sampled_from(sorted(base) + ["head_dim", "n_inner", "mlp_only_layers", "first_k_dense_replace"])
    changes = data.draw(st.dictionaries(keys, JSON_VALUES, max_size=4))
    dropped = data.draw(st.sets(st.sampled_from(sorted(base)), max_size=3))
    raw = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
    try:
        count = Model.from_resolved(resolve(raw)).count()
    except SymparamError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert type(count.total) is int and count.total > 0
    if count.active is None:  # one token's share needs k, which the fuzzed config no longer sets: the total does not
        assert raw.get("num_experts_per_tok") is None
    else:
        assert 0 < count.active <= count.total


@settings(max_examples=100, deadline=None)
@given(st.one_of(JSON_VALUES, st.lists(JSON_VALUES), st.text()))
def test_fuzzed_documents_fail_cleanly(raw):
    with pytest.raises(SymparamError):
        resolve(raw)


# --- the CLI fuzzed: every kind of bad input that broke the contract, fixed at its root ----------------------------
#
# The contract: exit 2, exactly one stderr line "symparam: error: ...", nothing on stdout, no traceback, no file written
# or replaced, an answer within seconds. Cases that could hang or eat memory if a root regressed run in a subprocess
# with a timeout (the hang detector) and an address-space limit; the rest run in-process.

CLI = [sys.executable, "-m", "symparam.cli"]
HANG = 60  # seconds: a case still running then has hung (each answers in about one)
MEMORY = 2 * 2**30  # bytes of address space a case may map: a bomb fails fast instead of filling the machine
ROOT = os.geteuid() == 0


def one_line(code: int, out: str, err: str, says: str = "") -> str:
    """The bad-input contract on one run's exit code, stdout and stderr; returns the message."""
    assert code == 2 and out == "", (code, out[:300], err[-2000:])
    assert err.startswith("symparam: error: ") and err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    assert says in err, err
    return err


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def run(argv: list[str], cwd: Path, powerless: bool = False, **kw) -> tuple[int, str, str]:
    """The CLI in a fresh process, stopped as hung after HANG seconds; `powerless`: without root's power to ignore
    file permissions (setpriv drops every capability, as an ordinary user has none)."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8", **kw.pop("env", {})}
    prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if powerless and ROOT else []
    proc = subprocess.run(prefix + CLI + argv, cwd=cwd, capture_output=True, text=True, timeout=HANG, env=env, preexec_fn=limited, **kw)
    return proc.returncode, proc.stdout, proc.stderr


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` with its type, size, inode and modification time: a file written or replaced shows."""
    out = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        out[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_ino, info.st_mtime_ns)
    return out


@pytest.fixture
def place(tmp_path):
    """A directory of bad things to name: a FIFO, a file in the way, a symlink loop, a directory, bad CSVs, a sparse
    file larger than any config, and recipes and configs that bomb."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("{}")
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "dir").mkdir()
    (tmp_path / "latin1.csv").write_bytes(b"d\n4096\n\xe9\n")
    with open(tmp_path / "sparse.json", "wb") as f:
        f.truncate(MAX_CONFIG + 1)
    (tmp_path / "digits.json").write_text(json.dumps(LLAMA)[:-1] + ', "hidden_size": ' + "9" * 5000 + "}")
    (tmp_path / "xlstm.json").write_text(json.dumps({"model_type": "xlstm", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2,
                                                     "num_heads": 4, "qk_dim_factor": float("inf")}))
    for name, text in RECIPE_BOMBS.items():
        (tmp_path / f"{name}.toml").write_text(HEADER + text)
    return tmp_path


def fan_out(levels: int, width: int) -> str:
    """Blocks that each hold `width` copies of the next: width**levels tensors from a few lines."""
    blocks = "".join(f"[blocks.b{i}]\n" + "".join(f'x{j} = {{ block = "b{i + 1}" }}\n' for j in range(width)) for i in range(levels))
    return f'[blocks.decoder_layer]\nextra = {{ block = "b0" }}\n{blocks}[blocks.b{levels}]\nw = {{ shape = ["d"] }}\n'


RECIPE_BOMBS = {
    "power": '[blocks.decoder_layer]\nextra = { shape = ["d**99999999"] }\n',
    "constant": '[blocks.decoder_layer]\nextra = { shape = ["2**99999999999"] }\n',
    "modulo": '[blocks.decoder_layer]\nextra = { shape = ["d%0"] }\n',
    "sum": '[blocks.decoder_layer]\nextra = { shape = ["' + "+".join(["d"] * 20_000) + '"] }\n',
    "nested": "[blocks.decoder_layer]\nextra = { shape = [\"" + "d+(" * 60 + "d" + ")" * 60 + "\"] }\n",
    "degree": '[blocks.decoder_layer]\nextra = { shape = ["((d**8)**8)**8"] }\n',
    "fan": fan_out(10, 16),  # 16**10 = 2**40 tensors
    "chain": fan_out(200, 1),  # 200 blocks deep
    "deep": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "format": '[checks]\n"d > 0" = "{h.__class__.__init__.__globals__}"\n',
    "format_index": '[checks]\n"d > 0" = "{h[0]}"\n',
    "format_spec": '[checks]\n"d > 0" = "{d:,}"\n',
    "format_unknown": '[checks]\n"d > 0" = "{nobody}"\n',
    "repeat": '[switches]\nqk_norm = "len([0] * vocab_size * vocab_size * vocab_size) > 0"\n',
    "digits": "[defaults]\nx = " + "9" * 5000 + "\n",
}
SETS = ["--set", "V=10", "d=8", "N=1", "h=2", "d_ff=16"]

# (argv, what the one line says); {p} is the place. Each kind of the fuzz report, at its root.
PROCESS_CASES = [
    # files: refuse what is not a regular file, read at most a stated size
    (["count", "--config", "{p}/fifo"], "fifo: a FIFO (named pipe), not a regular file"),
    (["count", "--config", "/dev/urandom"], "/dev/urandom: a character device, not a regular file"),
    (["count", "--config", "/dev/zero"], "/dev/zero: a character device, not a regular file"),
    (["count", "--config", "{p}/sparse.json"], f"sparse.json: larger than {MAX_CONFIG:,} bytes, too large for a config.json"),
    (["count", "--recipe", "{p}/fifo"], "fifo: a FIFO (named pipe), not a regular file"),
    (["sweep", "--model", "gpt2", "--csv", "{p}/fifo"], "fifo: a FIFO (named pipe), not a regular file"),
    (["verify", "--model", "gpt2", "--checkpoint", "/dev/zero"], "expected a .safetensors file"),
    (["count", "--model", "gpt2", "--recipe", "/dev/stdin"], "/dev/stdin: a"),
    # numbers that overflowed or never ended
    (["memory", "--model", "gpt2", "--seq", str(10**400)], "--seq: expected a positive integer of at most 9,223,372,036,854,775,807"),
    (["memory", "--model", "gpt2", "--batch", str(10**300)], "--batch: expected a positive integer of at most"),
    (["solve", "--model", "gpt2", "--target", "1e400", "--for", "d"], "--target: expected a whole number of parameters from 1 to 1e+18"),
    (["solve", "--model", "gpt-oss-20b", "--target", "100B", "--for", "N"], "--for N: fixed by the config: its layer_types has 24 entries, one per layer"),
    # recipes: bounded before anything is evaluated
    (["count", "--recipe", "{p}/power.toml", *SETS], "formula 'd**99999999': an exponent of at most 8"),
    (["count", "--recipe", "{p}/constant.toml", *SETS], "formula '2**99999999999': an exponent of at most 8"),
    (["count", "--recipe", "{p}/modulo.toml", *SETS], "formula 'd%0': divides by zero"),
    (["count", "--recipe", "{p}/sum.toml", *SETS], "longer than 2,000 characters"),
    (["count", "--recipe", "{p}/nested.toml", *SETS], "nested more than 50 levels deep"),
    (["count", "--recipe", "{p}/degree.toml", *SETS], "of degree 512 in its symbols; at most 8"),
    (["count", "--recipe", "{p}/fan.toml", *SETS], "expands to more than 10,000 modules and tensors"),
    (["count", "--recipe", "{p}/chain.toml", *SETS], "blocks nested more than 32 deep"),
    (["count", "--recipe", "{p}/deep.toml", *SETS], "deep.toml: nested more than 64 levels deep"),
    (["count", "--recipe", "{p}/repeat.toml", "--config", "{p}/big_vocab.json"], "would make more than 1,000,000 entries"),
    (["count", "--recipe", "{p}/digits.toml", *SETS], "digits.toml: not valid TOML (Exceeds the limit (4300 digits)"),
    # sweeps: refused beyond a stated limit before anything is allocated
    (["sweep", "--model", "gpt2", "--grid", "d=1:10000", "N=1:10000"], f"--grid: 100,000,000 combinations; a sweep takes at most {MAX_ROWS:,} rows"),
    (["sweep", "--model", "gpt2", "--grid", f"d=1:{10**30}"], "--grid d=1:1000000000000000000000000000000: values from 0 to 9,223,372,036,854,775,807"),
]


@pytest.mark.parametrize(("argv", "says"), PROCESS_CASES, ids=lambda x: " ".join(x)[:70] if isinstance(x, list) else None)
def test_a_bad_input_that_could_hang_or_bomb_is_one_line_at_once(place, argv, says):
    (place / "big_vocab.json").write_text(json.dumps({"model_type": "x", "vocab_size": 1000, "hidden_size": 8, "num_hidden_layers": 1,
                                                      "num_attention_heads": 2, "intermediate_size": 16}))
    before = snapshot(place)
    one_line(*run([a.format(p=place) for a in argv], place, stdin=subprocess.DEVNULL), says=says)
    assert snapshot(place) == before


# In-process: quick, and nothing here can hang.
INPROCESS_CASES = [
    # files: names and paths that were tracebacks
    (["count", "--config", "{p}/" + "x" * 300], "file name too long"),
    (["count", "--config", "{p}/file/config.json"], "a part of the path is a file, not a directory"),
    (["count", "--config", "{p}/loop1"], "too many levels of symbolic links"),
    (["count", "--config", "{p}/dir"], "dir: a directory, not a regular file"),
    (["count", "--recipe", "{p}/loop2"], "too many levels of symbolic links"),
    (["count", "--config", "{p}/bad\nname.json"], "bad\\nname.json: no such file"),  # one line whatever the name holds
    (["sweep", "--model", "gpt2", "--csv", "{p}/dir"], "dir: a directory, not a regular file"),
    (["sweep", "--model", "gpt2", "--csv", "{p}/latin1.csv"], "latin1.csv: not UTF-8 text (byte 0xe9 at offset 7); a CSV file is UTF-8"),
    (["verify", "--model", "gpt2", "--checkpoint", "{p}/loop1"], "too many levels of symbolic links"),
    # outputs
    (["derive", "--model", "gpt2", "--markdown", "-o", "{p}/dir"], "dir: a directory; give the path of a file to write"),
    (["derive", "--model", "gpt2", "--markdown", "-o", "{p}/fifo"], "fifo: cannot write (a FIFO with no reader)"),
    (["derive", "--model", "gpt2", "--markdown", "-o", "/dev/full"], "/dev/full: cannot write (no space left on device)"),
    (["derive", "--model", "gpt2", "--markdown", "-o", "{p}/missing/x.md"], "no such directory"),
    (["derive", "--model", "gpt2", "--markdown", "-o", "{p}/file/x.md"], "a part of the path is a file, not a directory"),
    (["derive", "--model", "gpt2", "--markdown", "-o", "{p}/loop1"], "too many levels of symbolic links"),
    (["docs", "--dir", "{p}/file"], "file: not a directory"),
    (["docs", "--check", "--dir", "{p}/file"], "file: not a directory"),
    (["sweep", "--model", "gpt2", "--grid", "N=1,2", "-o", "{p}/dir"], "dir: a directory; give the path of a file to write"),
    # numbers
    (["count", "--config", "{p}/digits.json"], "digits.json: a number of 5,000 digits, more than Python reads (4,300)"),
    (["count", "--config", "{p}/xlstm.json"], "cannot be used with Infinity"),
    (["count", "--model", "deepseek-v3", "--set", "N_dense=100"], "--set N_dense=100: more than the N = 61 layers"),
    (["count", "--model", "gpt-oss-20b", "--set", "N_swa=25"], "--set N_swa=25: more than the N = 24 layers"),
    (["count", "--model", "gpt2", "--set", f"d={2**63}"], "--set d: expected a positive integer of at most 9,223,372,036,854,775,807"),
    (["count", "--model", "gpt2", "--set", "d=" + "9" * 5000], "--set d: expected an integer of at most 4,300 digits"),
    (["solve", "--model", "gpt2", "--target", "1e999999999", "--for", "d"], "--target: expected a whole number of parameters from 1"),
    (["solve", "--model", "gpt2", "--target", "NaN", "--for", "d"], "--target: expected a whole number of parameters from 1"),
    # recipes: a [checks] message reads only plain {symbol} fields
    (["count", "--recipe", "{p}/format.toml", *SETS], "a message may hold only {symbol} fields"),
    (["count", "--recipe", "{p}/format_index.toml", *SETS], "a message may hold only {symbol} fields"),
    (["count", "--recipe", "{p}/format_spec.toml", *SETS], "a message may hold only {symbol} fields"),
    (["count", "--recipe", "{p}/format_unknown.toml", *SETS], "the message's field {nobody} is not a symbol"),
    # sweeps
    (["sweep", "--model", "gpt2", "--grid", "d=1:100:0"], "--grid d=1:100:0: expected START:STOP[:STEP]"),
    # what-if
    (["sensitivity", "--model", "gpt2", "--for", "S"], "--for S: the GPT-2 total does not depend on S; it depends on N, V, d, P"),
    (["sensitivity", "--model", "llama-2-7b", "--for", "h_d"], "--for h_d: h_d follows d/h (not set in the config)"),
    # Hub ids argparse would take for options
    (["count", "--model", "-org/name"], "model: '-org/name' is not a Hub id"),
    (["count", "--config", "-no/such.json"], "-no/such.json: no such file"),
]


@pytest.mark.parametrize(("argv", "says"), INPROCESS_CASES, ids=lambda x: " ".join(x)[:70] if isinstance(x, list) else None)
def test_a_bad_input_is_one_line_and_writes_nothing(place, capsys, argv, says):
    before = snapshot(place)
    code = main([a.format(p=place) for a in argv])
    one_line(code, *capsys.readouterr(), says=says)
    assert snapshot(place) == before


def test_a_csv_of_more_rows_than_a_sweep_takes_is_refused(place, capsys):
    (place / "rows.csv").write_text("N\n" + "12\n" * (MAX_ROWS + 1))
    one_line(main(["sweep", "--model", "gpt2", "--csv", str(place / "rows.csv")]), *capsys.readouterr(),
             says=f"rows.csv: {MAX_ROWS + 1:,} rows; a sweep takes at most {MAX_ROWS:,}")


def test_a_check_message_shows_its_symbols(tmp_path, capsys):
    (tmp_path / "r.toml").write_text(HEADER + '[checks]\n"d > 100" = "d = {d} is too small for h = {h} {{really}}"\n')
    one_line(main(["count", "--recipe", str(tmp_path / "r.toml"), *SETS]), *capsys.readouterr(), says="error: d = 8 is too small for h = 2 {really}\n")


@pytest.mark.parametrize("argv", [["count", "--config", "{p}/unreadable.json"], ["derive", "--model", "gpt2", "--markdown", "-o", "{p}/ro/x.md"],
                                  ["docs", "--dir", "{p}/ro/generated"], ["sweep", "--model", "gpt2", "--grid", "N=1,2", "-o", "{p}/ro/x.csv"]])
def test_unreadable_files_and_read_only_directories_are_one_line(tmp_path, argv):
    """Permissions do not bind root: as root, the CLI runs without its capabilities (setpriv, from util-linux)."""
    assert not ROOT or shutil.which("setpriv"), "as root, this test needs setpriv (util-linux) to drop root's capabilities"
    (tmp_path / "unreadable.json").write_text(json.dumps(LLAMA))
    (tmp_path / "unreadable.json").chmod(0o000)
    (tmp_path / "ro").mkdir(mode=0o555)
    (tmp_path / "ro").chmod(0o555)
    before = snapshot(tmp_path)
    try:
        one_line(*run([a.format(p=tmp_path) for a in argv], tmp_path, powerless=True), says="permission denied")
        assert snapshot(tmp_path) == before
    finally:
        (tmp_path / "ro").chmod(0o755)


# --- outputs onto special files: written through, or refused, never renamed over ---------------------------------


def test_an_output_onto_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "link.md").symlink_to("target.md")
    write_atomic(tmp_path / "link.md", "one")
    assert (tmp_path / "link.md").is_symlink() and (tmp_path / "target.md").read_text() == "one"
    write_atomic(tmp_path / "link.md", "two")
    assert (tmp_path / "link.md").is_symlink() and (tmp_path / "target.md").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.md", "target.md"]  # no temporary file left


def test_an_output_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "x.md"
    path.write_text("old")
    path.chmod(0o600)
    write_atomic(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_output_onto_a_fifo_is_written_through_to_its_reader(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that is there before the writer (the page fits the pipe)
    try:
        code, out, err = run(["derive", "--model", "gpt2", "--markdown", "-o", str(fifo)], tmp_path)
        assert code == 0 and err == "", err
        assert os.read(reader, 1 << 20).decode().startswith("# Parameter count of gpt2")
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # still the FIFO, not a file renamed over it


def test_an_output_onto_dev_null_writes_through_it(tmp_path, capsys):
    before = os.stat("/dev/null")
    assert main(["derive", "--model", "gpt2", "--markdown", "-o", "/dev/null"]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_a_failed_output_leaves_the_old_file(tmp_path, capsys):
    path = tmp_path / "x.md"
    path.write_text("old")
    assert main(["derive", "--model", "no-such-model", "--markdown", "-o", str(path)]) == 2
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.md"]


# --- terminals, pipes and signals: as well-mannered Unix tools behave -------------------------------------------------


def test_a_closed_pipe_is_a_quiet_exit(tmp_path):
    """`symparam ... | head -1`: the reader goes away; the writer stops without a word, exit 141 (128 + SIGPIPE, as a C
    tool killed by SIGPIPE reports). The page is larger than a pipe holds, so the write fails every time."""
    proc = subprocess.Popen(CLI + ["derive", "--model", "gpt2", "--html"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout.read(1) == b"<"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=HANG) == 141 and err == b""


def test_a_full_stdout_is_one_line():
    with open("/dev/full", "w") as full:
        proc = subprocess.run(CLI + ["list"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=HANG)
    one_line(proc.returncode, "", proc.stderr, says="stdout: cannot write (no space left on device)")


def test_an_ascii_only_stdout_gets_escapes_not_a_crash(tmp_path):
    """Chinese output on a stream that cannot encode it: escaped as \\uXXXX (what Python does on stderr), exit 0."""
    code, out, err = run(["derive", "--model", "gpt2", "--markdown", "--lang", "zh"], tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert code == 0 and err == "" and out.isascii()
    assert "\\u53c2\\u6570" in out  # 参数, escaped


def test_ctrl_c_exits_130_in_one_line(tmp_path):
    """SIGINT while the CLI works (here: blocked writing a page into a pipe nobody reads): exit 130, no traceback."""
    # as a shell starts it: SIGINT at its default (a pytest-xdist worker ignores SIGINT, and children inherit that)
    proc = subprocess.Popen(CLI + ["derive", "--model", "gpt2", "--html"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.read(1) == b"<"  # main() is running: it is printing
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=HANG)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err.decode() == "symparam: error: interrupted\n"


# --- no figure is ever negative: layer counts set by hand, fuzzed ------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(preset=st.sampled_from(["deepseek-v3", "gpt-oss-20b", "qwen3-next-80b-a3b", "nemotron-h-56b", "gemma-3-1b-it"]), data=st.data())
def test_layer_counts_set_by_hand_never_make_a_figure_negative(preset, data):
    raw = read_preset(preset)
    recipe = resolve(raw).recipe
    layers = sorted(recipe.layer_symbols)
    sets = data.draw(st.dictionaries(st.sampled_from(layers), st.integers(0, 300), min_size=1, max_size=3))
    try:
        count = Model.from_resolved(resolve(raw, overrides=sets)).count()
    except SymparamError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert min([count.total, count.active, *count.components.values(), *count.active_components.values()]) >= 0


def test_the_count_itself_refuses_values_that_make_a_figure_negative():
    model = Model.from_resolved(resolve(read_preset("deepseek-v3")))
    with pytest.raises(SymparamError, match="total is -388,582,450,176 at N=61"):
        model.count({**model.values, "N_dense": 100})


# --- the whole CLI fuzzed with bad values in every option -------------------------------------------------------------


BAD_VALUES = ["", "-", "--", "-org/name", "../..", "/", "/dev/null", "/dev/full", "/proc/self/mem", "x" * 5000, "\n", "nul\x00l",
              "9" * 5000, "-1", "0", "1e400", "nan", "inf", "1.5", "d=", "=4", "d=-1", f"d={2**63}", "N_dense=99999", "S=4",
              "d=1:99999999:1", "a/b/c", "a\udcffb", "{p}/fifo_nowhere", "{p}/dir", "{p}/file", "{p}/loop1", "{p}/file/x"]
OPTIONS = {  # command -> its options that take a value
    "count": ["--model", "--config", "--recipe", "--arch", "--set", "--revision"],
    "memory": ["--model", "--seq", "--batch", "--set", "--config"],
    "flops": ["--model", "--seq", "--set"],
    "shapes": ["--model", "--seq", "--set"],
    "derive": ["--model", "--config", "--set", "-o"],
    "docs": ["--dir"],
    "verify": ["--model", "--checkpoint", "--remote", "--dtype"],
    "solve": ["--model", "--target", "--for", "--set"],
    "sensitivity": ["--model", "--for", "--set"],
    "sweep": ["--model", "--grid", "--csv", "-o", "--set"],
}
NEEDS = {"derive": ["--markdown"], "shapes": ["--seq", "16"], "solve": ["--target", "7B", "--for", "d"], "verify": ["--checkpoint", "{p}/dir"],
         "sweep": ["--grid", "N=1,2"], "docs": ["--check"]}


@settings(max_examples=150, deadline=None)
@given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
def test_fuzzed_command_lines_keep_the_contract(tmp_path_factory, command, data):
    """Random bad values in a command's options: success, or argparse's usage, or one line and exit 2; never a
    traceback, never a file written but by a successful -o (run in the fuzz's own directory: `-o -` is a file named -)."""
    place = tmp_path_factory.mktemp("fuzz")
    home = os.getcwd()
    os.chdir(place)
    try:
        fuzz_once(place, command, data)
    finally:
        os.chdir(home)


def fuzz_once(place: Path, command: str, data) -> None:
    (place / "dir").mkdir()
    (place / "file").write_text("{}")
    (place / "loop1").symlink_to("loop1")
    options = data.draw(st.lists(st.sampled_from(OPTIONS[command]), min_size=1, max_size=3, unique=True))
    argv = [command, *(["--model", "gpt2"] if "--model" in OPTIONS[command] and "--model" not in options and command != "verify" else [])]
    argv += NEEDS.get(command, []) if not set(NEEDS.get(command, [])) & set(options) else []
    for option in options:
        argv += [option, data.draw(st.sampled_from(BAD_VALUES))]
    argv = [a.replace("{p}", str(place)) for a in argv]
    before = snapshot(place)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own usage error, which may stay as it is
            assert e.code == 2 and "usage:" in err.getvalue(), argv
            return
    if code == 2:
        one_line(code, out.getvalue(), err.getvalue())
    else:
        assert code in (0, 1) and "Traceback" not in err.getvalue(), (argv, err.getvalue())
    assert snapshot(place) == before or (code == 0 and "-o" in options)  # only a successful -o writes
