"""Settings and profiles load strictly and say what is wrong, where, and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmd.config import (
    PROFILES_DIR,
    Parallel,
    Profile,
    load_profile,
    load_settings,
    parse_size,
    shipped_profiles,
)
from llmd.errors import ConfigError


def test_every_shipped_profile_loads() -> None:
    assert "cpu" in shipped_profiles()
    for name in shipped_profiles():
        profile = load_profile(name, gpus=8)  # what multi-gpu-bf16's `tensor: auto` stands for
        assert isinstance(profile, Profile) and profile.name == name


def test_every_key_of_every_shipped_profile_is_documented_on_the_line_above() -> None:
    for name in shipped_profiles():
        lines = (PROFILES_DIR / f"{name}.yaml").read_text().splitlines()
        keys = [at for at, line in enumerate(lines) if re.match(r"\s*[a-z_]+:", line)]
        assert keys, name
        undocumented = [lines[at] for at in keys if not lines[at - 1].lstrip().startswith("#")]
        assert undocumented == [], f"{name}: {undocumented}"


def test_cpu_profile_values() -> None:
    profile = load_profile("cpu")
    assert profile.device == "cpu" and profile.attn_implementation == "sdpa"
    assert profile.max_running >= 1 and profile.max_queue >= 1


def test_unknown_profile_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match=r"shipped profiles: .*cpu"):
        load_profile("no-such-profile")


def test_unknown_key_names_file_key_and_nearest(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("device: cpu\nmax_runing: 2\n")
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(path) in err.value.message
    assert "`max_runing`" in err.value.message and "`max_running`" in err.value.message


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("max_context: lots\n")
    with pytest.raises(ConfigError, match=r"key `max_context`: Expected `int`"):
        load_profile(str(path))


def test_bad_choice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("dtype: float8\n")
    with pytest.raises(ConfigError, match="key `dtype`"):
        load_profile(str(path))


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("lone_step: compiled\ndevice: cpu\nlone_step: eager\n")
    with pytest.raises(ConfigError, match=r"(?s)`lone_step` is given twice.*line 3"):
        load_profile(str(path))
    path.write_text("parallel:\n  nodes: 2\n  nodes: 1\n")
    with pytest.raises(ConfigError, match=r"`nodes` is given twice"):
        load_profile(str(path))
    settings = tmp_path / "llmd.yaml"
    settings.write_text("port: 9000\nport: 9100\n")
    with pytest.raises(ConfigError, match=r"`port` is given twice"):
        load_settings(settings, {})


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"device: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 8"):
        load_profile(str(path))


def test_settings_file_with_flags_winning(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("port: 9000\nhost: 127.0.0.2\n")
    settings = load_settings(path, {"port": 9100, "host": None})
    assert settings.port == 9100 and settings.host == "127.0.0.2"


def test_settings_typo(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("prot: 9000\n")
    with pytest.raises(ConfigError, match="did you mean `port`"):
        load_settings(path, {})


def test_settings_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_settings(path, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12GiB", 12 * 2**30), ("24GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1.5g", 3 * 2**29),
     ("0", 0), ("100", 100)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "12 parsecs", "-1GiB", "GiB", "1.2.3GB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("body", "key", "problem"),
    [
        ("compile: default\n", "compile", "kv_cache: static"),
        ("attn_implementation: eager\nsdpa_backends: [math]\n", "sdpa_backends", "attn_implementation"),
        ("sdpa_backends: [cudnn]\n", "sdpa_backends", "only on CUDA"),
        ("sdpa_backends: [math, math]\n", "sdpa_backends", "twice"),
        ("max_context: 64\nprefill_chunk_tokens: 128\n", "prefill_chunk_tokens", "max_context"),
        ("memory_headroom: lots\n", "memory_headroom", "not a size"),
        ("max_step_tokens: 256\nlone_prefill_tokens: 512\n", "lone_prefill_tokens", "max_step_tokens"),
        ("lone_prefill_tokens: 0\n", "lone_prefill_tokens", ">= 1"),
        ("dtype: float16\n", "dtype", "float32 or bfloat16"),
        ("sdpa_backends: [fast]\n", "sdpa_backends", "one of: flash, efficient, cudnn, math"),
        ("quantization: int3\n", "quantization", "one of: none, nf4"),
    ],
)
def test_contradictions_name_the_key(tmp_path: Path, body: str, key: str, problem: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(path) in err.value.message and f"`{key}" in err.value.message
    assert problem in err.value.message


def test_every_shipped_native_profile_sets_its_lone_prefill_piece_under_its_reason() -> None:
    for name in shipped_profiles():
        profile = load_profile(name, gpus=8)
        if profile.engine != "native":
            continue  # vLLM schedules its own prefill chunks
        lines = (Path(__file__).parents[2] / "profiles" / f"{name}.yaml").read_text().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("lone_prefill_tokens:"))
        assert lines[at - 1].startswith("#")  # the measurement (or its absence) that chose it
        assert profile.prefill_chunk_tokens <= profile.lone_prefill_tokens <= profile.max_step_tokens


def test_shipped_gpu_profiles_are_what_the_names_say() -> None:
    compiled = load_profile("24gb-bf16-compile")
    assert compiled.device == "cuda" and compiled.dtype == "bfloat16"
    assert compiled.kv_cache == "static" and compiled.compile != "none"
    assert compiled.max_context >= 8192 and compiled.max_running >= 2
    four_bit = load_profile("12gb-4bit")
    assert four_bit.quantization == "nf4" and four_bit.double_quant
    assert four_bit.dtype == "bfloat16" and four_bit.attn_implementation == "sdpa"
    assert four_bit.max_context >= 8192 and four_bit.max_running >= 2


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_multi_gpu_bf16_slices_the_model_across_every_gpu_of_the_machine(gpus: int) -> None:
    profile = load_profile("multi-gpu-bf16", gpus=gpus)
    assert (profile.engine, profile.device, profile.dtype) == ("vllm", "cuda", "bfloat16")
    assert profile.parallel == Parallel(tensor=gpus)  # TP = the GPU count, one node, no PP or DP
    assert profile.compile != "none" and profile.quantization == "none"  # vLLM compiles, CUDA graphs
    assert profile.max_context >= 8192 and profile.max_running >= 8


def test_vllm_cpu_runs_one_eager_float32_worker_on_the_cpu() -> None:
    profile = load_profile("vllm-cpu")
    assert (profile.engine, profile.device, profile.dtype) == ("vllm", "cpu", "float32")
    assert profile.parallel == Parallel() and profile.compile == "none"  # enforce_eager
    assert profile.kv_cache_dtype == "auto" and not profile.onednn_linear


def tensor_auto(tmp_path: Path, body: str = "") -> str:
    path = tmp_path / "tp.yaml"
    path.write_text("engine: vllm\ndevice: cuda\ndtype: bfloat16\nparallel:\n  tensor: auto\n" + body)
    return str(path)


def test_tensor_auto_is_the_gpu_count_shared_by_pipeline_and_data(tmp_path: Path) -> None:
    assert load_profile(tensor_auto(tmp_path), gpus=4).parallel.tensor == 4
    shared = load_profile(tensor_auto(tmp_path, "  pipeline: 2\n  data: 2\n"), gpus=8).parallel
    assert (shared.tensor, shared.pipeline, shared.data) == (2, 2, 2)


def test_tensor_auto_counts_the_gpus_only_when_a_profile_asks(tmp_path: Path) -> None:
    counted: list[int] = []

    def count() -> int:
        counted.append(6)
        return 6

    assert load_profile("cpu", gpus=count).parallel == Parallel() and counted == []
    assert load_profile(tensor_auto(tmp_path), gpus=count).parallel.tensor == 6 and counted == [6]


@pytest.mark.parametrize(("body", "gpus", "problem"), [
    ("", None, "none was given: plan it with `llmd check --gpus N"),
    ("  nodes: 2\n  master_addr: 10.0.0.1\n", 8, "spans 2 nodes: write the tensor size out"),
    ("  pipeline: 3\n", 8, "among pipeline 3 x data 1, which do not divide them"),
    ("  data: 4\n", 2, "among pipeline 1 x data 4"),
])
def test_tensor_auto_is_refused_where_it_has_no_single_meaning(
    tmp_path: Path, body: str, gpus: int | None, problem: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        load_profile(tensor_auto(tmp_path, body), gpus=gpus)
    assert "key `parallel.tensor`: `auto`" in err.value.message and err.value.param == "parallel.tensor"


@pytest.mark.parametrize(("text", "problem"), [
    ("parallel:\n  tensor: auto\n", "`auto` is for `engine: vllm`"),
    ("engine: vllm\nparallel:\n  tensor: all\n", "`all` is neither a GPU count nor `auto`"),
    ("engine: vllm\nparallel:\n  tensor: 0\n", "Expected `int` >= 1"),
])
def test_a_tensor_size_is_a_count_or_auto(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        load_profile(str(path), gpus=4)
    assert str(path) in err.value.message and "`parallel.tensor`" in err.value.message


def test_allowed_hosts_load(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("allowed_hosts: [llm.lan, .Example.LAN, '*', 10.0.0.5, '[fe80::1]']\n")
    assert load_settings(path, {}).allowed_hosts == ("llm.lan", ".Example.LAN", "*", "10.0.0.5", "[fe80::1]")


@pytest.mark.parametrize(("entry", "hint"), [("http://llm.lan", "scheme"), ("llm.lan:8000", "port"),
                                             ("*.example.lan", "`.example.lan`"), ("", "empty"),
                                             ("llm.lan/v1", "path"), ("two words", "not a host")])
def test_allowed_hosts_refuse_what_a_host_header_never_holds(tmp_path: Path, entry: str, hint: str) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text(f"allowed_hosts: ['{entry}']\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, {})
    message = err.value.message
    assert "allowed_hosts" in message and hint in message and str(path) in message


def test_stored_responses_defaults() -> None:
    settings = load_settings(None, {})
    assert settings.store_responses is True and settings.responses_path is None
    assert settings.responses_max_age == 30 * 24 * 3600 and settings.responses_max_count == 10_000
    assert settings.responses_byte_limit == 2**30


def test_stored_responses_byte_bound_takes_a_size(tmp_path: Path) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text("responses_max_bytes: 500MB\nresponses_path: /srv/llmd/responses.sqlite3\n")
    settings = load_settings(path, {})
    assert settings.responses_byte_limit == 500 * 10**6
    assert load_settings(None, {"responses_max_bytes": 4096}).responses_byte_limit == 4096


@pytest.mark.parametrize(
    ("body", "problem"),
    [("responses_max_age: 0", "key `responses_max_age`"),
     ("responses_max_count: 0", "key `responses_max_count`"),
     ("responses_max_bytes: lots", "key `responses_max_bytes`: not a size"),
     ("responses_max_bytes: '0'", "key `responses_max_bytes`: must be at least 1 byte"),
     ("store_responses: maybe", "key `store_responses`"),
     ("responses_max_byte: 1GiB", "did you mean `responses_max_bytes`")],
)
def test_stored_responses_bad_values_are_refused(tmp_path: Path, body: str, problem: str) -> None:
    path = tmp_path / "llmd.yaml"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError, match=problem):
        load_settings(path, {})
