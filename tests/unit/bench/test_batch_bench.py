"""``baton bench batch``'s own arithmetic: the batch file it sends, the lines check and the derived
figures against their targets."""

from __future__ import annotations

import orjson

from baton.bench.batch import BatchBenchConfig, derive, line_file, lines_check


def test_the_batch_file_is_one_unique_non_streamed_chat_request_a_line() -> None:
    content, ids = line_file(BatchBenchConfig(model="m", line_max_tokens=7), 5, "t")
    rows = [orjson.loads(x) for x in content.splitlines()]
    assert [r["custom_id"] for r in rows] == ids == [f"t-{i}" for i in range(5)]
    assert {r["url"] for r in rows} == {"/v1/chat/completions"}
    assert all("stream" not in r["body"] and r["body"]["max_tokens"] == 7 and r["body"]["model"] == "m"
               for r in rows)
    assert len({r["body"]["messages"][0]["content"] for r in rows}) == 5  # no prefix cache hides a line


def test_lines_lost_and_duplicated_are_counted_from_both_files() -> None:
    assert lines_check(["a", "b", "c"], ["a", "b"], ["c"]) == {
        "input": 3, "output": 2, "errors": 1, "lost": 0, "duplicated": 0, "ids_equal": True}
    bad = lines_check(["a", "b", "c"], ["a", "a"], ["b"])
    assert (bad["lost"], bad["duplicated"], bad["ids_equal"]) == (1, 1, False)


def test_derived_figures_hold_each_target() -> None:
    out = {"alone": {"ttft_ms": {"p99": 100.0}}, "beside": {"interactive": {"ttft_ms": {"p99": 112.0}},
                                                             "batch": {"within_window": True}},
           "saturation": {"requests_per_s": 10.0}, "batch_alone": {"lines_per_s": 8.5},
           "kill": {"lost": 0, "duplicated": 0, "usage_equals_completed": True}}
    d = derive(out)
    assert round(d["ttft_p99_ratio"], 2) == 1.12 and d["ttft_p99_ratio_met"] is False
    assert round(d["slack_use"], 2) == 0.85 and d["slack_use_met"] is True
    assert d["kill_met"] is True and d["batch_within_window"] is True
    out["kill"]["usage_equals_completed"] = False  # a line metered twice (or not at all)
    assert derive(out)["kill_met"] is False
