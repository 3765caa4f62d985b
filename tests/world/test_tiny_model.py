"""The tiny model: tokenizer, shipped checkpoint, fast rebuild, and the gpu (TRL SFT) path."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from rlhf_helpers.runtime.data import load_preferences, load_prompts, load_sft_corpus
from rlhf_helpers.runtime.models import (
    dropout_overrides,
    ensure_distinct_pad,
    load_causal_lm,
    load_sequence_classifier,
    load_tokenizer,
)
from rlhf_helpers.runtime.profiles import get_profile
from rlhf_helpers.world.scorer import hidden_scores
from rlhf_helpers.world.tiny_model import (
    TinyModelConfig,
    collate,
    encode_examples,
    sample_responses,
    save_model,
    train_tiny_model,
)
from rlhf_helpers.world.tokenizer import EOS_TOKEN, PAD_TOKEN, UNK_TOKEN, build_tokenizer

TINY = get_profile("tiny")


# --- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_splits_words_and_punctuation_and_decodes_plain_text():
    tokenizer = build_tokenizer()
    ids = tokenizer("The acting is superb! I would recommend it.")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "The", "acting", "is", "superb", "!", "I", "would", "recommend", "it", ".",
    ]
    assert tokenizer.decode(ids) == "The acting is superb! I would recommend it."
    assert tokenizer("zebra, superb")["input_ids"] == [
        tokenizer.unk_token_id, tokenizer.convert_tokens_to_ids(","),
        tokenizer.convert_tokens_to_ids("superb"),
    ]
    # an EOS glued to the text (as TRL appends it) is still one special token
    assert tokenizer("superb.<eos>")["input_ids"][-1] == tokenizer.eos_token_id


def test_special_tokens_and_padding_side_survive_a_reload(tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (reloaded.pad_token, reloaded.unk_token, reloaded.eos_token) == (
        PAD_TOKEN, UNK_TOKEN, EOS_TOKEN,
    )
    assert reloaded.pad_token_id != reloaded.eos_token_id
    assert reloaded.padding_side == "left"
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    batch = reloaded(["The plot is dull.", "Skip this one ."], padding=True)
    assert batch["input_ids"][1][0] == reloaded.pad_token_id  # left padding
    assert batch["attention_mask"][1][0] == 0


def test_shipped_tokenizer_equals_a_fresh_build():
    shipped = AutoTokenizer.from_pretrained(TINY.sft_model_path)
    assert shipped.get_vocab() == build_tokenizer().get_vocab()


def test_collate_masks_prompt_and_padding():
    examples = [([5, 6, 7, 8], 2), ([9, 10], 1)]
    batch = collate(examples, pad_id=0, response_only=True)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 7, 8], [-100, 10, -100, -100]]
    assert collate(examples, 0, response_only=False)["labels"][0].tolist() == [5, 6, 7, 8]


# --- the shipped checkpoint ------------------------------------------------------------------


def test_shipped_model_loads_with_auto_classes_and_has_no_dropout():
    model = AutoModelForCausalLM.from_pretrained(TINY.sft_model_path)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 <= n_params <= 5e6
    assert all(v == 0.0 for v in dropout_overrides(model.config).values())
    assert model.config.pad_token_id != model.config.eos_token_id
    model.train()  # even in train mode two forwards agree: dropout is off
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(model(ids).logits, model(ids).logits)
    classifier = AutoModelForSequenceClassification.from_pretrained(
        TINY.sft_model_path, num_labels=1
    )
    assert classifier.score.out_features == 1


def test_loaders_set_dropout_to_zero_even_if_the_config_has_it(tmp_path):
    tokenizer = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(TINY.sft_model_path, resid_pdrop=0.3,
                                                 attn_pdrop=0.3, embd_pdrop=0.3)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["resid_pdrop"] == 0.3
    loaded = load_causal_lm(TINY, path=tmp_path)
    assert loaded.config.resid_pdrop == 0.0 and loaded.config.attn_pdrop == 0.0
    loaded.train()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(loaded(ids).logits, loaded(ids).logits)


def test_sequence_classifier_reads_the_last_real_token():
    tokenizer = load_tokenizer(TINY)
    model = load_sequence_classifier(TINY, num_labels=1)
    texts = ["Review of the drama Red Road: The plot is dull.", "Review of the drama Red Road:"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)  # left padded
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # (B, T)
    with torch.no_grad():
        padded = model(**batch, position_ids=positions).logits[:, 0]  # (B,)
        alone = model(**tokenizer(texts[1:], return_tensors="pt")).logits[:, 0]  # (1,)
    assert padded[1] == pytest.approx(alone[0].item(), abs=1e-5)


def test_shipped_model_samples_read_like_the_corpus():
    tokenizer = load_tokenizer(TINY)
    model = load_causal_lm(TINY)
    prompts = load_prompts("test")[:64]
    responses, ended = sample_responses(model, tokenizer, prompts, seed=0)
    assert sum(ended) / len(ended) >= 0.9
    corpus = load_sft_corpus()[:500]
    corpus_scores = hidden_scores([r["prompt"] for r in corpus], [r["completion"] for r in corpus])
    sample_scores = hidden_scores(prompts, responses)
    mean = sum(sample_scores) / len(sample_scores)
    corpus_mean = sum(corpus_scores) / len(corpus_scores)
    assert abs(mean - corpus_mean) < 0.6
    assert max(sample_scores) - min(sample_scores) > 2.0  # a spread, not one canned answer


# --- fast rebuild ----------------------------------------------------------------------------


def test_fast_rebuild_learns_and_round_trips(tmp_path, one_torch_thread):
    tokenizer = build_tokenizer()
    records = load_sft_corpus()[:256]
    model, log = train_tiny_model(tokenizer, records, TinyModelConfig.fast())
    first, last = log["pretrain_loss_first_last"]
    assert last < first - 1.0  # from ~log(vocab) = 6 down
    save_model(model, tokenizer, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor(encode_examples(tokenizer, records[:1], 64)[0][0])[None]  # (1, T)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits)


def test_training_is_reproducible_from_the_seed(one_torch_thread):
    tokenizer = build_tokenizer()
    records = load_sft_corpus()[:64]
    config = TinyModelConfig(n_layer=1, pretrain_steps=3, sft_steps=2, batch_size=8,
                             warmup_steps=1)
    model, _ = train_tiny_model(tokenizer, records, config)
    again, _ = train_tiny_model(tokenizer, records, config)  # same seed, same weights
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(),
                                                   strict=True))


# --- gpu path with a random model of SmolLM2's architecture -----------------------------------


def _shrunk_smollm2(vocab_size: int) -> LlamaForCausalLM:
    # SmolLM2-135M is Llama: hidden 576, 30 layers, 9 heads, 3 kv heads, intermediate 1536,
    # vocab 49152, tied embeddings. Same family, shrunk so a CPU test takes seconds.
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=vocab_size,
                         tie_word_embeddings=True, max_position_embeddings=128)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def test_gpu_sft_path_with_trl_on_a_random_llama(tmp_path, one_torch_thread):
    from rlhf_helpers.stages.sft import sft_with_trl

    tokenizer = build_tokenizer()
    # a hub tokenizer often has pad == EOS; the SFT path must fix that
    tokenizer.pad_token = tokenizer.eos_token
    model = _shrunk_smollm2(len(tokenizer))
    profile = get_profile("gpu", device="cpu", dtype="float32", sft_batch_size=8, sft_lr=3e-3,
                          sft_model_path=str(tmp_path / "sft"))
    history = sft_with_trl(model, tokenizer, load_sft_corpus()[:128], profile,
                           tmp_path / "sft", max_steps=12, logging_steps=1)
    losses = [float(h["loss"]) for h in history if "loss" in h]
    assert len(losses) == 12
    # from a random init (loss ~ log(vocab) = 6) the completion loss must fall
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5
    loaded_tokenizer = load_tokenizer(profile)
    assert loaded_tokenizer.pad_token_id != loaded_tokenizer.eos_token_id
    model = load_causal_lm(profile)
    assert model.get_input_embeddings().num_embeddings >= len(loaded_tokenizer)
    assert model.config.pad_token_id == loaded_tokenizer.pad_token_id
    assert isinstance(model, LlamaForCausalLM)


def test_ensure_distinct_pad_adds_a_token_only_when_needed():
    tokenizer = build_tokenizer()
    assert ensure_distinct_pad(tokenizer) is False
    tokenizer.pad_token = tokenizer.eos_token
    size = len(tokenizer)
    assert ensure_distinct_pad(tokenizer) is True
    assert len(tokenizer) == size + 1 and tokenizer.pad_token_id != tokenizer.eos_token_id


def test_missing_model_directory_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="stages.sft"):
        load_causal_lm(get_profile("gpu", sft_model_path=str(tmp_path / "none")))


def test_reward_trainer_accepts_the_shipped_preferences(tmp_path, one_torch_thread):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    from rlhf_helpers.runtime.compat import checkpointing_off

    tokenizer = load_tokenizer(TINY)
    model = load_sequence_classifier(TINY, num_labels=1)
    args = RewardConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8,
                        use_cpu=True, bf16=False, **checkpointing_off(RewardConfig),
                        report_to="none", save_strategy="no", max_length=64, dataset_num_proc=None)
    trainer = RewardTrainer(model=model, args=args, processing_class=tokenizer,
                            train_dataset=Dataset.from_list(load_preferences("train")[:32]))
    row = trainer.train_dataset[0]
    assert row["chosen_ids"][-1] == tokenizer.eos_token_id
    assert tokenizer.unk_token_id not in row["chosen_ids"] + row["rejected_ids"]
    trainer.train()
