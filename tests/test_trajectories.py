"""Trajectory collection, the dataset contract, resume, multi-process collection and the Hub card (offline)."""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import torch
from testing_utils import (
    build_bidirectional_model,
    build_block_causal_model,
    build_hub_cache,
    build_tokenizer,
    free_port,
    qwen3_config,
)

from t3d_trl import DiffusionGenerationConfig, TrajectoryMetadata, collect_trajectories, load_trajectories
from t3d_trl.data.hub import push_trajectories_to_hub, trajectory_card
from t3d_trl.data.prompts import encode_prompts, render_prompt
from t3d_trl.data.schema import METADATA_KEY, TRAJECTORY_COLUMNS
from t3d_trl.data.shards import save_dataset, write_summary
from t3d_trl.data.trajectories import (
    PromptRow,
    batch_seed,
    build_prompts,
    collection_summary,
    cut_at_eos,
    drop_long_prompts,
    plan_batches,
)
from t3d_trl.generation.remasking import propose_tokens, select_static
from t3d_trl.models.forward import diffusion_forward
from t3d_trl.models.masks import block_attention_mask, padding_attention_mask

PROBLEMS = [
    "1+1",
    "what is 2*3?",
    "compute 7-4 please",
    "9/3",
    "sum of the numbers 1 to 10",
    "largest prime below 20",
    "x",
    "2^5 = ?",
]
ROWS = [{"problem": p, "answer": str(i), "level": i % 3} for i, p in enumerate(PROBLEMS)]
GREEDY = dict(max_new_tokens=8, block_length=4, steps=8)  # 4 steps per block, 1 token per step


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models run much faster on one thread, above all on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def collect(model, tokenizer, output_dir, rows=ROWS, **kwargs):
    kwargs.setdefault("generation_config", DiffusionGenerationConfig(**GREEDY))
    kwargs.setdefault("batch_size", 3)
    return collect_trajectories(model, tokenizer, rows, "plain", output_dir=output_dir, **kwargs)


def test_round_trip_through_save_to_disk(tmp_path, tokenizer, bidirectional_model):
    dataset = collect(bidirectional_model, tokenizer, tmp_path / "run")
    metadata = TrajectoryMetadata.from_dataset(dataset)
    assert metadata.block_length == 4 and metadata.steps_per_block == 4 and metadata.max_new_tokens == 8
    assert metadata.mask_token_id == tokenizer.mask_token_id and metadata.attention == "bidirectional"
    assert (
        metadata.eos_token_ids == [tokenizer.eos_token_id]
        and metadata.vocab_size == bidirectional_model.config.vocab_size
    )
    assert metadata.prompt_template == "plain" and metadata.use_chat_template and not metadata.dynamic

    assert dataset["id"] == [str(i) for i in range(len(ROWS))]  # source order, whatever the batching
    for row, source in zip(dataset, ROWS):
        assert row["prompt"] == render_prompt(tokenizer, source["problem"])
        assert row["prompt_ids"] == tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        assert (row["problem"], row["answer"], row["level"]) == (
            source["problem"],
            source["answer"],
            source["level"],
        )
        assert row["completion"] == tokenizer.decode(row["completion_ids"], skip_special_tokens=True)
        assert len(row["completion_ids"]) == len(row["decode_step"])

    copy = tmp_path / "copy"
    dataset.filter(lambda row: True).save_to_disk(str(copy))  # plain datasets calls keep the metadata
    for path in (tmp_path / "run", copy):
        loaded = load_trajectories(str(path))
        assert TrajectoryMetadata.from_dataset(loaded) == metadata
        assert loaded.to_list() == dataset.to_list()


def test_a_truncated_dataset_file_is_named_and_a_rerun_rebuilds_it_from_the_shards(
    tmp_path, tokenizer, bidirectional_model
):
    run = tmp_path / "run"
    expected = list(collect(bidirectional_model, tokenizer, run)["completion_ids"])
    [arrow] = run.glob("*.arrow")
    with open(arrow, "r+b") as f:  # a crash or a partial copy: the file ends early
        f.truncate(arrow.stat().st_size // 2)
    with pytest.raises(ValueError) as info:
        load_trajectories(str(run))
    message = str(info.value)
    assert str(run) in message and arrow.name in message and "is damaged" in message
    assert "rerunning `t3d-trl collect` into the same folder rebuilds it from its shards" in message
    collect(
        bidirectional_model, tokenizer, run
    )  # the same call again: every shard is valid, nothing is decoded
    assert list(load_trajectories(str(run))["completion_ids"]) == expected


def test_two_saves_into_one_collection_folder_do_not_collide(tmp_path, monkeypatch):
    # Two processes finishing one collection each merge and save it; neither may delete the other's staging.
    first, second = datasets.Dataset.from_dict({"x": [1, 2]}), datasets.Dataset.from_dict({"x": [3]})
    save_to_disk = datasets.Dataset.save_to_disk

    def save_while_another_saves(self, path, **kwargs):
        save_to_disk(self, path, **kwargs)
        if self is first:  # the other process saves between this save and its move into place
            save_dataset(second, tmp_path)

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", save_while_another_saves)
    save_dataset(first, tmp_path)
    assert datasets.load_from_disk(str(tmp_path))["x"] == [1, 2]  # the last save to move in, whole
    assert not list(tmp_path.glob(".saving*"))


def test_two_processes_writing_one_collection_summary_do_not_collide(tmp_path, monkeypatch):
    (tmp_path / "collection.json").write_text("{}")
    replace, getpid = os.replace, os.getpid

    def replace_after_another_process_writes(src, dst):
        if os.getpid() == getpid():  # the other process writes its summary between this write and its move
            monkeypatch.setattr(os, "getpid", lambda: getpid() + 1)
            write_summary(tmp_path, {"rows": 2})
            monkeypatch.setattr(os, "getpid", getpid)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_after_another_process_writes)
    write_summary(tmp_path, {"rows": 1})
    assert json.loads((tmp_path / "collection.json").read_text())["summary"] == {"rows": 1}
    assert not list(tmp_path.glob(".*.tmp"))


def test_card_renders_metadata_and_loads_back(tmp_path, tokenizer, bidirectional_model):
    dataset = collect(bidirectional_model, tokenizer, tmp_path / "run")
    metadata = TrajectoryMetadata.from_dataset(dataset)
    base = trajectory_card(metadata, "me/traj")
    base.data.dataset_info = {"features": [{"name": "id", "dtype": "string"}]}  # what `datasets` writes
    with_base = trajectory_card(metadata, "me/traj", base=base)
    assert with_base.data.to_dict()["dataset_info"] == base.data.dataset_info  # existing YAML entries survive
    card = trajectory_card(metadata, "me/traj", num_rows=len(dataset), extra_columns=["answer"])

    assert card.data.to_dict()[METADATA_KEY] == metadata.to_dict()
    assert "t3d-trl" in card.data.tags
    text = card.text
    assert f"{len(dataset)} trajectories" in text and 'load_trajectories("me/traj")' in text
    for key, value in metadata.to_dict().items():
        assert f"| `{key}` | `{value!r}` |" in text
    for column in (*TRAJECTORY_COLUMNS, "answer"):
        assert f"| `{column}` |" in text

    # A Hub snapshot: parquet data plus the card, without metadata in the data files' info.
    snapshot = tmp_path / "snapshot"
    (snapshot / "data").mkdir(parents=True)
    datasets.Dataset.from_list(dataset.to_list()).to_parquet(
        str(snapshot / "data" / "train-00000-of-00001.parquet")
    )
    card.save(snapshot / "README.md")
    loaded = load_trajectories(str(snapshot))
    assert TrajectoryMetadata.from_dataset(loaded) == metadata
    assert loaded.to_list() == dataset.to_list()


def test_loading_without_metadata_fails(tmp_path):
    datasets.Dataset.from_list([{"id": "a"}]).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match="no trajectory metadata"):
        load_trajectories(str(tmp_path))


def test_a_missing_folder_is_named_not_blamed_on_the_hub(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder \\(nor a valid Hub dataset repo id\\)"):
        load_trajectories(str(tmp_path / "nowhere"))
    with pytest.raises(
        FileNotFoundError, match="tiny-traj: no such folder, and the Hub could not be reached"
    ):
        load_trajectories("tiny-traj")  # a valid repo id; the tests run with HF_HUB_OFFLINE=1
    (tmp_path / "rows.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(ValueError, match="rows.jsonl is a file: a trajectory dataset is a folder"):
        load_trajectories(str(tmp_path / "rows.jsonl"))
    from t3d_trl.demo.quickstart import (
        PACKAGED_TEACHERS,
    )  # a model folder passed by mistake: JSON, no dataset

    with pytest.raises(ValueError, match="cannot read the folder .*sort2' as a dataset"):
        load_trajectories(str(PACKAGED_TEACHERS / "sort2"))


def test_a_split_a_single_dataset_does_not_have_is_refused(tmp_path, tokenizer, bidirectional_model):
    collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3])
    assert len(load_trajectories(str(tmp_path))) == 3  # one dataset reads as its "train" split
    with pytest.raises(ValueError, match="one dataset without splits .* not split 'test'"):
        load_trajectories(str(tmp_path), split="test")  # it would silently be the same rows


def test_prompts_the_tokenizer_cannot_read_are_refused(tmp_path, tokenizer, bidirectional_model):
    """Another model's tokenizer (or another task's teacher) reads most of the data as the unknown token; the
    teacher would decode from nothing and the collection would report success."""
    foreign = [{"id": str(i), "problem": "ßøñé" * 2} for i in range(4)]  # outside the character vocabulary
    with pytest.raises(ValueError, match=r"32 of the prompts' 108 tokens are the unknown token '\[UNK\]'"):
        collect(bidirectional_model, tokenizer, tmp_path / "foreign", rows=foreign)
    assert not (tmp_path / "foreign" / "shards").exists()  # refused before anything was decoded
    mixed = [{"id": "0", "problem": "café au lait"}]  # an unknown character among known ones is decoded
    assert len(collect(bidirectional_model, tokenizer, tmp_path / "mixed", rows=mixed)) == 1


def test_an_output_dir_holding_another_dataset_is_refused(tmp_path, tokenizer, bidirectional_model):
    # Collecting into the source's own folder (or any saved dataset) would overwrite it.
    source = tmp_path / "source"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(source))
    splits = tmp_path / "splits"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(splits))
    for folder, saved in ((source, "state.json"), (splits, "dataset_dict.json")):
        before = sorted(p.name for p in folder.iterdir())
        with pytest.raises(
            ValueError, match=rf"holds a saved dataset \({saved}\) that is not a trajectory collection"
        ):
            collect(bidirectional_model, tokenizer, folder, rows=datasets.load_from_disk(str(source)))
        assert sorted(p.name for p in folder.iterdir()) == before
    assert datasets.load_from_disk(str(source)).to_list() == ROWS


# --- faithfulness: the teacher's intermediate states rebuilt from decode_step ------------------------------


def teacher_step(model, metadata, prompt_ids, completion_ids, decode_step, step):
    """Re-run the teacher's static step ``step`` from the state rebuilt from the record (one row, no padding).

    The canvas is laid out as the sampler documents: ``[prompt | max_new_tokens masks]``; bidirectional blocks
    start at the prompt end, block-causal blocks are aligned to position 0. Returns the set of completion
    positions the teacher commits and the tokens it commits there.
    """
    mask_id, block_length = metadata.mask_token_id, metadata.block_length
    n_prompt, n_gen = len(prompt_ids), metadata.max_new_tokens
    state = [t if s < step else mask_id for t, s in zip(completion_ids, decode_step)]
    state += [mask_id] * (n_gen - len(state))  # positions after the completion were still masked
    block = metadata.completion_blocks(n_prompt, len(completion_ids))[decode_step.index(step)]
    canvas = prompt_ids + state
    if metadata.attention == "bidirectional":
        start = n_prompt + block * block_length
        tokens = torch.tensor([canvas])
        valid = torch.ones_like(tokens, dtype=torch.bool)
        mask = padding_attention_mask(valid, tokens.shape[1], torch.float32)
    else:
        # Run the canvas up to the end of the current block; the last block may reach past the completion.
        start = (n_prompt // block_length + block) * block_length
        end = start + block_length
        tokens = torch.tensor([(canvas + [0] * block_length)[:end]])
        valid = (torch.arange(end) < len(canvas)).unsqueeze(0)
        ids = torch.arange(end).unsqueeze(0) // block_length
        mask = block_attention_mask(ids, ids, valid, torch.float32)
    keep = torch.arange(start, start + block_length)
    positions = torch.arange(tokens.shape[1]).unsqueeze(0) * valid
    logits, _ = diffusion_forward(model, model.diffusion_config, tokens, mask, positions, keep=keep)
    x0, score = propose_tokens(logits, 0.0, metadata.remasking)
    masked = (tokens[:, keep] == mask_id) & (keep >= n_prompt).unsqueeze(0)
    commit = select_static(score, masked, torch.tensor([decode_step.count(step)]))[0]
    positions = [int(start + i - n_prompt) for i in commit.nonzero().flatten()]
    return set(positions), {p: int(x0[0, p + n_prompt - start]) for p in positions}


@pytest.mark.parametrize("build", [build_bidirectional_model, build_block_causal_model])
def test_trajectory_is_faithful(tmp_path, tokenizer, build):
    model = build(tokenizer)
    config = DiffusionGenerationConfig(max_new_tokens=12, block_length=4, steps=12)
    dataset = collect(model, tokenizer, tmp_path, generation_config=config)
    metadata = TrajectoryMetadata.from_dataset(dataset)
    if metadata.attention == "block_causal":
        assert {len(p) % 4 for p in dataset["prompt_ids"]} != {0}  # some prompt tails share a block
    checked = 0
    for row in dataset:
        steps, tokens, n_prompt = row["decode_step"], row["completion_ids"], len(row["prompt_ids"])
        blocks = metadata.completion_blocks(n_prompt, len(tokens))
        # Tokens after EOS are not recorded, so the block holding EOS is checked only when EOS ends it.
        eos_ends_block = (metadata.block_offset(n_prompt) + len(tokens)) % metadata.block_length == 0
        last = blocks[-1] if not row["finished"] or eos_ends_block else blocks[-1] - 1
        for step in sorted({s for s, b in zip(steps, blocks) if b <= last}):
            positions, committed = teacher_step(model, metadata, row["prompt_ids"], tokens, steps, step)
            assert positions == {i for i, s in enumerate(steps) if s == step}, (row["id"], step)
            assert committed == {i: tokens[i] for i in positions}, (row["id"], step)
            checked += 1
    assert checked >= len(ROWS) * 8


def test_dynamic_collection_is_recorded_and_valid(tmp_path, tokenizer, block_causal_model):
    config = DiffusionGenerationConfig(max_new_tokens=8, threshold=0.001)
    dataset = collect(block_causal_model, tokenizer, tmp_path, generation_config=config)
    metadata = TrajectoryMetadata.from_dataset(dataset)
    assert (
        metadata.dynamic and metadata.threshold == 0.001 and metadata.block_length == 4
    )  # the model's block
    assert len(load_trajectories(str(tmp_path))) == len(ROWS)
    # Every probability clears so low a threshold: a step commits several tokens at once.
    assert any(len(set(steps)) < len(steps) for steps in dataset["decode_step"])


def test_approximate_cache_collection_says_so(tmp_path, tokenizer, bidirectional_model, caplog):
    config = DiffusionGenerationConfig(max_new_tokens=8, block_length=4, tokens_per_step=1, cache="dual")
    with caplog.at_level(logging.WARNING):
        dataset = collect(bidirectional_model, tokenizer, tmp_path / "dual", generation_config=config)
    metadata = TrajectoryMetadata.from_dataset(dataset)
    assert metadata.cache == "dual" and metadata.approximate and metadata.schedule == "llada"
    assert "cache_implementation='dual' is approximate" in caplog.text
    exact = collect(
        bidirectional_model, tokenizer, tmp_path / "exact", generation_config=config.update(cache="none")
    )
    assert not TrajectoryMetadata.from_dataset(exact).approximate


# --- resume and scale-out ----------------------------------------------------------------------------------

SAMPLED = dict(max_new_tokens=8, block_length=4, steps=8, temperature=1.0)


class Crash(RuntimeError):
    pass


def test_resume_after_crash_gives_the_uninterrupted_rows(tmp_path, tokenizer, monkeypatch):
    config = DiffusionGenerationConfig(**SAMPLED)  # sampling: the per-batch seeding must make reruns agree
    reference = collect(
        build_bidirectional_model(tokenizer), tokenizer, tmp_path / "ref", generation_config=config, seed=7
    )

    model = build_bidirectional_model(tokenizer)
    real = type(model).diffusion_generate
    calls = []

    def crash_on_third_batch(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Crash("killed")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "diffusion_generate", crash_on_third_batch)
    with pytest.raises(Crash):
        collect(model, tokenizer, tmp_path / "run", generation_config=config, seed=7)
    shards = sorted((tmp_path / "run" / "shards").glob("*.parquet"))
    assert len(shards) == 2 and not list((tmp_path / "run" / "shards").glob(".*"))
    with pytest.raises(ValueError, match="unfinished collection"):
        load_trajectories(str(tmp_path / "run"))

    # What a kill (no finally) leaves: a merge's half-saved staging copy, a manifest write's staging file.
    (tmp_path / "run" / ".saving-abc123").mkdir()
    (tmp_path / "run" / ".saving-abc123" / "data-00000-of-00001.arrow").write_bytes(b"x" * 100)
    (tmp_path / "run" / ".collection.json.99.tmp").write_text("{")
    calls.clear()
    resumed = collect(model, tokenizer, tmp_path / "run", generation_config=config, seed=7)
    assert len(calls) == 1  # only the lost batch was decoded again
    assert not list((tmp_path / "run").glob(".*"))  # the rerun sweeps them
    assert resumed.to_list() == reference.to_list()
    monkeypatch.undo()
    assert (
        resumed.to_list()
        != collect(model, tokenizer, tmp_path / "seed8", generation_config=config, seed=8).to_list()
    )


def test_resume_refuses_other_settings(tmp_path, tokenizer, bidirectional_model):
    collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3])
    other = DiffusionGenerationConfig(**{**GREEDY, "temperature": 0.5})
    with pytest.raises(
        ValueError, match=r"(?s)batch_size: 3 \(saved\) != 2 \(now\).*temperature: 0\.0 \(saved\) != 0\.5"
    ):
        collect(
            bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3], batch_size=2, generation_config=other
        )
    # More prompts that do not start with the saved ones are another collection (the same count: only the digest).
    with pytest.raises(ValueError, match="num_prompts: 3 \\(saved\\) != 4"):
        collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[1:5])
    with pytest.raises(
        ValueError, match="prompts_sha256: '[0-9a-f]{64}' \\(saved\\) != '[0-9a-f]{64}' \\(now\\)"
    ):
        collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[1:4])
    # A collection saved before a decoding setting existed resumes when the setting is at its default.
    manifest = json.loads((tmp_path / "collection.json").read_text())
    del manifest["generation_config"]["cfg_scale"]
    (tmp_path / "collection.json").write_text(json.dumps(manifest))
    assert len(collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3])) == 3
    with pytest.raises(ValueError, match="cfg_scale: 0.0 \\(saved\\) != 0.5"):
        guided = DiffusionGenerationConfig(**GREEDY, cfg_scale=0.5)
        collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3], generation_config=guided)
    # Another teacher built in memory has no name either ("unknown" both times): its weights tell it apart.
    other_teacher = build_bidirectional_model(tokenizer, seed=1)
    assert not other_teacher.name_or_path and not bidirectional_model.name_or_path
    with pytest.raises(
        ValueError, match=r"teacher_weights: '[0-9a-f]{64}' \(saved\) != '[0-9a-f]{64}' \(now\)"
    ):
        collect(other_teacher, tokenizer, tmp_path, rows=ROWS[:3])
    # ... and a collection started before the fingerprint was recorded still resumes.
    del manifest["teacher_weights"]
    (tmp_path / "collection.json").write_text(json.dumps(manifest))
    assert len(collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:3])) == 3


def test_more_prompts_after_the_saved_ones_extend_the_collection(tmp_path, tokenizer, monkeypatch):
    config = DiffusionGenerationConfig(**SAMPLED)  # sampling: a batch's rows depend on its ids and seed
    model = build_bidirectional_model(tokenizer)
    base = collect(model, tokenizer, tmp_path, rows=ROWS[:3], generation_config=config, seed=7)
    shard = (tmp_path / "shards" / "batch-000000.parquet").read_bytes()

    calls = _count_generations(monkeypatch, model)
    extended = collect(model, tokenizer, tmp_path, rows=ROWS[:6], generation_config=config, seed=7)
    assert len(calls) == 1  # only the three new prompts (one batch of 3) were decoded
    assert extended.to_list()[:3] == base.to_list()  # the saved rows, untouched
    assert (tmp_path / "shards" / "batch-000000.parquet").read_bytes() == shard
    assert extended["problem"] == PROBLEMS[:6]  # source order
    manifest = json.loads((tmp_path / "collection.json").read_text())
    assert manifest["collection"]["parts"] == [3, 6] and manifest["collection"]["num_prompts"] == 6
    assert collection_summary(tmp_path).startswith("6 prompts, 6 trajectories")

    calls.clear()  # the same call again: nothing to decode, the same rows
    assert collect(model, tokenizer, tmp_path, rows=ROWS[:6], generation_config=config, seed=7).to_list() == (
        extended.to_list()
    )
    assert not calls

    # An extension interrupted before its merge leaves the dataset merged last in place; a rerun finishes it.
    real = type(model).diffusion_generate

    def crash(self, *args, **kwargs):
        raise Crash("killed")

    monkeypatch.setattr(type(model), "diffusion_generate", crash)
    with pytest.raises(Crash):
        collect(model, tokenizer, tmp_path, rows=ROWS, generation_config=config, seed=7)
    assert load_trajectories(str(tmp_path)).to_list() == extended.to_list()
    assert collection_summary(tmp_path).startswith("6 prompts, 6 trajectories")
    monkeypatch.setattr(type(model), "diffusion_generate", real)
    full = collect(model, tokenizer, tmp_path, rows=ROWS, generation_config=config, seed=7)
    assert full.to_list()[:6] == extended.to_list() and len(full) == len(ROWS)
    assert json.loads((tmp_path / "collection.json").read_text())["collection"]["parts"] == [3, 6, 8]

    # Fewer prompts than the folder holds are refused, naming the counts.
    with pytest.raises(ValueError, match="num_prompts: 8 \\(saved\\) != 3 \\(now\\)"):
        collect(model, tokenizer, tmp_path, rows=ROWS[:3], generation_config=config, seed=7)


def test_auto_batch_size_resumes_with_the_collections_own(
    tmp_path, tokenizer, bidirectional_model, monkeypatch
):
    import t3d_trl.data.trajectories as trajectories

    monkeypatch.setattr(trajectories, "auto_batch_size", lambda *args: 3)
    reference = collect(bidirectional_model, tokenizer, tmp_path, batch_size=None)
    # The free memory changed since: a resume keeps the batches the collection started with.
    monkeypatch.setattr(trajectories, "auto_batch_size", lambda *args: 2)
    calls = _count_generations(monkeypatch, bidirectional_model)
    assert collect(bidirectional_model, tokenizer, tmp_path, batch_size=None).to_list() == reference.to_list()
    assert not calls
    assert json.loads((tmp_path / "collection.json").read_text())["collection"]["batch_size"] == 3
    with pytest.raises(ValueError, match=r"batch_size: 3 \(saved\) != 2 \(now\)"):
        collect(bidirectional_model, tokenizer, tmp_path, batch_size=2)  # asked for explicitly: refused


def _collect_worker(rank: int, world_size: int, port: int, output_dir: str, **kwargs) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    dataset = collect(
        build_bidirectional_model(tokenizer),
        tokenizer,
        output_dir,
        generation_config=DiffusionGenerationConfig(**SAMPLED),
        seed=7,
        **kwargs,
    )
    assert torch.distributed.get_world_size() == world_size
    assert len(dataset) == len(ROWS)  # every process gets the merged dataset
    torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_two_processes_equal_one(tmp_path, tokenizer):
    # Two real processes joined by a gloo process group; forked, so they reuse this process's imports.
    torch.multiprocessing.start_processes(
        _collect_worker, args=(2, free_port(), str(tmp_path / "two")), nprocs=2, start_method="fork"
    )
    # Each process wrote its own batches (0 and 2 by rank 0, 1 by rank 1).
    assert len(list((tmp_path / "two" / "shards").glob("*.parquet"))) == 3
    two = load_trajectories(str(tmp_path / "two"))
    one = collect(
        build_bidirectional_model(tokenizer),
        tokenizer,
        tmp_path / "one",
        generation_config=DiffusionGenerationConfig(**SAMPLED),
        seed=7,
    )
    assert sorted(two.to_list(), key=lambda r: r["id"]) == sorted(one.to_list(), key=lambda r: r["id"])
    assert TrajectoryMetadata.from_dataset(two) == TrajectoryMetadata.from_dataset(one)


def _auto_batch_worker(rank: int, world_size: int, port: int, output_dir: str) -> None:
    import t3d_trl.data.trajectories as trajectories

    # Emulate two GPUs with different free memory: 4 rows fit on rank 0, 3 on rank 1.
    trajectories.auto_batch_size = lambda *args: 4 - rank
    _collect_worker(rank, world_size, port, output_dir, batch_size=None)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_two_processes_agree_on_the_auto_batch_size(tmp_path):
    # Each process planning its own batches would split the prompts differently (and the manifest would refuse).
    torch.multiprocessing.start_processes(
        _auto_batch_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="fork"
    )
    assert json.loads((tmp_path / "collection.json").read_text())["collection"]["batch_size"] == 3
    assert len(list((tmp_path / "shards").glob("*.parquet"))) == 3  # 8 prompts in batches of 3
    assert len(load_trajectories(str(tmp_path))) == len(ROWS)


# --- filters -----------------------------------------------------------------------------------------------


def test_filters(tmp_path, tokenizer, bidirectional_model, monkeypatch):
    # Take as EOS a token that some, not all, completions hold, so both finished and unfinished ones occur.
    plain = collect(
        bidirectional_model,
        tokenizer,
        tmp_path / "plain",
        generation_config=DiffusionGenerationConfig(**SAMPLED),
    )
    holders = Counter(token for ids in plain["completion_ids"] for token in set(ids))
    eos = next(token for token, count in holders.most_common() if count < len(plain))
    config = DiffusionGenerationConfig(**SAMPLED, eos_token_id=eos)
    full = collect(bidirectional_model, tokenizer, tmp_path, generation_config=config)
    finished = [r["id"] for r in full if r["finished"]]
    assert 0 < len(finished) < len(full)
    only_finished = collect(
        bidirectional_model, tokenizer, tmp_path, generation_config=config, filter_unfinished=True
    )
    assert only_finished["id"] == finished  # filters apply when merging: a rerun re-filters the same shards

    seen = []
    with pytest.raises(ValueError, match="gold_column needs answer_checker"):
        collect(
            bidirectional_model, tokenizer, tmp_path / "gold", generation_config=config, gold_column="answer"
        )
    kept = collect(
        bidirectional_model,
        tokenizer,
        tmp_path / "gold",
        generation_config=config,
        gold_column="answer",
        answer_checker=lambda completion, gold: seen.append(gold) or gold in ("1", "4"),
        keep_columns=["level"],
    )
    assert kept["id"] == [r["id"] for r in full if r["answer"] in ("1", "4")] and len(kept) > 0
    assert kept.column_names[-2:] == ["level", "answer"]  # the gold column is passed through
    assert sorted(seen) == sorted(full["answer"])  # every collected completion was checked once


def test_filters_that_drop_every_row_leave_an_empty_collection(tmp_path, tokenizer, bidirectional_model):
    empty = collect(
        bidirectional_model, tokenizer, tmp_path, gold_column="answer", answer_checker=lambda c, g: False
    )
    assert len(empty) == 0 and TrajectoryMetadata.from_dataset(empty) is not None
    assert collection_summary(tmp_path) == (
        f"8 prompts, 0 trajectories saved to {tmp_path}, 8 dropped: 8 answer does not match gold_column='answer'"
    )
    with pytest.raises(
        ValueError, match=r"holds an empty dataset \(0 rows\): there is nothing to load \(the collection: "
    ):
        load_trajectories(str(tmp_path))
    with pytest.raises(ValueError, match="0 rows: nothing to push to me/t"):  # refused before any Hub call
        push_trajectories_to_hub(empty, "me/t")
    # The shards are kept: another filter keeps rows again without decoding.
    assert len(collect(bidirectional_model, tokenizer, tmp_path)) == len(ROWS)


def test_a_rerun_passes_through_and_filters_on_the_source_as_it_is_now(
    tmp_path, tokenizer, bidirectional_model, monkeypatch
):
    first = collect(bidirectional_model, tokenizer, tmp_path, keep_columns=["level"])
    assert first.column_names[-1] == "level"
    assert pq.read_table(next((tmp_path / "shards").glob("*.parquet"))).column_names == list(
        TRAJECTORY_COLUMNS
    )
    # The gold answers are corrected (same ids, same prompts): the rerun re-filters on them, and may add the gold
    # column to keep_columns, without decoding.
    corrected = [{**row, "answer": completion} for row, completion in zip(ROWS, first["completion"])]
    calls = _count_generations(monkeypatch, bidirectional_model)
    rerun = collect(
        bidirectional_model,
        tokenizer,
        tmp_path,
        rows=corrected,
        keep_columns=["level"],
        gold_column="answer",
        answer_checker=lambda completion, gold: completion == gold,
    )
    assert not calls
    assert rerun.to_list() == [{**row, "answer": row["completion"]} for row in first.to_list()]
    # A collection started when keep_columns was a resume setting still resumes.
    manifest = json.loads((tmp_path / "collection.json").read_text())
    manifest["collection"]["keep_columns"] = ["level"]
    (tmp_path / "collection.json").write_text(json.dumps(manifest))
    assert collect(bidirectional_model, tokenizer, tmp_path, rows=corrected).column_names[-3:] == list(
        ROWS[0]
    )


# --- prompts, batching, small helpers ----------------------------------------------------------------------


def test_encode_prompts_adds_no_second_bos():
    """A prompt already rendered elsewhere (lm-eval's chat templating) keeps its one BOS."""
    from tokenizers import processors

    tokenizer = build_tokenizer()  # a copy that adds BOS to raw text, as Llama-style tokenizers do
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", tokenizer.bos_token_id)]
    )
    rendered = render_prompt(tokenizer, "hi")
    assert rendered.startswith(tokenizer.bos_token)
    texts, ids = encode_prompts(tokenizer, [rendered, "plain"], use_chat_template=False)
    assert texts == [rendered, "plain"]
    assert ids[0] == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0].count(tokenizer.bos_token_id) == 1
    assert ids[1] == tokenizer("plain")["input_ids"]  # a raw message gets the usual special tokens
    assert encode_prompts(tokenizer, ["hi"])[1] == [
        ids[0]
    ]  # the same ids as the library's own chat rendering


def test_build_prompts(tokenizer):
    rows = datasets.Dataset.from_list(
        [
            {"question": "2+2", "uid": 10, "chat": [{"role": "user", "content": "hi"}], "prompt": "old"},
            {
                "question": "a longer one",
                "uid": 11,
                "chat": [{"role": "user", "content": "hello"}],
                "prompt": "x",
            },
        ]
    )
    prompts = build_prompts(
        rows, tokenizer, "Q: {problem}", prompt_column="question", id_column="uid", use_chat_template=False
    )
    assert [p.prompt for p in prompts] == ["Q: 2+2", "Q: a longer one"]
    assert [p.id for p in prompts] == ["10", "11"]
    assert list(prompts[0].extra) == ["question", "uid", "chat"]  # "prompt" is a trajectory column
    short = len(tokenizer(render_prompt(tokenizer, "hi"), add_special_tokens=False)["input_ids"])
    chat = build_prompts(rows, tokenizer, chat_column="chat", keep_columns=["uid"])
    assert [p.prompt for p in chat] == [render_prompt(tokenizer, m) for m in ("hi", "hello")]
    assert chat[0].extra == {"uid": 10}
    kept, dropped = drop_long_prompts(chat, short, None, 8)
    assert [p.prompt for p in kept] == [render_prompt(tokenizer, "hi")]
    assert dropped == {f"prompt longer than max_prompt_length={short}": 1}
    # The model's positions bound prompt + max_new_tokens; the first rule that drops a prompt counts it.
    kept, dropped = drop_long_prompts(chat, None, short + 8, 8)
    assert (
        len(kept) == 1 and list(dropped.values()) == [1] and "max_position_embeddings" in next(iter(dropped))
    )
    with pytest.raises(ValueError, match="trajectory columns"):
        build_prompts(rows, tokenizer, "{question}", keep_columns=["prompt"])
    with pytest.raises(ValueError, match="appears twice"):
        build_prompts(
            datasets.Dataset.from_list([{"problem": "a", "id": 1}, {"problem": "b", "id": 1}]), tokenizer
        )
    # An empty cell would otherwise become the prompt "None".
    with pytest.raises(
        ValueError, match=r"row 1: prompt template field\(s\) \['problem'\] are empty \(None\)"
    ):
        build_prompts(datasets.Dataset.from_list([{"problem": "a"}, {"problem": None}]), tokenizer, "plain")
    with pytest.raises(KeyError, match="prompt_column 'problem'"):
        build_prompts(rows, tokenizer)
    # A missing id would become the id "None".
    with pytest.raises(ValueError, match="row 1 has no id in column 'id'"):
        build_prompts(
            datasets.Dataset.from_list([{"problem": "a", "id": "x"}, {"problem": "b", "id": None}]), tokenizer
        )


def test_chat_prompts_stop_at_the_last_user_turn(tokenizer, caplog):
    # An SFT conversation's assistant answer used to reach the teacher's prompt, silently.
    sft = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ANSWER"},
    ]
    rows = datasets.Dataset.from_list([{"chat": sft}, {"chat": sft[:2]}])
    with caplog.at_level(logging.WARNING, logger="t3d_trl"):
        prompts = build_prompts(rows, tokenizer, chat_column="chat")
    assert prompts[0].prompt == prompts[1].prompt and "ANSWER" not in prompts[0].prompt
    assert "1 of 2 conversations go on after their last user turn" in caplog.text
    as_text = datasets.Dataset.from_list([{"chat": json.dumps(sft)}])  # a JSON export's string
    with pytest.raises(ValueError, match=r"row 0: 'chat' holds str .* not a list of \{'role', 'content'\}"):
        build_prompts(as_text, tokenizer, chat_column="chat")
    with pytest.raises(ValueError, match="row 0: 'chat' has no user message"):
        build_prompts(datasets.Dataset.from_list([{"chat": sft[:1]}]), tokenizer, chat_column="chat")
    plain = build_tokenizer()
    plain.chat_template = None
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        build_prompts(rows, plain, chat_column="chat")


def test_prompt_template_fields(tokenizer):
    rows = datasets.Dataset.from_list([{"question": "2+2", "answer": "4"}])
    # A template without {problem} needs no prompt_column.
    [prompt] = build_prompts(rows, tokenizer, "Q: {question}", use_chat_template=False)
    assert prompt.prompt == "Q: 2+2"
    [prompt] = build_prompts(
        rows, tokenizer, "{problem} in \\boxed{{}}", prompt_column="question", use_chat_template=False
    )
    assert prompt.prompt == "2+2 in \\boxed{}"
    for template in ("{problem} in \\boxed{}", "{problem} {0}", "{problem} {"):
        with pytest.raises(
            ValueError, match=r"prompt template .*write literal braces doubled.*\{\{ and \}\}"
        ):
            build_prompts(rows, tokenizer, template, prompt_column="question")


def test_plan_batches_and_seeds():
    prompts = [PromptRow(i, str(i), "", [0] * n, {}) for i, n in enumerate([3, 5, 3, 9, 1])]
    batches = plan_batches(prompts, 2)
    assert [[p.id for p in b] for b in batches] == [["3", "1"], ["0", "2"], ["4"]]
    # In parts, each slice is planned on its own: the first two prompts keep the batch they had alone.
    assert [[p.id for p in b] for b in plan_batches(prompts, 2, [2, 5])] == [["1", "0"], ["3", "2"], ["4"]]
    assert plan_batches(prompts[:2], 2) == plan_batches(prompts, 2, [2, 5])[:1]
    assert batch_seed(0, ["a", "b"]) == batch_seed(0, ["a", "b"]) != batch_seed(1, ["a", "b"])
    assert batch_seed(0, ["a", "b"]) != batch_seed(0, ["b", "a"])
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches(prompts, 0)


def test_cut_at_eos():
    assert cut_at_eos([5, 6, 2, 0], [2, 1, 3, 0], [2]) == ([5, 6, 2], [2, 1, 3], True)
    assert cut_at_eos([5, 6, 7], [2, 1, 3], [2]) == ([5, 6, 7], [2, 1, 3], False)


# --- validation --------------------------------------------------------------------------------------------


def _metadata(**overrides):
    values = dict(
        teacher="t",
        mask_token_id=3,
        attention="bidirectional",
        block_length=4,
        steps_per_block=2,
        max_new_tokens=8,
        vocab_size=100,
        eos_token_ids=[2],
    )
    return TrajectoryMetadata(**{**values, **overrides})


def _row(**overrides):
    row = dict(
        id="r1",
        prompt="p",
        prompt_ids=[1, 7, 8],
        completion_ids=[10, 11, 12, 13, 14, 2],
        decode_step=[2, 1, 1, 2, 3, 4],
        finished=True,
        completion="x",
    )
    return {**row, **overrides}


def _save(tmp_path, rows, metadata):
    path = tmp_path / "data"
    metadata.attach(datasets.Dataset.from_list(rows)).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(decode_step=[2, 1, 1, 2, 3]), "completion_ids has 6 tokens but decode_step has 5 entries"),
        (
            dict(decode_step=[2, 1, 1, 3, 3, 4]),
            r"decode_step\[3\]=3 is outside \[1, 2\], the steps of block 0",
        ),
        (dict(decode_step=[2, 1, 1, 2, 3, 0]), r"decode_step\[5\]=0 is outside \[3, 4\]"),
        (dict(completion_ids=[10, 11, 120, 13, 14, 2]), "token id 120, outside the vocabulary of size 100"),
        (dict(completion_ids=[10, 3, 12, 13, 14, 2]), "mask token"),
        (dict(finished=False), "finished=False but the completion ends with EOS"),
        (dict(completion_ids=[10, 2, 12, 13, 14, 2]), "EOS at position 1 before the end"),
        (dict(completion_ids=None), "column 'completion_ids' is empty"),
    ],
)
def test_corrupt_rows_are_refused(tmp_path, overrides, message):
    path = _save(tmp_path, [_row(id="good"), _row(**overrides)], _metadata())
    with pytest.raises(ValueError, match=rf"row id='r1' \(row 1\): .*{message}"):
        load_trajectories(path)


def test_missing_column_is_refused(tmp_path):
    rows = [{k: v for k, v in _row().items() if k != "decode_step"}]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['decode_step'\]"):
        load_trajectories(_save(tmp_path, rows, _metadata()))


def test_skip_invalid_drops_and_counts(tmp_path, caplog):
    rows = [_row(id="a"), _row(id="b", decode_step=[9] * 6), _row(id="c"), _row(id="d", completion_ids=[1])]
    with caplog.at_level(logging.WARNING):
        loaded = load_trajectories(_save(tmp_path, rows, _metadata()), skip_invalid=True)
    assert loaded["id"] == ["a", "c"]
    assert "skipped 2 invalid trajectory rows of 4" in caplog.text and "id='b'" in caplog.text


def test_block_causal_and_dynamic_step_rules(tmp_path):
    # Block-causal: a 3-token prompt puts its tail in the first block, so completion token 1 starts block 1.
    causal = _metadata(attention="block_causal")
    good = _row(decode_step=[1, 3, 3, 4, 4, 6])
    assert load_trajectories(_save(tmp_path / "a", [good], causal))["id"] == ["r1"]
    with pytest.raises(ValueError, match=r"decode_step\[1\]=2 is outside \[3, 4\]"):
        load_trajectories(_save(tmp_path / "b", [_row(decode_step=[1, 2, 3, 4, 4, 6])], causal))
    # Dynamic decoding: per-row step counts, only their order across blocks is checked.
    dynamic = _metadata(threshold=0.9)
    assert load_trajectories(_save(tmp_path / "c", [_row(decode_step=[1, 1, 1, 1, 2, 2])], dynamic))[
        "id"
    ] == ["r1"]
    with pytest.raises(ValueError, match="block 1 does not come after block 0"):
        load_trajectories(_save(tmp_path / "d", [_row(decode_step=[1, 1, 3, 3, 2, 4])], dynamic))


def test_shards_are_parquet_with_the_schema(tmp_path, tokenizer, bidirectional_model):
    collect(bidirectional_model, tokenizer, tmp_path, rows=ROWS[:2])
    table = pq.read_table(next(Path(tmp_path, "shards").glob("*.parquet")))
    assert table.column_names == list(TRAJECTORY_COLUMNS)  # the source columns are added at the merge


def test_accelerate_cpu_launch_that_starts_one_process_is_refused(
    tmp_path, tokenizer, bidirectional_model, monkeypatch
):
    # `accelerate launch --cpu --num_processes 2` without mpirun starts one process, exporting MASTER_ADDR for the
    # group it meant to form: the collection would silently run as one process.
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ValueError, match=r"accelerate launch` was asked for several processes.*torchrun"):
        collect(bidirectional_model, tokenizer, tmp_path / "run")
    assert not (tmp_path / "run" / "shards").exists()  # refused before any decoding


# --- nothing lost, nothing silent --------------------------------------------------------------------------


def _count_generations(monkeypatch, model) -> list[int]:
    calls: list[int] = []
    real = type(model).diffusion_generate

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "diffusion_generate", counted)
    return calls


def test_damaged_shards_are_decoded_again(tmp_path, tokenizer, bidirectional_model, monkeypatch, caplog):
    import pyarrow as pa

    out = tmp_path / "run"
    reference = collect(bidirectional_model, tokenizer, out)
    shards = sorted((out / "shards").glob("*.parquet"))
    assert len(shards) == 3  # 8 prompts in batches of 3
    first = pq.read_table(shards[0])
    pq.write_table(first.drop_columns(["decode_step"]), shards[0])  # a column lost
    second = pq.read_table(shards[1])
    foreign = pa.array(["zzz"] + second.column("id").to_pylist()[1:])
    pq.write_table(second.set_column(0, "id", foreign), shards[1])  # a row of another collection
    third = pq.read_table(shards[2]).to_pylist()
    third[0]["decode_step"] = [99] * len(third[0]["decode_step"])  # a row breaking the contract
    pq.write_table(pa.Table.from_pylist(third, schema=pq.read_schema(shards[2])), shards[2])

    calls = _count_generations(monkeypatch, bidirectional_model)
    with caplog.at_level(logging.WARNING):
        rerun = collect(bidirectional_model, tokenizer, out)
    assert len(calls) == 3  # each damaged shard was decoded again, none dropped
    assert rerun.to_list() == reference.to_list()
    for shard, problem in zip(shards, ["lacks column(s) ['decode_step']", "'zzz'", "decode_step[0]=99"]):
        assert f"shard {shard} fails validation" in caplog.text and problem in caplog.text
    assert collection_summary(out) == f"8 prompts, 8 trajectories saved to {out}, none dropped"
    assert not list(out.glob("cache-*.arrow"))


def test_a_freshly_decoded_shard_that_fails_validation_stops_the_run(
    tmp_path, tokenizer, bidirectional_model, monkeypatch
):
    import t3d_trl.data.trajectories as trajectories

    real = trajectories._generate_batch

    def broken_sampler(*args, **kwargs):
        rows = real(*args, **kwargs)
        rows[0]["decode_step"] = [0] * len(rows[0]["decode_step"])
        return rows

    monkeypatch.setattr(trajectories, "_generate_batch", broken_sampler)
    with pytest.raises(RuntimeError, match=r"shard .*batch-000000\.parquet \(batch 0\) fails validation"):
        collect(bidirectional_model, tokenizer, tmp_path)
    assert not list((tmp_path / "shards").iterdir())  # nothing written, nothing merged


def test_over_long_prompts_are_dropped_and_counted(tmp_path, tokenizer):
    lengths = {
        p: len(tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"])
        for p in PROBLEMS
    }
    longest = max(lengths.values())
    # The longest prompt no longer fits the model's positions with 8 new tokens; max_prompt_length drops "1+1"'s
    # longer neighbours too.
    model = build_bidirectional_model(tokenizer, max_position_embeddings=longest + 8 - 1)
    limit = sorted(lengths.values())[-3]
    dataset = collect(model, tokenizer, tmp_path, max_prompt_length=limit)
    too_long = [p for p in PROBLEMS if limit < lengths[p] < longest]
    no_room = [p for p in PROBLEMS if lengths[p] == longest]
    assert too_long and no_room
    assert dataset["problem"] == [p for p in PROBLEMS if lengths[p] <= limit]
    assert collection_summary(tmp_path) == (
        f"8 prompts, {len(dataset)} trajectories saved to {tmp_path}, {len(too_long) + len(no_room)} dropped: "
        f"{len(no_room)} prompt + max_new_tokens=8 beyond the model's max_position_embeddings={longest + 7}; "
        f"{len(too_long)} prompt longer than max_prompt_length={limit}"
    )


def test_the_teacher_is_checked_before_decoding(tmp_path, tokenizer, monkeypatch):
    from transformers import Qwen3ForCausalLM

    small = build_bidirectional_model(tokenizer, vocab_size=22)  # ids of the 100-token tokenizer overflow it
    calls = _count_generations(monkeypatch, small)
    with pytest.raises(
        ValueError, match=f"tokenizer .* has {len(tokenizer)} tokens but the model .* vocabulary of 22"
    ):
        collect(small, tokenizer, tmp_path / "a")
    plain = Qwen3ForCausalLM(qwen3_config(tokenizer))  # no diffusion description: the trainer's message
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM has no mask token .*AutoModelForDiffusionLM"):
        collect(plain, tokenizer, tmp_path / "b")
    short = build_bidirectional_model(tokenizer, max_position_embeddings=8)
    with pytest.raises(ValueError, match="max_new_tokens=8 leaves no room for a prompt"):
        collect(short, tokenizer, tmp_path / "c")
    assert not calls and not any((tmp_path / name).exists() for name in "abc")


def test_a_hub_teachers_commit_is_recorded(tmp_path, tokenizer, bidirectional_model, monkeypatch):
    # transformers 5 no longer sets config._commit_hash: the commit is read from the cached snapshot, for a branch
    # given as revision too; a local folder records none.
    teacher = tmp_path / "teacher"
    bidirectional_model.save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    main_commit, v1_commit = "a" * 40, "b" * 40
    build_hub_cache(
        tmp_path, monkeypatch, "me/teacher", {"main": (main_commit, teacher), "v1": (v1_commit, teacher)}
    )
    rows = ROWS[:2]
    for revision, expected in ((None, main_commit), ("v1", v1_commit), (v1_commit, v1_commit)):
        out = tmp_path / f"run-{revision}"
        dataset = collect("me/teacher", None, out, rows=rows, teacher_revision=revision)
        assert TrajectoryMetadata.from_dataset(dataset).teacher_revision == expected
    local = collect(str(teacher), None, tmp_path / "local", rows=rows)
    assert TrajectoryMetadata.from_dataset(local).teacher_revision is None
    # A collection recorded before commits were resolved (a branch name, or none) still resumes.
    for recorded in (None, "v1"):
        manifest = json.loads((tmp_path / "run-v1" / "collection.json").read_text())
        manifest["metadata"]["teacher_revision"] = recorded
        (tmp_path / "run-v1" / "collection.json").write_text(json.dumps(manifest))
        assert len(collect("me/teacher", None, tmp_path / "run-v1", rows=rows, teacher_revision="v1")) == 2


def test_a_push_to_a_bare_repo_name_names_the_namespaced_repo(
    tmp_path, tokenizer, bidirectional_model, monkeypatch
):
    # The Hub puts "traj" into the token owner's namespace: the card and the URL name "me/traj".
    from huggingface_hub import DatasetCard, HfApi
    from huggingface_hub.hf_api import RepoUrl

    dataset = collect(bidirectional_model, tokenizer, tmp_path / "run", rows=ROWS[:2])
    pushed = {}
    monkeypatch.setattr(
        HfApi,
        "create_repo",
        lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/datasets/me/{repo_id.split('/')[-1]}"),
    )
    monkeypatch.setattr(
        datasets.Dataset, "push_to_hub", lambda self, repo_id, **kw: pushed.update(data=repo_id)
    )
    monkeypatch.setattr(DatasetCard, "load", classmethod(lambda cls, repo_id, **kw: cls("---\n---\n")))
    monkeypatch.setattr(
        DatasetCard, "push_to_hub", lambda self, repo_id, **kw: pushed.update(card=repo_id, text=str(self))
    )
    url = push_trajectories_to_hub(dataset, "traj")
    assert url == "https://huggingface.co/datasets/me/traj"
    assert pushed["data"] == pushed["card"] == "me/traj"
    assert 'load_trajectories("me/traj")' in pushed["text"]  # the usage snippet
