"""Tables and plots rendered from a grid's results."""

from __future__ import annotations

import pytest

from t3d_trl.evaluation.report import (
    accuracy_table,
    efficiency_table,
    pass_at_k_table,
    plot_accuracy_vs_tokps,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def entry(model, benchmark, block, tokps=1, threshold=None, accuracy=0.5, std=0.0, **extra):
    label = f"block{block}-threshold{threshold:g}" if threshold else f"block{block}-tokps{tokps}"
    metrics = {
        "accuracy": accuracy,
        "accuracy_std": std,
        "tokens_per_second": 100.0 * (1 + accuracy),
        "latency_per_sample": 0.25,
        "mean_nfe": 12.0,
        "mean_output_length": 24.0,
        "tokens_per_step": 2.0,
        **extra,
    }
    setting = {"block_length": block, "tokens_per_step": tokps, "threshold": threshold, "label": label}
    return {"model": model, "benchmark": benchmark, "setting": setting, "metrics": metrics}


def rows_of(table: str, title: str) -> dict[str, list[str]]:
    """The rows of the section ``title`` of a Markdown report, by first cell (the header under "Method")."""
    section = table.split(f"### {title}\n\n")[1].split("\n\n")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()]
    return {row[0]: row[1:] for row in rows if not row[0].startswith("---")}


@pytest.fixture
def results():
    out = []
    for block in (4, 8):
        for bench, base in (("MATH500", 0.40), ("GSM8K", 0.60)):
            out.append(entry("original", bench, block, tokps=2, accuracy=base))
            out.append(entry("t3d", bench, block, tokps=2, accuracy=base + 0.2, std=0.01))
            out.append(entry("original", bench, block, tokps=4, accuracy=base / 2))
    out.append(entry("original", "GSM8K", 4, threshold=0.9, accuracy=0.5))
    out.append(entry("t3d", "GSM8K", 4, threshold=0.9, accuracy=0.75))
    return out


def test_accuracy_table_has_the_papers_layout(results):
    table = accuracy_table(results)
    titles = [line[4:] for line in table.splitlines() if line.startswith("### ")]
    assert titles == ["TokPS = 2", "TokPS = 4", "Dynamic decoding, threshold 0.9"]
    rows = rows_of(table, "TokPS = 2")
    assert rows["Method"] == [
        "MATH500 (B=4)",
        "GSM8K (B=4)",
        "MATH500 (B=8)",
        "GSM8K (B=8)",
        "AVG",
        "Gain (%)",
    ]
    assert rows["original"] == ["40.00", "60.00", "40.00", "60.00", "50.00", "-"]
    assert rows["t3d"] == ["60.00 ± 1.00", "80.00 ± 1.00", "60.00 ± 1.00", "80.00 ± 1.00", "70.00", "+40.00"]
    assert "t3d" not in rows_of(table, "TokPS = 4")  # no run: no row
    dynamic = rows_of(table, "Dynamic decoding, threshold 0.9")
    assert dynamic["Method"] == ["GSM8K (B=4)", "AVG", "Gain (%)"]
    assert dynamic["t3d"] == ["75.00", "75.00", "+50.00"]


def test_missing_cells_and_empty_results(results):
    partial = [e for e in results if not (e["model"] == "t3d" and e["benchmark"] == "GSM8K")]
    rows = rows_of(accuracy_table(partial), "TokPS = 2")
    assert rows["t3d"][:4] == ["60.00 ± 1.00", "–", "60.00 ± 1.00", "–"]
    assert rows["t3d"][4] == "60.00"  # the mean of the cells present
    # Gain over the cells both models have (MATH500: 60 against 40), not 60 against the original's 50.
    assert rows["t3d"][5] == "+50.00"
    # A section without the baseline (the first model) says so, rather than measuring against the next model.
    others = [
        e for e in results if e["model"] != "original" or e["setting"]["label"] != "block4-threshold0.9"
    ]
    others.append(entry("dparallel", "GSM8K", 4, threshold=0.9, accuracy=0.55))
    table = accuracy_table(others)
    dynamic = rows_of(table, "Dynamic decoding, threshold 0.9")
    assert dynamic["t3d"][-1] == dynamic["dparallel"][-1] == "-"
    assert "No Gain: the baseline, original, has no run here." in table.split("threshold 0.9")[1]
    with pytest.raises(ValueError, match="no results"):
        accuracy_table([])


def test_efficiency_and_pass_at_k_tables(results):
    lines = efficiency_table(results).splitlines()
    assert lines[0].split("|")[1:-1] == [
        " Setting ",
        " Benchmark ",
        " Method ",
        " TPS ",
        " Latency (s) ",
        " Avg steps ",
        " Avg length ",
        " Tokens/step ",
        " Acc (%) ",
    ]
    assert len(lines) == 2 + len(results)
    assert "| block4-threshold0.9 | GSM8K | t3d | 175.00 | 0.250 | 12.00 | 24.00 | 2.00 | 75.00 |" in lines
    assert pass_at_k_table(results) is None
    sampled = [entry("t3d", "MATH500", 4, tokps=2, **{"pass@1": 0.5, "pass@1_std": 0.0, "pass@4": 0.75})]
    assert pass_at_k_table(sampled).splitlines()[2] == "| block4-tokps2 | MATH500 | t3d | 50.00 | 75.00 |"


def test_write_report_writes_table_and_plots(results, tmp_path):
    written = write_report(results, tmp_path / "report")
    assert set(written) == {"table", "accuracy_vs_tokps", "accuracy_vs_throughput"}
    assert written["table"].read_text().startswith("# Evaluation results")
    assert accuracy_table(results) in written["table"].read_text()
    for kind in ("accuracy_vs_tokps", "accuracy_vs_throughput"):
        assert written[kind].read_bytes()[:8] == PNG_SIGNATURE
    dynamic_only = [e for e in results if e["setting"]["threshold"] is not None]
    assert plot_accuracy_vs_tokps(dynamic_only, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
