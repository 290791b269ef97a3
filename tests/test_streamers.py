"""Tests of the step streamers (``diffusion_generate(..., streamer=...)``)."""

from __future__ import annotations

import io
import os
import threading

import pytest
import torch
from testing_utils import build_bidirectional_model, build_block_causal_model, build_modernbert_model

from t3d_trl import DiffusionIteratorStreamer, DiffusionStreamer, TerminalStreamer
from t3d_trl.demo.quickstart import PACKAGED_TEACHERS
from t3d_trl.generation.streamers import MASK_GLYPH, _terminal_rows, token_pieces, token_separator

PROMPTS = ["hi", "hello there", "a much longer prompt!"]


class Recorder(DiffusionStreamer):
    def __init__(self):
        self.steps = []
        self.ended = 0

    def put(self, step):
        self.steps.append(step)

    def end(self):
        self.ended += 1


# (model kind, settings): every family, cache mode and decoding rule.
CASES = [
    ("bidirectional", {"cache_implementation": None}),
    ("bidirectional", {"cache_implementation": "prefix"}),
    ("bidirectional", {"cache_implementation": "dual"}),
    ("block_causal", {"use_cache": True}),
    ("block_causal", {"use_cache": False}),
    ("bidirectional", {"cfg_scale": 1.0}),  # classifier-free guidance: two rows per row, one NFE
    ("modernbert", {}),
]
BUILDERS = {
    "bidirectional": build_bidirectional_model,
    "block_causal": build_block_causal_model,
    "modernbert": build_modernbert_model,
}


@pytest.mark.parametrize(("kind", "settings"), CASES, ids=lambda v: v if isinstance(v, str) else str(v))
@pytest.mark.parametrize("rule", [{"tokens_per_step": 2}, {"threshold": 0.3}], ids=["static", "dynamic"])
def test_streamer_sees_every_pass_and_changes_nothing(tokenizer, kind, settings, rule):
    model = BUILDERS[kind](tokenizer)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    kwargs = dict(
        max_new_tokens=12, block_length=4, stop_at_eos=False, return_dict_in_generate=True, **settings, **rule
    )
    plain = model.diffusion_generate(batch.input_ids, batch.attention_mask, **kwargs)
    recorder = Recorder()
    streamed = model.diffusion_generate(batch.input_ids, batch.attention_mask, streamer=recorder, **kwargs)

    assert torch.equal(plain.sequences, streamed.sequences)
    assert torch.equal(plain.decode_steps, streamed.decode_steps)
    assert torch.equal(plain.nfe, streamed.nfe)
    assert recorder.ended == 1
    steps = recorder.steps
    # One put per forward pass: each pass counts for the rows it ran (at least one), up to the output's NFE.
    nfe = torch.stack([torch.zeros_like(plain.nfe)] + [step.nfe for step in steps])
    increments = nfe.diff(dim=0)
    assert ((increments == 0) | (increments == 1)).all() and increments.any(-1).all()
    assert torch.equal(steps[-1].nfe, plain.nfe)
    mask_id = model.diffusion_config.mask_token_id
    generated = plain.sequences[:, -12:]
    seen = torch.zeros_like(generated, dtype=torch.bool)
    for previous, step in zip([None, *steps], steps):
        # Each pass commits only masked positions, of its own block, with the decode step the output records.
        assert not (step.committed & seen).any()
        assert torch.equal(step.masked, step.tokens == mask_id)
        assert torch.equal(step.masked, ~(seen | step.committed))
        committed_steps = step.step.unsqueeze(1).expand_as(generated)[step.committed]
        assert torch.equal(plain.decode_steps[step.committed], committed_steps)
        assert torch.equal(step.tokens[~step.masked], generated[~step.masked])
        if previous is not None:
            assert step.block >= previous.block
        seen |= step.committed
    assert seen.all() and not steps[-1].masked.any()


def test_streamer_of_a_row_finished_early_matches_its_output(tokenizer):
    # stop_at_eos: rows stop counting NFE once finished; the streamed NFE still ends at the output's.
    model = build_bidirectional_model(tokenizer)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    first = model.diffusion_generate(batch.input_ids, batch.attention_mask, max_new_tokens=8, block_length=4)
    eos = int(first[0, -8])
    recorder = Recorder()
    out = model.diffusion_generate(
        batch.input_ids,
        batch.attention_mask,
        max_new_tokens=8,
        block_length=4,
        eos_token_id=eos,  # the first row's first token: it finishes within its first block
        return_dict_in_generate=True,
        streamer=recorder,
    )
    assert torch.equal(recorder.steps[-1].nfe, out.nfe)
    assert int(out.nfe[0]) <= 4 and len(recorder.steps) == int(out.nfe.max()) < 8


def test_iterator_streamer_hands_the_steps_to_another_thread(tokenizer):
    model = build_block_causal_model(tokenizer)
    ids = tokenizer(["hello"], return_tensors="pt").input_ids
    streamer = DiffusionIteratorStreamer(timeout=60)
    result = {}

    def run():
        result["out"] = model.diffusion_generate(
            ids, max_new_tokens=8, block_length=4, return_dict_in_generate=True, streamer=streamer
        )

    thread = threading.Thread(target=run)
    thread.start()
    steps = list(streamer)
    thread.join()
    assert len(steps) == int(result["out"].nfe[0]) and steps[-1].nfe.tolist() == result["out"].nfe.tolist()


def test_iterator_streamer_ends_when_generation_fails(tokenizer):
    # Otherwise the consumer of a failed generation would wait forever (the default timeout is None).
    model = build_block_causal_model(tokenizer)
    streamer = DiffusionIteratorStreamer(timeout=30)  # without the end, queue.Empty after 30 s (not a hang)
    errors = []

    def run():
        try:
            model.diffusion_generate(
                tokenizer(["hi"], return_tensors="pt").input_ids,
                max_new_tokens=10,
                block_length=4,
                streamer=streamer,
            )
        except ValueError as err:
            errors.append(str(err))

    thread = threading.Thread(target=run)
    thread.start()
    assert list(streamer) == []
    thread.join()
    assert errors == ["max_new_tokens=10 is not a multiple of block_length=4"]


def test_transformers_streamers_and_other_objects_are_refused(tokenizer):
    from transformers import TextStreamer

    model = build_bidirectional_model(tokenizer)
    prompt = tokenizer(["hi"], return_tensors="pt").input_ids
    for streamer in (TextStreamer(tokenizer), object()):
        with pytest.raises(
            TypeError, match="streamer must be a DiffusionStreamer .* got (TextStreamer|object)"
        ):
            model.diffusion_generate(prompt, max_new_tokens=4, block_length=4, streamer=streamer)


def test_one_streamer_sees_every_batch_of_a_job_and_ends_once(tokenizer, monkeypatch):
    # generate_completions decodes in batches; the streamer sees them all, then ends once (a consumer iterating
    # over it used to stop after the first batch), and its own time is not decoding time.
    import time

    from t3d_trl.evaluation.completions import generate_completions

    clock = {"offset": 0.0}
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + clock["offset"])

    class Slow(Recorder):
        def put(self, step):
            clock["offset"] += 1000.0  # a streamer that takes 1000 s a step (drawing, a full queue)
            super().put(step)

    model = build_bidirectional_model(tokenizer)
    config = {"max_new_tokens": 8, "block_length": 4, "tokens_per_step": 1}
    messages = ["abc", "hello", "hi"]
    streamer = Slow()
    out = generate_completions(
        model,
        tokenizer,
        messages,
        config,
        use_chat_template=False,
        batch_size=1,
        progress=False,
        streamer=streamer,
    )
    assert len(streamer.steps) == sum(out.nfe) > 8 and streamer.ended == 1
    assert out.seconds < 1000  # the streamer's time is left out of the decoding time
    iterator = DiffusionIteratorStreamer(timeout=60)
    thread = threading.Thread(
        target=generate_completions,
        args=(model, tokenizer, messages, config),
        kwargs={"use_chat_template": False, "batch_size": 1, "progress": False, "streamer": iterator},
    )
    thread.start()
    assert len(list(iterator)) == sum(out.nfe)
    thread.join()
    assert iterator.queue.empty()


def test_token_pieces_separator_follows_the_tokenizer(tokenizer):
    from transformers import AutoTokenizer

    ids = tokenizer("ab")["input_ids"]
    assert token_pieces(tokenizer, ids) == ["a", "b"]
    assert token_separator(tokenizer) == ""  # character level: pieces concatenate
    words = AutoTokenizer.from_pretrained(PACKAGED_TEACHERS / "sort2")
    assert token_pieces(words, words("a b")["input_ids"]) == ["a", "b"]
    assert token_separator(words) == " "  # word level: the decoder joins tokens with spaces


def test_a_character_split_over_byte_level_tokens_shows_whole():
    """Byte-level tokenizers (Qwen's, SDAR's, Dream's) split non-ASCII characters over tokens that decode to
    U+FFFD one by one: the token completing the character shows it, and a mask between the parts keeps them
    apart (the character is not complete on the canvas yet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))} | {"[MASK]": len(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    bytes_level = PreTrainedTokenizerFast(tokenizer_object=backend, mask_token="[MASK]")
    text = "π ≈ 3.14 café"
    ids = bytes_level(text)["input_ids"]
    assert len(ids) == len(text.encode()) > len(text)  # one token per byte
    pieces = token_pieces(bytes_level, ids)
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert pieces[:2] == ["", "π"] and pieces[-2:] == ["", "é"]
    masked = [*ids[:-1], bytes_level.mask_token_id]
    assert token_pieces(bytes_level, masked)[-2:] == ["\ufffd", "[MASK]"]
    assert token_pieces(bytes_level, [ids[0], bytes_level.mask_token_id, ids[1]])[::2] == ["\ufffd"] * 2


def _steps(tokenizer, **kwargs):
    model = build_bidirectional_model(tokenizer)
    ids = tokenizer(["hello"], return_tensors="pt").input_ids
    recorder = Recorder()
    out = model.diffusion_generate(
        ids, max_new_tokens=8, block_length=4, stop_at_eos=False, streamer=recorder, **kwargs
    )
    return recorder.steps, tokenizer.decode(out[0, -8:])


def test_terminal_streamer_logs_one_canvas_per_step_without_a_terminal(tokenizer):
    steps, text = _steps(tokenizer, tokens_per_step=2)
    stream = io.StringIO()
    streamer = TerminalStreamer(tokenizer, stream=stream)  # StringIO is no terminal: no redraw, no colour
    for step in steps:
        streamer.put(step)
    streamer.end()
    lines = stream.getvalue().splitlines()
    assert "\x1b" not in stream.getvalue()
    canvases, statuses = lines[0::2], lines[1::2]
    assert len(canvases) == len(steps) == 4
    assert canvases[0].count(MASK_GLYPH) == 6 and canvases[-1] == text
    assert statuses[-1] == "block 2 | step 4 | nfe 4"


def test_terminal_streamer_redraws_in_place_with_the_new_tokens_highlighted(tokenizer):
    steps, text = _steps(tokenizer, tokens_per_step=4)
    stream = io.StringIO()
    streamer = TerminalStreamer(tokenizer, stream=stream, redraw=True, color=True)
    streamer.put(steps[0])
    first = stream.getvalue()
    assert first.count("\x1b[1;7m") == 4  # the four tokens of the first pass, highlighted
    assert first.count(MASK_GLYPH) == 4 and "\x1b[A" not in first
    streamer.put(steps[1])
    second = stream.getvalue()[len(first) :]
    assert second.startswith("\x1b[1A\r\x1b[J")  # back over the two rows drawn, cleared
    assert second.count("\x1b[1;7m") == 4 and MASK_GLYPH not in second
    streamer.end()
    assert stream.getvalue().endswith("\n")


def test_terminal_streamer_measures_the_terminal_it_draws_on(tokenizer, monkeypatch):
    # `generate --show_steps > answer.txt`: standard output is a file, the canvas goes to a terminal of its own
    # width; moving up by standard output's width would erase earlier output or leave stale canvases.
    import fcntl
    import struct
    import termios

    monkeypatch.setenv("COLUMNS", "5")  # what standard output (not a terminal here) reports
    steps, _ = _steps(tokenizer, tokens_per_step=4)
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    with os.fdopen(follower, "w") as terminal:
        streamer = TerminalStreamer(tokenizer, stream=terminal, redraw=True, color=False)
        written = []
        monkeypatch.setattr(terminal, "write", written.append, raising=False)
        for step in steps[:2]:
            streamer.put(step)
    os.close(leader)
    assert len(streamer.render(steps[0]).split("\n")[0]) > 5  # wraps at 5 columns, not at 200
    assert written[1].startswith("\x1b[1A\r")  # one canvas row and the status row: back up one


def test_terminal_rows_count_wide_characters_twice():
    # A Chinese or Japanese answer fills a terminal row in half as many characters; counting characters would
    # move the redraw up too few rows and leave stale canvases behind.
    assert _terminal_rows("数学题答案是", 10) == 2  # six wide characters: 12 columns
    assert _terminal_rows("\x1b[1;7mabcdef\x1b[0m", 10) == 1  # escapes take no column
    assert _terminal_rows("e\u0301" * 10, 10) == 1  # a combining accent takes none either
    assert _terminal_rows("ab\n" + "x" * 21, 10) == 4


def test_generate_show_steps_draws_every_pass_then_the_totals(capsys):
    from t3d_trl.cli.main import main
    from t3d_trl.evaluation.completions import generate_completions
    from t3d_trl.evaluation.runner import load_model

    path = str(PACKAGED_TEACHERS / "sort2")
    prompt = "h c a f b e d g ="
    assert (
        main(["generate", "--model", path, "--prompt", prompt, "--tokens_per_step", "2", "--show_steps"]) == 0
    )
    captured = capsys.readouterr()
    model, tokenizer = load_model(path, device="cpu")
    config = model.diffusion_generation_config.update(tokens_per_step=2)
    expected = generate_completions(model, tokenizer, [prompt], config, progress=False)
    assert captured.out == expected.completions[0] + "\n"
    lines = captured.err.splitlines()
    statuses = [i for i, line in enumerate(lines) if line.startswith("block ")]
    assert len(statuses) == expected.nfe[0] == 4 and lines[statuses[-1]] == "block 1 | step 4 | nfe 4"
    canvases = [lines[i - 1] for i in statuses]
    assert canvases[0].count(MASK_GLYPH) == 6 and canvases[-1] == expected.completions[0]
    assert lines[-1].startswith(f"nfe=4 tokens={expected.num_tokens[0]} tokens/step=2.00 finished=")
    # --verbose with it adds no second statistics line.
    assert main(["generate", "--model", path, "--prompt", prompt, "--show_steps", "--verbose"]) == 0
    stats = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nfe=")]
    assert len(stats) == 1 and stats[0].startswith("nfe=8 tokens=8 tokens/step=1.00 finished=False")
