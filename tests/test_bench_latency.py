"""``bench latency``: prompts of the asked lengths, never alike; the table's medians and ratios;
the command line's servers. Nothing here measures speed."""

from __future__ import annotations

import argparse

import pytest

from vllm_mlx_trio.bench.ceiling.run import path_name
from vllm_mlx_trio.bench.latency.arrival import (
    ArrivalWorkload,
    _piece_tokens,
    arrival_row,
    gaps,
    median_arrival_rows,
    pieces_of,
)
from vllm_mlx_trio.bench.latency.command import (
    _with_port,
    arrival_from_args,
    interval_notes,
    parse_checkout_variant,
    parse_variant,
    servers_from_args,
    workload_from_args,
)
from vllm_mlx_trio.bench.latency.prompts import PromptMaker
from vllm_mlx_trio.bench.latency.run import (
    QUICK,
    STREAMED_CEILING,
    IntervalTarget,
    LatencyWorkload,
    chunks_per_token,
    lanes,
    median_rows,
    paired_ratio,
    step_ms,
)
from vllm_mlx_trio.bench.stats import RequestTrace, percentile
from vllm_mlx_trio.cli import _parser


def _count_words(text: str) -> int:
    return 10 + 2 * len(text.split())  # a template of 10 tokens, 2 tokens per word


def test_prompts_have_the_lengths_and_are_all_different():
    maker = PromptMaker(_count_words)
    prompts = maker.batch("r0", (50, 500, 2000), 6)
    lengths = [_count_words(p) for p in prompts]
    for got, want in zip(lengths, (50, 500, 2000) * 2, strict=True):
        assert 0.95 * want <= got <= want
    assert len({p.split()[0] for p in prompts}) == 6  # a unique tag first
    assert len({tuple(p.split()[1:4]) for p in prompts}) == 6  # bodies from different places


def _row(path, conc, rep, ttft):
    return {
        "path": path,
        "conc": conc,
        "rep": rep,
        "reqs": 5,
        "prompt_tok": 50,
        "tok_per_req": "16",
        "ttft_p50_ms": ttft,
        "ttft_p95_ms": ttft,
        "itl_p50_ms": 1.0,
        "itl_p95_ms": 2.0,
        "agg_tok_s": 10.0,
    }


def test_median_rows_give_median_spread_and_ratio_to_the_best_peer():
    rows = [_row("ours", 5, r, t) for r, t in enumerate((100.0, 300.0, 200.0))]
    rows += [_row("mlx-lm", 5, r, t) for r, t in enumerate((400.0, 500.0, 450.0))]
    rows += [_row("vllm-mlx", 5, r, t) for r, t in enumerate((800.0, 900.0, 700.0))]
    table = {r["path"]: r for r in median_rows(rows)}
    assert table["ours"]["ttft_p50_ms"] == "200.0 (100.0-300.0)" and table["ours"]["tok_per_req"] == "16"
    assert table["ours"]["ttft_vs_best_peer"] == round(200 / 450, 2)
    assert table["mlx-lm"]["ttft_vs_best_peer"] == round(450 / 800, 2)


def _args(**kw):
    base = {
        "quick": False,
        "levels": None,
        "lengths": None,
        "max_tokens": None,
        "repetitions": None,
        "intervals": None,
        "peers": "ours,mlx-lm",
        "variant": [],
        "vllm_mlx": None,
    }
    return argparse.Namespace(**{**base, **kw})


def test_workload_presets_and_overrides():
    assert workload_from_args(_args(quick=True)) == QUICK
    full = workload_from_args(_args(levels=(1, 2), max_tokens=7))
    assert (full.levels, full.lengths, full.max_tokens, full.repetitions) == ((1, 2), (50, 500, 2000), 7, 3)


def test_variants_are_our_server_with_settings_on_their_own_ports():
    assert parse_variant("b64:engine.a=1, engine.b=2") == ("ours-b64", ["engine.a=1", "engine.b=2"])
    with pytest.raises(ValueError):
        parse_variant("nosettings")
    servers, notes = servers_from_args(_args(variant=["b64:engine.max_num_batched_tokens=64"]), "/m")
    assert [s.name for s in servers] == ["ours", "mlx-lm", "ours-b64"] and notes == []
    variant = _with_port(servers[2], 9001)
    assert "server.port=9001" in variant.argv and "engine.max_num_batched_tokens=64" in variant.argv
    mlx = _with_port(servers[1], 9002).argv
    assert mlx[mlx.index("--port") + 1] == "9002"


def test_a_missing_peer_is_left_out_with_a_note():
    servers, notes = servers_from_args(_args(peers="ours,vllm-mlx", vllm_mlx="/nonexistent/vllm-mlx"), "/m")
    assert [s.name for s in servers] == ["ours"] and "vllm-mlx left out" in notes[0]


def test_arrival_gaps_after_settling_and_those_overlapping_the_window():
    pieces = [(t, 1.0) for t in (0.0, 1.0, 2.0, 6.0, 7.0)]
    assert gaps(pieces, after=1) == [(1.0, 1.0), (4.0, 1.0), (1.0, 1.0)]
    # the window 2.5..3.0 lies inside the frozen gap 2..6: that gap is the one counted
    assert gaps(pieces, window=(2.5, 3.0)) == [(4.0, 1.0)]
    assert [g for g, _ in gaps(pieces, window=(0.5, 6.5))] == [1.0, 1.0, 4.0, 1.0]


def test_a_piece_of_several_tokens_counts_as_that_many_tokens_at_its_pace():
    """Run-ahead sends 4 tokens in one chunk 8 ms after the last: 4 tokens 2 ms apart, not one 8 ms gap."""
    pieces = [(0.0, 1.0), (0.008, 4.0), (0.016, 4.0), (0.019, 1.0)]
    assert [g for g, _ in gaps(pieces)] == pytest.approx([0.002, 0.002, 0.003])
    assert [n for _, n in gaps(pieces)] == [4.0, 4.0, 1.0]
    row = arrival_row(
        "ours",
        0,
        {"gaps": gaps(pieces)},
        {"gaps": gaps(pieces), "longest_s": 0.008, "long_ttft_s": 1.0, "streams_outlasted": True},
    )
    assert row["alone_itl_p50_ms"] == 2.0 and row["alone_gaps"] == 9 and row["arrival_itl_max_ms"] == 8.0


def test_tokens_per_piece_come_from_logprobs_or_the_streams_mean_share():
    with_logprobs = {"choices": [{"delta": {"content": "ab"}, "logprobs": {"content": [{}, {}, {}]}}]}
    assert _piece_tokens(with_logprobs) == 3
    assert _piece_tokens({"choices": [{"delta": {"content": "ab"}}]}) is None
    assert pieces_of([1.0, 2.0], [3, None], 10) == [(1.0, 3.0), (2.0, 5.0)]
    assert pieces_of([1.0, 2.0], [None, None], None) == [(1.0, 1.0), (2.0, 1.0)]


def test_arrival_rows_give_the_ratio_and_medians_per_server():
    alone = {"gaps": [(0.010, 1.0)] * 20}
    during = {
        "gaps": [(0.010, 1.0)] * 18 + [(0.050, 1.0)] * 2,
        "longest_s": 0.050,
        "long_ttft_s": 1.5,
        "streams_outlasted": True,
    }
    row = arrival_row("ours", 0, alone, during)
    assert row["alone_itl_p50_ms"] == 10.0 and row["long_ttft_ms"] == 1500.0 and row["arrival_itl_max_ms"] == 50.0
    values, weights = [g for g, _ in during["gaps"]], [n for _, n in during["gaps"]]
    assert row["p95_over_alone_p50"] == round(percentile(values, 95, weights) / 0.010, 2)
    assert row["alone_p95_over_p50"] == 1.0  # every alone gap is 10 ms
    assert row["p95_over_alone_p95"] == row["p95_over_alone_p50"]  # so its p95 is its p50
    rows = [{**row, "rep": r, "long_ttft_ms": t} for r, t in enumerate((1000.0, 3000.0, 2000.0))]
    (table,) = median_arrival_rows(rows)
    assert table["long_ttft_ms"] == "2000.0 (1000.0-3000.0)" and table["outlasted"] == 3


def test_long_arrival_takes_the_streams_tokens_and_the_long_prompts_length():
    work = arrival_from_args(_args(max_tokens=64, lengths=(3000,), repetitions=2))
    assert (work.stream_max_tokens, work.long_tokens, work.repetitions, work.streams) == (64, 3000, 2, 4)
    assert arrival_from_args(_args()) == ArrivalWorkload()


def test_the_ceiling_row_gives_every_row_its_ratio_and_is_no_peer():
    rows = [{**_row("ours", 1, r, 20.0), "agg_tok_s": tok} for r, tok in enumerate((400.0, 450.0, 500.0))]
    rows += [{**_row("mlx-lm", 1, r, 10.0), "agg_tok_s": 300.0} for r in range(3)]
    rows += [{**_row(path_name(1), 1, r, 5.0), "agg_tok_s": 600.0} for r in range(3)]
    table = {r["path"]: r for r in median_rows(rows)}
    assert table["ours"]["vs_ceiling"] == round(450 / 600, 2) and table["mlx-lm"]["vs_ceiling"] == 0.5
    assert table["ours"]["paired_vs_ceiling"] == 0.75 and table[path_name(1)]["paired_vs_ceiling"] == 1.0
    assert table["ours"]["ttft_vs_best_peer"] == 2.0  # against mlx-lm, not the ceiling
    assert table[path_name(1)]["ttft_vs_best_peer"] is None


def test_the_streamed_ceiling_is_divided_by_the_raw_loop_and_is_no_peer():
    rows = [{**_row("ours", 1, r, 20.0), "agg_tok_s": 450.0} for r in range(3)]
    rows += [{**_row(STREAMED_CEILING, 1, r, 5.0), "agg_tok_s": 540.0} for r in range(3)]
    rows += [{**_row(path_name(1), 1, r, 5.0), "agg_tok_s": 600.0} for r in range(3)]
    table = {r["path"]: r for r in median_rows(rows)}
    assert table[STREAMED_CEILING]["paired_vs_ceiling"] == 0.9
    assert table["ours"]["ttft_vs_best_peer"] is None  # no server but ours: the loops are no peers
    servers, _notes = servers_from_args(_args(peers="ours,ceiling-sse"), "/m")
    assert [s.name for s in servers] == ["ours"]


def test_each_level_is_divided_by_the_raw_loop_at_its_own_level():
    """Level 16's rows go over mlx-lm's BatchGenerator at 16, never over generate_step at 1."""
    rows = [
        {**_row("ours", level, r, 20.0), "agg_tok_s": tok}
        for r in range(3)
        for level, tok in ((1, 450.0), (16, 2700.0))
    ]
    rows += [{**_row(path_name(1), 1, r, 5.0), "agg_tok_s": 600.0} for r in range(3)]
    rows += [{**_row(path_name(16), 16, r, 40.0), "agg_tok_s": 3000.0} for r in range(3)]
    table = {(r["path"], r["conc"]): r for r in median_rows(rows)}
    assert table[("ours", 16)]["vs_ceiling"] == 0.9 and table[("ours", 16)]["paired_vs_ceiling"] == 0.9
    assert table[("ours", 1)]["vs_ceiling"] == 0.75
    assert table[(path_name(16), 16)]["ttft_vs_best_peer"] is None  # the raw loop is no peer


def test_the_paired_ratio_is_taken_within_each_repetition():
    """The machine slows between repetitions: the ratio of medians says 0.3 (180 / 600), each repetition 0.9."""
    ceiling = [(0, 1000.0), (2, 200.0)]
    ours = [(0, 900.0), (1, 180.0), (2, 180.0)]  # rep 1 has no ceiling: it is left out
    rows = [{**_row(path_name(1), 1, r, 5.0), "agg_tok_s": tok} for r, tok in ceiling]
    rows += [{**_row("ours", 1, r, 20.0), "agg_tok_s": tok} for r, tok in ours]
    assert paired_ratio(rows, "ours", path_name(1), 1) == 0.9
    assert paired_ratio(rows, "ours", path_name(1), 5) is None


def test_a_variant_from_another_checkout_runs_our_server_from_there():
    assert parse_checkout_variant("base@/tmp/old:") == ("ours-base", "/tmp/old", [])
    assert parse_checkout_variant("b@/x:engine.a=1") == ("ours-b", "/x", ["engine.a=1"])
    with pytest.raises(ValueError):
        parse_variant("base@/tmp/old:")  # parse_variant takes settings only
    servers, _notes = servers_from_args(_args(peers="ours,ceiling", variant=["base@/tmp/old:"]), "/m")
    assert [s.name for s in servers] == ["ours", "ours-base"]  # the ceiling is no server
    assert servers[1].env["PYTHONPATH"] == "/tmp/old" and servers[0].env["PYTHONPATH"] != "/tmp/old"


@pytest.mark.parametrize("variant", ["latency", "prefix"])
def test_a_variant_runs_its_own_checkout_when_started_from_inside_another(tmp_path, variant):
    """``--variant NAME@CHECKOUT`` from inside a checkout (the usual place to run the bench): the variant's server
    imports the other checkout's package, not the one in the current directory (``python -m`` would put the
    current directory first on ``sys.path``)."""
    import os
    import subprocess

    from vllm_mlx_trio.bench.latency.run import ours_variant
    from vllm_mlx_trio.bench.prefix_cache.vs_mlx_lm import _peer

    for name in ("here", "there"):
        package = tmp_path / name / "vllm_mlx_trio"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "cli.py").write_text(f"print({name!r})\n")
    there = str(tmp_path / "there")
    if variant == "latency":
        peer = ours_variant("ours-there", [], "demo:tiny", 8000, checkout=there)
    else:
        peer = _peer("there", "demo:tiny", 8000, str(tmp_path), {"there": there})
    ran = subprocess.run(
        peer.argv,
        cwd=tmp_path / "here",
        env={**os.environ, **peer.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert ran.stdout.strip() == "there"


def test_the_target_ratio_is_the_alone_tail_times_what_the_arrival_adds():
    alone = {"gaps": [(0.010, 1.0)] * 10 + [(0.030, 1.0)] * 10}
    during = {
        "gaps": [(0.020, 1.0)] * 10 + [(0.040, 1.0)] * 10,
        "longest_s": 0.04,
        "long_ttft_s": 1.0,
        "streams_outlasted": True,
    }
    row = arrival_row("ours", 0, alone, during)

    def itl(gap_list, q):
        return percentile([g for g, _ in gap_list], q, [n for _, n in gap_list])

    assert row["alone_p95_over_p50"] == round(itl(alone["gaps"], 95) / itl(alone["gaps"], 50), 2)
    assert row["p95_over_alone_p95"] == round(itl(during["gaps"], 95) / itl(alone["gaps"], 95), 2)
    assert row["alone_p95_over_p50"] * row["p95_over_alone_p95"] == pytest.approx(row["p95_over_alone_p50"], rel=0.02)
    assert row["alone_p95_over_p50"] > 1.0 and row["p95_over_alone_p95"] > 1.0


def _trace(chunk_sizes, completion_tokens=None):
    """A streamed request as the bench traces it: one arrival per content chunk, each with the mean share."""
    tokens = sum(chunk_sizes) if completion_tokens is None else completion_tokens
    share = tokens / len(chunk_sizes) if chunk_sizes else 0.0
    return RequestTrace(
        start=0.0, arrivals=tuple((0.01 * (i + 1), share) for i in range(len(chunk_sizes))), completion_tokens=tokens
    )


def test_chunks_per_token_counts_the_content_pieces_over_the_completion_tokens():
    assert chunks_per_token([_trace([1] * 16)]) == 1.0  # stream_interval 1: a chunk per token
    # stream_interval 4: the first token alone, then chunks of 4, the last whatever is left
    assert chunks_per_token([_trace([1, 4, 4, 4, 3])]) == round(5 / 16, 3)
    # over the level's requests: all their chunks over all their tokens, not a mean of ratios
    assert chunks_per_token([_trace([1] * 4), _trace([1, 4, 4, 4, 3])]) == round(9 / 20, 3)
    assert chunks_per_token([_trace([])]) is None and chunks_per_token([]) is None


def test_chunks_per_token_is_a_median_with_its_spread_and_the_ceiling_has_none():
    rows = [{**_row("ours-si4", 1, r, 20.0), "chunks_per_token": c} for r, c in enumerate((0.312, 0.3, 0.25))]
    rows += [{**_row("ours-si1", 1, r, 20.0), "chunks_per_token": 1.0} for r in range(3)]
    rows += [_row(path_name(1), 1, r, 5.0) for r in range(3)]  # summarize() sets no chunks_per_token
    table = {r["path"]: r for r in median_rows(rows)}
    assert table["ours-si4"]["chunks_per_token"] == "0.30 (0.25-0.31)" and table["ours-si4"]["_chunks_per_token"] == 0.3
    assert table["ours-si1"]["chunks_per_token"] == "1.00 (1.00-1.00)"
    assert table[path_name(1)]["chunks_per_token"] is None
    assert table["ours-si4"]["ttft_vs_best_peer"] is None  # an interval row of ours is no peer


def test_step_ms_is_the_ceilings_itl_p50_at_one_stream():
    rows = [
        {**_row(path_name(1), 1, r, 5.0), "itl_p50_ms": itl, "agg_tok_s": 400.0} for r, itl in enumerate((2.0, 2.4))
    ]
    rows += [_row("ours", 1, r, 20.0) for r in range(2)]
    step = step_ms(median_rows(rows))
    assert step == {"itl_p50_ms": 2.2, "from_tok_s": 2.5}
    assert step_ms(median_rows(rows[2:])) is None  # no ceiling
    assert any(n.startswith("step_ms 2.2:") for n in interval_notes(QUICK, step))
    assert not any(n.startswith("step_ms") for n in interval_notes(QUICK, None))


def _target(url):
    from vllm_mlx_trio.bench.http import HttpTarget

    return HttpTarget(base_url=url, model="m", send_ignore_eos=True)


def test_intervals_give_our_servers_one_lane_each_and_send_the_field():
    targets = {"ours": _target("http://a"), "mlx-lm": _target("http://b"), "ours-b64": _target("http://c")}
    assert [(lane.label, lane.target) for lane in lanes(targets, ())] == list(targets.items())
    got = lanes(targets, (1, 4))
    assert [lane.label for lane in got] == ["ours-si1", "ours-si4", "mlx-lm", "ours-b64-si1", "ours-b64-si4"]
    by_label = {lane.label: lane.target for lane in got}
    body = by_label["ours-si4"].body("hi", 8)
    assert body["stream_interval"] == 4 and body["ignore_eos"] is True and body["max_tokens"] == 8
    assert by_label["ours-si4"].base_url == "http://a" and by_label["ours-b64-si1"].base_url == "http://c"
    assert "stream_interval" not in by_label["mlx-lm"].body("hi", 8)  # the peers get none
    assert by_label["ours-si1"].count_sources is not by_label["ours-si4"].count_sources
    assert isinstance(by_label["ours-si1"], IntervalTarget)


def test_intervals_parse_from_the_command_line_into_the_workload():
    def parse(*extra):
        return _parser().parse_args(["bench", "latency", *extra])

    assert parse().intervals is None
    assert workload_from_args(parse()).intervals == () == LatencyWorkload().intervals  # today's run: none sent
    assert parse("--intervals", "1,4").intervals == (1, 4)
    assert parse("--intervals", "4,1,4").intervals == (4, 1)  # repeats dropped, order kept
    work = workload_from_args(parse("--quick", "--intervals", "1,4"))
    assert work.intervals == (1, 4) and work.levels == QUICK.levels
    for bad in ("0", "1,x", ""):
        with pytest.raises(SystemExit):
            parse("--intervals", bad)
