"""The quantization classifier on config shapes written from each format's documentation."""

import json

import pytest

from blockwidth.policy.config import ConfigError
from blockwidth.policy.quantization import Quantization, Scheme, classify, read_quantization

CASES = [
    # (name, config, sidecar, scheme, bits, group_size)
    ("mlx affine 4-bit", {"quantization": {"group_size": 64, "bits": 4}}, None, "affine", 4, 64),
    ("mlx affine with mode", {"quantization": {"group_size": 32, "bits": 8, "mode": "affine"}},
     None, "affine", 8, 32),
    ("mlx mxfp4", {"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}, None, "mxfp4", 4, 32),
    ("mlx nvfp4", {"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}, None, "nvfp4", 4, 16),
    ("mlx mxfp8", {"quantization": {"mode": "mxfp8"}}, None, "mxfp8", 8, 32),
    ("mlx per-module overrides", {"quantization": {
        "group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
        "lm_head": False}}, None, "affine", 4, 64),
    ("mlx mirror in quantization_config only",
     {"quantization_config": {"group_size": 64, "bits": 3}}, None, "affine", 3, 64),
    ("string quantization", {"quantization": "nvfp4"}, None, "nvfp4", 4, 16),
    ("odd string quantization", {"quantization": "fancy"}, None, "unknown", None, None),
    ("gptq", {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                      "desc_act": False, "sym": True}}, None, "gptq", 4, 128),
    ("awq", {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                     "version": "gemm", "zero_point": True}}, None, "awq", 4, 128),
    ("awq old keys", {"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64}},
     None, "awq", 4, 64),
    ("bnb 4-bit nf4", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                               "bnb_4bit_quant_type": "nf4"}}, None, "bitsandbytes", 4, 64),
    ("bnb 8-bit", {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
     None, "bitsandbytes", 8, None),
    ("hqq", {"quantization_config": {"quant_method": "hqq", "quant_config": {
        "weight_quant_params": {"nbits": 4, "group_size": 64, "axis": 1}}}}, None, "hqq", 4, 64),
    ("fp8 block", {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                           "weight_block_size": [128, 128]}}, None, "fp8", 8, 128),
    ("compressed-tensors int4", {"quantization_config": {"quant_method": "compressed-tensors",
        "format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "group_size": 128, "strategy": "group"}}}}},
     None, "int", 4, 128),
    ("compressed-tensors fp8", {"quantization_config": {"quant_method": "compressed-tensors",
        "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}}, None, "fp8", 8, None),
    ("compressed-tensors nvfp4", {"quantization_config": {"quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}}}, None, "nvfp4", 4, 16),
    ("modelopt nvfp4 in config", {"quantization_config": {"quant_method": "modelopt",
        "quant_algo": "NVFP4", "group_size": 16}}, None, "nvfp4", 4, 16),
    ("modelopt fp8 sidecar only", {"torch_dtype": "bfloat16"},
     {"producer": {"name": "modelopt", "version": "0.29"},
      "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, "fp8", 8, None),
    ("modelopt hybrid fp8 + nvfp4", {"quantization_config": {"quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {
            "model.layers.0.mlp.down_proj": {"quant_algo": "FP8"},
            "model.layers.1.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16},
            "model.layers.2.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16}}}},
     None, "nvfp4", 4, 16),
    ("modelopt mixed, layers not tables", {"quantization_config": {"quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": 1, "b": [2]}}}, None, "unknown", None, None),
    ("gpt-oss mxfp4", {"quantization_config": {"quant_method": "mxfp4"}}, None, "mxfp4", 4, 32),
    ("text_config nesting", {"model_type": "gemma3", "text_config": {
        "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 32}}},
     None, "gptq", 8, 32),
    ("unquantized bf16", {"torch_dtype": "bfloat16"}, None, "none", 16, None),
    ("unquantized f32 (dtype key)", {"dtype": "float32"}, None, "none", 32, None),
    ("unquantized in text_config", {"text_config": {"torch_dtype": "float16"}}, None, "none", 16, None),
    ("unknown method", {"quantization_config": {"quant_method": "aqlm"}}, None, "unknown", None, None),
    ("quantization is a list", {"quantization": [4, 64]}, None, "unknown", None, None),
    ("bad mode", {"quantization": {"bits": 4, "mode": "turbo"}}, None, "unknown", 4, None),
    ("not an object", ["nope"], None, "unknown", None, None),
]


@pytest.mark.parametrize("name,config,sidecar,scheme,bits,group", CASES, ids=[c[0] for c in CASES])
def test_classify(name, config, sidecar, scheme, bits, group):
    q = classify(config, sidecar)
    assert (q.scheme.value, q.bits, q.group_size) == (scheme, bits, group)
    assert q.detail  # always says how it was read, or why not


def test_mixed_precision_is_named():
    q = classify({"quantization": {"group_size": 64, "bits": 4,
                                   "model.embed_tokens": {"group_size": 64, "bits": 8}}})
    assert "mixed" in q.detail and "8-bit" in q.detail
    hybrid = classify(next(c for c in CASES if c[0] == 'modelopt hybrid fp8 + nvfp4')[1])
    assert "FP8 on 1 layers" in hybrid.detail and "NVFP4 on 2 layers" in hybrid.detail


@pytest.mark.parametrize("name,config,sidecar", [c[:3] for c in CASES], ids=[c[0] for c in CASES])
def test_to_dict_and_from_dict_round_trip(name, config, sidecar):
    """A record stores the target's quantization with to_dict and reads it back with from_dict."""
    q = classify(config, sidecar)
    assert Quantization.from_dict(json.loads(json.dumps(q.to_dict()))) == q


def test_from_dict_refuses_a_scheme_it_does_not_know():
    with pytest.raises(ValueError):
        Quantization.from_dict({"scheme": "turbo", "bits": 3})
    with pytest.raises(KeyError):
        Quantization.from_dict({"bits": 4})


def test_describe_words():
    assert classify({"quantization": {"group_size": 64, "bits": 4}}).describe() == "affine 4-bit g64"
    assert classify({"torch_dtype": "bfloat16"}).describe() == "unquantized bfloat16"


def test_reader_and_sidecar(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    assert read_quantization(tmp_path).scheme is Scheme.NVFP4


@pytest.mark.parametrize("setup,msg", [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "has no config.json"),
    (lambda p: p.write_text("x"), "is a file"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{oops")), "not valid JSON"),
])
def test_reader_errors_name_the_path(tmp_path, setup, msg):
    target = tmp_path / "ckpt"
    setup(target)
    with pytest.raises(ConfigError) as e:
        read_quantization(target)
    assert msg in str(e.value) and str(target) in str(e.value)


LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 128256}


def test_mixed_precision_is_classified_by_what_stores_most_weights():
    """FP8 on the attention projections (more modules) beside NVFP4 on the MLP and
    lm_head (most of the weights) is an NVFP4 checkpoint, with the mix in detail."""
    layers = {}
    for i in range(4):
        for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            layers[f"model.layers.{i}.self_attn.{m}"] = {"quant_algo": "FP8"}
        for m in ("gate_proj", "up_proj", "down_proj"):
            layers[f"model.layers.{i}.mlp.{m}"] = {"quant_algo": "NVFP4", "group_size": 16}
    layers["lm_head"] = {"quant_algo": "NVFP4", "group_size": 16}
    sidecar = {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers}}
    q = classify(dict(LLAMA_8B, torch_dtype="bfloat16"), sidecar)
    assert (q.scheme.value, q.bits, q.group_size) == ("nvfp4", 4, 16), q.detail
    assert "FP8 on 16 layers" in q.detail and "fp8 8-bit" in q.detail and "%" in q.detail

    # The config.json form ModelOpt writes: config_groups, the FP8 group first.
    groups = {"group_0": {"weights": {"num_bits": 8, "type": "float"},
                          "targets": ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj"]},
              "group_1": {"weights": {"num_bits": 4, "type": "float", "group_size": 16},
                          "targets": ["Linear", "lm_head"]}}
    for method in ("modelopt", "compressed-tensors"):
        qc = {"quant_method": method, "quant_algo": "MIXED_PRECISION", "config_groups": groups}
        q = classify(dict(LLAMA_8B, quantization_config=qc))
        assert (q.scheme.value, q.bits) == ("nvfp4", 4), (method, q.detail)
        assert "fp8 8-bit" in q.detail and "nvfp4 4-bit g16" in q.detail

    # Without sizes in config.json the share is a count of modules, and it says so.
    q = classify({"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                          "quantized_layers": layers}})
    assert q.scheme.value == "fp8" and "modules counted" in q.detail


def qwen3_nvfp4_modelopt() -> dict:
    """A config.json in the shape of a published Qwen3 NVFP4 ModelOpt release: its
    quantized_layers name only the minority scheme, FP8 on a few attention projections of the
    first and last layers; its config_groups put NVFP4 on every MLP projection and lm_head."""
    n = 36
    fp8 = {f"model.layers.{i}.self_attn.{m}": {"quant_algo": "FP8"}
           for i in (0, 1, n - 2, n - 1) for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    nvfp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    mlp = [f"model.layers.{i}.mlp.{m}" for i in range(n) for m in ("gate_proj", "up_proj", "down_proj")]
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": n,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "tie_word_embeddings": False,
        "quantization_config": {
            "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "producer": {"name": "modelopt", "version": "0.37.0"},
            "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
            "config_groups": {"group_0": {"input_activations": nvfp4, "weights": nvfp4,
                                          "targets": [*mlp, "lm_head"]}},
            "ignore": ["model.embed_tokens", "model.layers.*.mlp.gate"],
            "quantized_layers": fp8,
        },
    }


def test_modelopt_mixed_precision_reads_both_its_layers_and_its_groups():
    """quantized_layers alone made this release fp8: the few FP8 projections it lists are 2 % of
    the quantized weights; the NVFP4 MLPs and lm_head, named only in config_groups, the rest."""
    q = classify(qwen3_nvfp4_modelopt())
    assert (q.scheme.value, q.bits, q.group_size) == ("nvfp4", 4, 16), q.detail
    assert "FP8 on 16 layers" in q.detail and "config group" in q.detail and "fp8 8-bit 2%" in q.detail
    # the same two halves in the sidecar (hf_quant_config.json) read the same way
    cfg = qwen3_nvfp4_modelopt()
    sidecar = {"quantization": cfg.pop("quantization_config")}
    assert classify(cfg, sidecar).scheme.value == "nvfp4"
    # and a per-layer algo named W4A16_NVFP4 (newer ModelOpt) is NVFP4, not unknown
    q = classify({"quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                          "quantized_layers": {"lm_head": {"quant_algo": "W4A16_NVFP4"}}}})
    assert q.scheme.value == "nvfp4", q.detail


def test_quanto_names_its_integer_bits():
    """quanto writes weights = "int4": the bits were read as None (a str never passed _int)."""
    q = classify({"quantization_config": {"quant_method": "quanto", "weights": "int4"}})
    assert (q.scheme, q.bits) == (Scheme.INT, 4)
    assert classify({"quantization_config": {"quant_method": "quanto", "weights": "int\u0664"}}).bits is None
