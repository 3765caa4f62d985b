"""bench_memory's accounting on the toy model: parameter bytes against independent counts, and the
four-model side running the same policy as the shared side."""

from __future__ import annotations

import copy

import pytest
import torch
from toy_world import toy_causal_lm, toy_tokenizer

from benchmarks import bench_memory
from benchmarks.bench_memory import SizeSpec, build_side, compare, parameter_bytes
from rlhf_helpers.ppo.model.sampling import sample_model

R = 4
SPEC = SizeSpec("toy", batch=2, new_tokens=4, prompt_tokens=6, lora_r=R, lora_alpha=8,
                lora_targets=("c_attn", "c_proj", "c_fc"))


def nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def lora_bytes(base: torch.nn.Module, r: int) -> int:
    """r * (in + out) float32 numbers per wrapped projection: A is (r, in), B is (out, r)."""
    total = 0
    for name, module in base.named_modules():
        if type(module).__name__ == "Conv1D" and name.rsplit(".", 1)[-1] in SPEC.lora_targets:
            fan_in, fan_out = module.weight.shape  # Conv1D stores (in, out)
            total += r * (fan_in + fan_out) * 4
    return total


@pytest.fixture()
def toy():
    torch.set_num_threads(1)
    tok = toy_tokenizer()
    return tok, toy_causal_lm(tok, seed=0)


def test_four_models_bytes_are_four_separate_copies(toy):
    tok, base = toy
    hidden = base.config.n_embd
    base_bytes, backbone_bytes = nbytes(base), nbytes(base.transformer)
    four = build_side("four", copy.deepcopy(base), tok, SPEC)
    got = parameter_bytes(four)
    assert got["policy"] == got["reference"] == base_bytes
    assert got["value"] == backbone_bytes + (hidden + 1) * 4  # value head: weight and bias
    assert got["reward"] == backbone_bytes + hidden * 4  # score head: weight only
    assert got["total"] == sum(got[k] for k in ("policy", "reference", "value", "reward"))
    # the same total counted straight from the four model objects
    assert got["total"] == sum(nbytes(m)
                               for m in (four.policy, four.reference_model, four.value_model,
                                         four.value_head, four.reward_model, four.score_head))
    # full fine-tuning: every policy and value-model parameter trains
    assert sum(p.numel() for p in four.policy_parameters()) * 4 == base_bytes
    assert sum(p.numel() for p in four.value_parameters()) * 4 == backbone_bytes + (hidden + 1) * 4


def test_shared_bytes_are_one_base_plus_three_adapters_and_two_heads(toy):
    tok, base = toy
    hidden = base.config.n_embd
    base_bytes, adapter_bytes = nbytes(base), lora_bytes(base, R)
    shared = build_side("shared", base, tok, SPEC)
    got = parameter_bytes(shared)
    assert got["base"] == base_bytes
    assert got["policy"] == got["value"] == got["reward"] == adapter_bytes
    assert got["heads"] == (hidden + 1) * 4 + hidden * 4
    assert got["total"] == base_bytes + 3 * adapter_bytes + (2 * hidden + 1) * 4
    assert got["total"] == nbytes(shared)  # every parameter of the module, each counted once


def test_four_lora_bytes_add_one_adapter_to_policy_and_value(toy):
    tok, base = toy
    hidden = base.config.n_embd
    base_bytes, backbone_bytes, adapter_bytes = (nbytes(base), nbytes(base.transformer),
                                                 lora_bytes(base, R))
    four = build_side("four_lora", base, tok, SPEC)
    got = parameter_bytes(four)
    assert got["policy"] == base_bytes + adapter_bytes
    assert got["value"] == backbone_bytes + adapter_bytes + (hidden + 1) * 4
    assert got["reference"] == base_bytes and got["reward"] == backbone_bytes + hidden * 4
    assert sum(p.numel() for p in four.policy_parameters()) * 4 == adapter_bytes  # only LoRA trains


def test_four_models_sample_and_score_like_the_shared_model_at_the_start(toy):
    """LoRA starts at zero, so at step 0 both sides are the same policy and reference: same samples
    from the same seed, same policy and reference log-probs (the same work on both sides)."""
    tok, base = toy
    shared = build_side("shared", copy.deepcopy(base), tok, SPEC)
    four = build_side("four", copy.deepcopy(base), tok, SPEC)
    ids = torch.tensor([[0, 3, 4, 6], [3, 4, 5, 6]])  # (2, 4) left-padded prompts
    attn = (ids != tok.pad_token_id).long()  # (2, 4)
    torch.manual_seed(7)
    seq_shared = sample_model(shared, ids, attn, 5).sequences
    torch.manual_seed(7)
    seq_four = sample_model(four, ids, attn, 5).sequences
    assert torch.equal(seq_shared, seq_four)
    full = torch.ones_like(seq_four)
    torch.testing.assert_close(four.policy_logprobs(seq_four, full, 4),
                               shared.policy_logprobs(seq_four, full, 4))
    torch.testing.assert_close(four.ref_logprobs(seq_four, full, 4),
                               shared.ref_logprobs(seq_four, full, 4))
    assert four.values(seq_four, full, 4).shape == four.reward_scores(seq_four,
                                                                      full).shape[:1] + (5,)


def test_compare_ratios_and_goal():
    def side(total, peak):
        return {"param_bytes": {"total": total * 2**20}, "peak_above_baseline_mb": peak,
                "optimizer_state_bytes": 0, "trainable_params": 1, "cpu_s": 1.0}

    figures = compare(
        {"shared": side(1.0, 30.0), "four": side(4.0, 100.0), "four_lora": side(4.1, 60.0)}, "x")
    assert figures["x_param_ratio_shared_over_four"] == pytest.approx(0.25)
    assert figures["x_peak_ratio_shared_over_four"] == pytest.approx(0.3)
    assert figures["x_peak_ratio_shared_over_four_lora"] == pytest.approx(0.5)
    assert figures["x_goal_met"] is True
    assert compare({"shared": side(1.0, 41.0), "four": side(4.0, 100.0)},
                   "x")["x_goal_met"] is False


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="side must be one of"):
        build_side("three", None, None, SPEC)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        bench_memory.main(device="tpu")
    with pytest.raises(ValueError, match="size must be"):
        bench_memory.size_spec("huge")
    with pytest.raises(ValueError, match="model must be a SharedLoRAModel or FourModels"):
        parameter_bytes(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("temperature", [0.7, 1.5])
def test_four_models_reference_takes_the_policys_temperature(toy, temperature):
    """`collect_experience` asks the reference for log-probs at the sampling temperature (the first
    GPU run of bench_memory stopped on a FourModels without that argument). Both sides must agree,
    and equal log softmax(z_ref / T) from the base model's own logits: an independent formula."""
    tok, base = toy
    shared = build_side("shared", copy.deepcopy(base), tok, SPEC)
    four = build_side("four", copy.deepcopy(base), tok, SPEC)
    seq = torch.tensor([[0, 3, 4, 6, 5, 4], [3, 4, 5, 6, 6, 3]])  # (2, 6): context 4, response 2
    full = torch.ones_like(seq)
    with torch.no_grad():
        logits = base(input_ids=seq, attention_mask=full).logits[:, 3:-1]  # (2, 2, V): tokens 4, 5
    logp = torch.log_softmax(logits / temperature, -1)
    expected = logp.gather(-1, seq[:, 4:, None]).squeeze(-1)  # (2, 2)
    # float32 throughout and the same kernels on the same inputs: differences are summation-order
    # rounding of a few ulps of values near 1-10, far below 1e-5
    torch.testing.assert_close(four.ref_logprobs(seq, full, 4, temperature=temperature), expected,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared.ref_logprobs(seq, full, 4, temperature=temperature), expected,
                               rtol=1e-5, atol=1e-5)


def test_tiny_sizes_ignore_a_weights_override_meant_for_the_gpu_profile(monkeypatch):
    """tools/gpu_checks.sh sets RLHF_PROFILE_OVERRIDES='{"weights": "random"}' (or gguf) for every
    stage; the tiny-size specs must still build (hub, gguf and random weights are the gpu
    profile's)."""
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"weights": "random"}')
    spec = bench_memory.size_spec("tiny")
    assert spec.batch > 0 and spec.new_tokens > 0


def test_the_recorded_figures_notebook_05_plots_match_their_sources():
    """benchmarks/results/cpu-2026-11-23/memory.json (read by notebook 05) copies the README's CPU
    table and the H100 run's JSON: each number must be the one in its source (0.05 MiB: the README's
    rounding)."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    recorded = json.loads(
        (root / "benchmarks/results/cpu-2026-11-23/memory.json").read_text())["sizes"]
    table = (root / "benchmarks/README.md").read_text().split(
        "`python -m benchmarks memory`, float32:")[1]
    cell = r"[^|\n]*\|"
    rows = re.findall(
        rf"^\|{cell}{cell} (shared|four|four_lora) \| ([\d,.]+) \|{cell}{cell} \**([\d,.]+)\**",
        table, re.MULTILINE)[:6]  # tiny, then GPT-2: (side, parameter MB, peak MB)
    number = lambda text: float(text.replace(",", ""))  # noqa: E731
    for size, side_rows in zip(recorded[:2], (rows[:3], rows[3:6]), strict=True):
        for side, params, peak in side_rows:
            assert abs(size["param_mb"][side] - number(params)) < 0.05, (size["size"], side)
            assert abs(size["peak_mb"][side] - number(peak)) < 0.05, (size["size"], side)
    gpu_file = root / "benchmarks/results/gpu-h100-2026-11-24/memory.json"
    gpu = json.loads(gpu_file.read_text())["figures"]["figures"]
    for side in ("shared", "four", "four_lora"):
        assert abs(recorded[2]["param_mb"][side] - gpu[f"smollm2_{side}_param_mb"]) < 0.05
        assert abs(recorded[2]["peak_mb"][side] - gpu[f"smollm2_{side}_peak_mb"]) < 0.05
