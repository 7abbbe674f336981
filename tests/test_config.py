import pytest

import perfsdk
from perfsdk.config import ConfigError, apply_overrides, load_config


def test_defaults_match_the_documented_quickstart():
    cfg = perfsdk.Config()
    assert cfg.model.id == "builtin:tiny-llama"
    assert cfg.workload.batching.batch_size == 4
    assert cfg.workload.generate.max_new_tokens == 32
    assert cfg.exporters == ["json"]


def test_yaml_file_and_overrides(tmp_path):
    p = tmp_path / "bench.yaml"
    p.write_text("name: b\nworkload:\n  batching: {batch_size: 2}\n  generate: {max_new_tokens: 8}\n")
    cfg = load_config(p, ["workload.batching.batch_size=16", "model.dtype=bfloat16", "collectors.flops={}"])
    assert cfg.workload.batching.batch_size == 16
    assert cfg.workload.generate.max_new_tokens == 8
    assert cfg.model.dtype == "bfloat16"
    assert cfg.collectors == {"flops": {}}


def test_unknown_key_names_the_path():
    with pytest.raises(ConfigError, match=r"workload\.batching\.batchsize: unknown key"):
        load_config({"workload": {"batching": {"batchsize": 3}}})


def test_wrong_type_and_negative_batch_size():
    with pytest.raises(ConfigError, match=r"workload\.num_prompts"):
        load_config({"workload": {"num_prompts": "many"}})
    with pytest.raises(ConfigError, match=r"workload\.batching\.batch_size"):
        load_config({"workload": {"batching": {"batch_size": -1}}})


def test_adaptive_batching_clears_fixed_size():
    cfg = load_config({"workload": {"batching": {"max_batch_tokens": 2048}}})
    assert cfg.workload.batching.batch_size is None
    assert cfg.workload.batching.max_batch_tokens == 2048


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(listy)


def test_yaml_is_loaded_safely(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


def test_override_errors():
    with pytest.raises(ConfigError, match="expected key.path=value"):
        apply_overrides({}, ["novalue"])
    with pytest.raises(ConfigError, match="is not a mapping"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_relative_prompt_file_resolves_against_config_folder(tmp_path):
    (tmp_path / "prompts.txt").write_text("hello\n")
    p = tmp_path / "c.yaml"
    p.write_text("workload: {prompts: prompts.txt}\n")
    cfg = load_config(p)
    assert cfg.workload.prompts == str(tmp_path / "prompts.txt")


def test_poisson_needs_rate():
    with pytest.raises(ConfigError, match="rate_per_s"):
        load_config({"workload": {"arrival": {"pattern": "poisson"}}})
