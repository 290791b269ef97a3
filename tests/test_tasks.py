"""The embedded demo task families: deterministic generation, exact-match validity, tokenizers, teacher."""

from __future__ import annotations

import random

import pytest
import torch

from t3d_trl import AutoModelForDiffusionLM
from t3d_trl.demo import DEMO_TASKS, build_teacher, get_task, teacher_config


def test_registry_has_every_family_and_names_unknown_ones():
    assert set(DEMO_TASKS) == {
        "sort2",
        "words",
        "add",
        "wordsort",
        "wordorder",
        "wordset",
        "wordsort_bidirectional",
    }
    with pytest.raises(ValueError, match="unknown demo task 'nope'.*sort2"):
        get_task("nope")


@pytest.mark.parametrize("name", sorted(DEMO_TASKS))
def test_sampling_is_deterministic_with_fixed_lengths_and_valid_answers(name):
    task = get_task(name)
    rows = task.sample(50, seed=3)
    assert rows == task.sample(50, seed=3)
    assert rows[:10] == task.sample(10, seed=3)
    assert rows != task.sample(50, seed=4)
    assert len({row["id"] for row in rows}) == 50
    for row in rows:
        assert len(row["prompt"].split()) == task.prompt_length
        assert len(row["answer"].split()) == task.answer_length
        assert task.is_valid(row["prompt"], row["answer"])
    assert task.answer_length % task.block_length == 0
    # Several valid answers per prompt, and the sampled answers use more than one of them (on the first 12 rows:
    # listing wordset's 40,320 answers takes a fifth of a second a prompt).
    listed = [(task.valid_answers(row["prompt"]), row["answer"]) for row in rows[:12]]
    assert all(len(valid) >= 2 for valid, _ in listed)
    assert len({valid.index(answer) for valid, answer in listed}) >= 2


@pytest.mark.parametrize("name", sorted(DEMO_TASKS))
def test_every_task_has_a_full_test_split_held_out_where_its_prompts_allow(name):
    task = get_task(name)
    test = task.split("test")
    assert len(test) == 256 and test[:16] == task.split("test", 16)
    train = {row["prompt"] for row in task.split("train")}
    overlap = sum(row["prompt"] in train for row in test)
    # words (16 prompts) and add (900) are covered by their 4,096 training rows: their test repeats them.
    assert (overlap == 0) if task.held_out_prompts else (overlap > 200)
    assert task.held_out_prompts == (name not in ("words", "add"))


def test_sort2_accepts_both_orders_and_rejects_near_misses():
    task = get_task("sort2")
    prompt = "h c a p e b k f ="
    assert task.valid_answers(prompt) == ["a b c e f h k p", "p k h f e c b a"]
    for completion in ("a b c e f h k p", "p k h f e c b a", " a  b c e f h k p "):
        assert task.is_valid(prompt, completion)
    near_misses = [
        "a b c e f h p k",  # two letters swapped
        "a b c e f h k",  # one short
        "a b c e f h k p p",  # one long
        "a b c d f h k p",  # a letter not in the prompt
        "a b c e e h k p",  # a letter twice (mode mixing of the two orders)
        "p k h f e c a b",  # descending but for the last pair
        "p b c e f h k a",  # mixture of ascending and descending
    ]
    for completion in near_misses:
        assert not task.is_valid(prompt, completion), completion
    for bad in ("= a b c d e f g h", "a a b c d e f g ="):  # "=" first, a letter twice
        with pytest.raises(ValueError, match="is not a sort2 prompt"):
            task.valid_answers(bad)


def test_words_accepts_every_pair_of_words_and_rejects_mixtures():
    task = get_task("words")
    prompt = "animal color ="
    valid = task.valid_answers(prompt)
    assert len(valid) == 36
    assert "b e a r b l u e" in valid and "d u c k n a v y" in valid
    assert all(task.is_valid(prompt, answer) for answer in valid)
    for completion in (
        "b e a r b l u e b",  # too long
        "b l u e b e a r",  # categories swapped
        "b e e r b l u e",  # letters of bear and deer mixed
        "b e a r g r u e",  # letters of gray and blue mixed
        "w o l f w o l f",  # a second animal instead of a color
    ):
        assert not task.is_valid(prompt, completion), completion


def test_add_accepts_both_operand_orders_with_the_right_sum():
    task = get_task("add")
    prompt = "add 4 7 and 8"
    assert task.valid_answers(prompt) == ["4 7 + 8 = 0 5 5", "8 + 4 7 = 0 5 5"]
    for completion in ("4 7 + 8 = 0 5 6", "8 + 4 7 = 5 5 0", "4 7 + 4 7 = 0 5 5", "8 + 8 + 7 = 0 5 5"):
        assert not task.is_valid(prompt, completion), completion
    assert task.valid_answers("add 9 9 and 9")[0] == "9 9 + 9 = 1 0 8"


@pytest.mark.parametrize("name", sorted(DEMO_TASKS))
def test_malformed_prompts_raise_naming_the_prompt(name):
    task = get_task(name)
    with pytest.raises(ValueError, match="is not a"):
        task.is_valid("zzz", "a")


@pytest.mark.parametrize("name", sorted(DEMO_TASKS))
def test_tokenizer_round_trip_and_specials(name, tmp_path):
    task = get_task(name)
    tokenizer = task.tokenizer()
    assert len(tokenizer) == task.vocab_size <= 64
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id] == [0, 2, 3]
    assert tokenizer.padding_side == "left"
    for row in task.sample(20, seed=0):
        ids = tokenizer(row["prompt"] + " " + row["answer"])["input_ids"]
        assert len(ids) == task.prompt_length + task.answer_length  # one token per word, nothing added
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == row["prompt"] + " " + row["answer"]
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.get_vocab() == tokenizer.get_vocab() and reloaded.padding_side == "left"
    batch = reloaded(["a", row["prompt"]], padding=True)
    assert batch["attention_mask"][0][0] == 0  # left padding


def test_teacher_is_the_tiny_bidirectional_qwen3_and_round_trips(tmp_path):
    task = get_task("sort2")
    config = teacher_config(task)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (128, 4, task.vocab_size)
    model = build_teacher(task, seed=0)
    params = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < params < 1.1e6
    assert model.diffusion_config.mask_token_id == task.tokenizer().mask_token_id
    assert model.diffusion_config.attention == "bidirectional"
    assert model.diffusion_generation_config.max_new_tokens == task.answer_length
    assert torch.equal(build_teacher(task, seed=0).lm_head.weight, model.lm_head.weight)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForDiffusionLM.from_pretrained(str(tmp_path))
    assert reloaded.diffusion_generation_config == model.diffusion_generation_config
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_generation_config_budget():
    task = get_task("words")
    config = task.generation_config(tokens_per_step=2)
    assert config.resolve(None) == (4, 2)  # two blocks of 4 tokens, 2 steps per block
    assert get_task("sort2").generation_config(tokens_per_step=4).resolve(None) == (8, 2)


def test_wordsort_accepts_both_sorted_spellings_and_rejects_mixtures():
    task = get_task("wordsort")
    prompt = "wolf bear note cold sand lamp fern jade"
    ascending = "b e a r c o l d f e r n j a d e l a m p n o t e s a n d w o l f"
    descending = "w o l f s a n d n o t e l a m p j a d e f e r n c o l d b e a r"
    assert task.valid_answers(prompt) == [ascending, descending]
    assert task.is_valid(prompt, ascending) and task.is_valid(prompt, descending)
    near_misses = [
        "b o l f c o l d f e r n j a d e l a m p n o t e s a n d w o l f",  # block 0 mixes bear and wolf
        "w e a r s a n d n o t e l a m p j a d e f e r n c o l d b e a r",  # the same, descending
        "b e a r c o l d f e r n j a d e l a m p n o t e w o l f s a n d",  # last two words swapped
        "b e a r c o l d f e r n j a d e l a m p n o t e s a n d w o l",  # one letter short
        "b e a r c o l d f e r n j a d e l a m p n o t e s a n d t i d e",  # a word not in the prompt
    ]
    for completion in near_misses:
        assert not task.is_valid(prompt, completion), completion
    with pytest.raises(ValueError, match="8 distinct words"):
        task.is_valid("wolf wolf note cold sand lamp fern jade", ascending)
    with pytest.raises(ValueError, match="is not a wordsort prompt"):
        task.is_valid("wolf bear note cold sand lamp fern", ascending)  # 7 words


def test_wordorder_accepts_the_given_order_and_its_reverse():
    task = get_task("wordorder")
    prompt = "wolf bear note cold sand lamp fern jade"
    forward = "w o l f b e a r n o t e c o l d s a n d l a m p f e r n j a d e"
    assert task.valid_answers(prompt)[0] == forward
    assert task.is_valid(prompt, forward)
    assert task.is_valid(prompt, "j a d e f e r n l a m p s a n d c o l d n o t e b e a r w o l f")
    assert not task.is_valid(prompt, "j a d e f e r n l a m p s a n d c o l d n o t e w o l f b e a r")


def spell(words) -> str:
    return " ".join("".join(words))


def test_wordset_accepts_every_order_and_rejects_near_misses_without_listing_answers():
    task = get_task("wordset")
    assert (task.answer_length, task.block_length, task.attention) == (32, 4, "block_causal")
    prompt = "wolf bear note cold sand lamp fern jade"
    words = prompt.split()
    valid = task.valid_answers(prompt)
    assert len(valid) == len(set(valid)) == 40_320 and valid[0] == spell(words)
    listed = set(valid)
    orders = [words, words[::-1], sorted(words), [*words[4:], *words[:4]]]
    orders += [random.Random(seed).sample(words, 8) for seed in range(20)]
    for order in orders:
        assert spell(order) in listed and task.is_valid(prompt, spell(order)), order
    assert task.is_valid(prompt, "  " + spell(words[::-1]) + " ")  # whitespace is only a separator
    mixed = spell(words).split()
    mixed[1], mixed[5] = mixed[5], mixed[1]  # "wolf bear" -> "welf boar": letters of two words in each block
    near_misses = {
        "a word twice": spell([*words[:7], "wolf"]),
        "a word not in the prompt": spell([*words[:7], "tide"]),
        "two blocks mixed": " ".join(mixed),
        "one letter short": spell(words)[:-2],
        "one letter long": spell(words) + " e",
        "7 words": spell(words[:7]),
        "9 words": spell([*words, "tide"]),
        "a word spelled backwards": spell(["flow", *words[1:]]),
        "a word split across blocks": " ".join(["x", *spell(words).split()[:-1]]),
    }
    for what, completion in near_misses.items():
        # The checker agrees with the full list of answers, which it never builds.
        assert completion not in listed and not task.is_valid(prompt, completion), what


def test_wordset_malformed_prompts_raise_naming_the_prompt():
    task = get_task("wordset")
    answer = spell(["wolf", "bear", "note", "cold", "sand", "lamp", "fern", "jade"])
    for prompt in (
        "wolf wolf note cold sand lamp fern jade",  # a word twice
        "wolf bear note cold sand lamp fern",  # 7 words
        "wolf bear note cold sand lamp fern zzzz",  # not a task word
        "w bear note cold sand lamp fern jade",  # a letter, not a word
    ):
        with pytest.raises(ValueError, match=f"{prompt!r} is not a wordset prompt"):
            task.is_valid(prompt, answer)
        with pytest.raises(ValueError, match=f"{prompt!r} is not a wordset prompt"):
            task.valid_answers(prompt)


def test_wordset_samples_many_different_orders():
    task = get_task("wordset")
    rows = task.sample(20, seed=0)
    orders = []
    for row in rows:
        letters = row["answer"].split()
        written = ["".join(letters[i : i + 4]) for i in range(0, 32, 4)]
        assert sorted(written) == sorted(row["prompt"].split())
        orders.append(tuple(row["prompt"].split().index(word) for word in written))
    assert len(set(orders)) >= 15  # 20 draws out of 40,320 orders: nearly all different
    assert len({order[0] for order in orders}) >= 4  # block 0 is a choice, not the prompt's first word
    # The same prompt drawn again gives other orders too.
    prompt = rows[0]["prompt"].split()
    rng = random.Random(0)
    assert len({task._draw_answer(prompt, rng) for _ in range(10)}) >= 8


def test_answer_draws_of_the_other_families_are_unchanged():
    # Rows of `sample(3, seed=5)` as drawn before wordset's own answer-draw existed (commit b83e054), when every
    # family drew with rng.choice over its list: the refactor must not move any other family's data.
    assert get_task("sort2").sample(3, seed=5) == [
        {"id": "sort2-5-0", "prompt": "b c l p h e m f =", "answer": "b c e f h l m p"},
        {"id": "sort2-5-1", "prompt": "p n f e i h o d =", "answer": "d e f h i n o p"},
        {"id": "sort2-5-2", "prompt": "e k g o l d m p =", "answer": "d e g k l m o p"},
    ]
    assert get_task("words").sample(3, seed=5) == [
        {"id": "words-5-0", "prompt": "color tool =", "answer": "g r a y r a k e"},
        {"id": "words-5-1", "prompt": "animal food =", "answer": "d u c k p l u m"},
        {"id": "words-5-2", "prompt": "tool food =", "answer": "f i l e b e a n"},
    ]
    assert get_task("wordsort").sample(3, seed=5) == [
        {
            "id": "wordsort-5-0",
            "prompt": "mint lamp hint note pine kelp tide sand",
            "answer": "t i d e s a n d p i n e n o t e m i n t l a m p k e l p h i n t",
        },
        {
            "id": "wordsort-5-1",
            "prompt": "tide gust jade sand pine dusk note wolf",
            "answer": "w o l f t i d e s a n d p i n e n o t e j a d e g u s t d u s k",
        },
        {
            "id": "wordsort-5-2",
            "prompt": "fern lamp pine cold hint tide kelp wolf",
            "answer": "w o l f t i d e p i n e l a m p k e l p h i n t f e r n c o l d",
        },
    ]


def test_wordsort_teacher_is_block_causal_with_blocks_of_four(tmp_path):
    task = get_task("wordsort")
    assert (task.answer_length, task.block_length, task.prompt_length % task.block_length) == (32, 4, 0)
    model = build_teacher(task, seed=0)
    assert model.diffusion_config.attention == "block_causal" and model.diffusion_config.block_size == 4
    assert teacher_config(task).hidden_size == 64
    assert model.diffusion_generation_config.block_length == 4
    model.save_pretrained(tmp_path)
    assert AutoModelForDiffusionLM.from_pretrained(str(tmp_path)).diffusion_config == model.diffusion_config


def _packaged(name: str, n: int):
    """(task, its packaged teacher, ``n`` held-out rows, tokenizer, their prompt ids)."""
    from t3d_trl.demo.quickstart import PACKAGED_TEACHERS

    task = get_task(name)
    model = AutoModelForDiffusionLM.from_pretrained(str(PACKAGED_TEACHERS / name)).eval()
    rows = task.sample(n, seed=12345)
    tokenizer = task.tokenizer()
    prompts = torch.tensor(tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"])
    return task, model, rows, tokenizer, prompts


def test_packaged_wordsort_teacher_is_block_causal_and_answers_one_token_per_step():
    task, model, rows, tokenizer, prompts = _packaged("wordsort", 16)
    assert (model.diffusion_config.attention, model.diffusion_config.block_size) == ("block_causal", 4)
    out = model.diffusion_generate(prompts, generation_config=task.generation_config(1, stop_at_eos=False))
    completions = tokenizer.batch_decode(out[:, prompts.shape[1] :])
    valid = sum(task.is_valid(r["prompt"], c) for r, c in zip(rows, completions))
    assert valid >= 14, completions  # the study measured 98% on 3000 held-out prompts


def test_packaged_wordset_teacher_writes_valid_orders_and_samples_other_ones_at_temperature_one():
    task, model, rows, tokenizer, prompts = _packaged("wordset", 12)
    assert (model.diffusion_config.attention, model.diffusion_config.block_size) == ("block_causal", 4)

    def decode(**settings):
        config = task.generation_config(1, stop_at_eos=False, **settings)
        out = model.diffusion_generate(
            prompts, generation_config=config, generator=torch.Generator().manual_seed(0)
        )
        return tokenizer.batch_decode(out[:, prompts.shape[1] :])

    greedy, sampled = decode(), decode(temperature=1.0)
    assert sum(task.is_valid(r["prompt"], c) for r, c in zip(rows, greedy)) >= 11, greedy
    assert sum(task.is_valid(r["prompt"], c) for r, c in zip(rows, sampled)) >= 10, sampled
    # Every block is a choice: sampling writes other orders than the greedy ones.
    assert sum(g != s for g, s in zip(greedy, sampled)) >= 6, (greedy, sampled)


def test_packaged_bidirectional_wordsort_teacher_decodes_in_blocks_of_four_with_every_cache():
    task, model, rows, tokenizer, prompts = _packaged("wordsort_bidirectional", 16)
    assert (task.attention, task.block_length) == ("bidirectional", 4)
    assert model.diffusion_config.attention == "bidirectional"
    assert model.diffusion_generation_config.block_length == 4  # eight blocks per answer
    for cache in ("none", "prefix", "dual"):
        config = task.generation_config(1, stop_at_eos=False, cache=cache)
        completions = tokenizer.batch_decode(
            model.diffusion_generate(prompts, generation_config=config)[:, 8:]
        )
        valid = sum(task.is_valid(r["prompt"], c) for r, c in zip(rows, completions))
        assert valid >= 14, (cache, completions)  # 99% exact on 256 tuning prompts (docs/demo_tasks.md)
