"""bench/experiments/journey_files without a coverage build: which files count as entered per step (lines
that ran more often in the longer run, not merely ran) and how they are grouped (where a reader follows the
tensor, headers apart, leaf libraries apart)."""
from bench.experiments import journey_files


def test_a_file_is_entered_per_step_only_when_a_line_ran_once_more_per_extra_step_and_rank():
    short = {"sync/engine/engine.cc": {10: 6, 11: 0}, "sync/engine/engine_state.cc": {5: 1},
             "base/config.cc": {3: 40}, "sync/engine/stall_inspector.cc": {4: 2}}
    long = {"sync/engine/engine.cc": {10: 12, 11: 0}, "sync/engine/engine_state.cc": {5: 1},
            "base/config.cc": {3: 40}, "sync/route/sparse.cc": {7: 6}, "sync/engine/stall_inspector.cc": {4: 5}}
    # engine_state.cc and config.cc ran in both runs alike (set-up); sparse.cc only in the longer one, 6 more
    # times (3 extra steps, 2 ranks); the stall inspector 3 more times: by the clock, not every step.
    assert journey_files.grown(short, long, at_least=6) == ["sync/engine/engine.cc", "sync/route/sparse.cc"]


def test_files_are_grouped_by_where_a_reader_follows_the_tensor():
    groups = journey_files.classify(["python/gradex/torch/hook.py", "plugins/torch/ops.cc", "capi/gradex.cc",
                                     "sync/route/sparse.cc", "sync/route/route.h", "comm/collectives/allgatherv.cc",
                                     "comm/ucx/ucx_requests.cc", "compress/dgc/select.cc", "base/half.h"])
    assert groups == {
        "orchestration": ["python/gradex/torch/hook.py", "plugins/torch/ops.cc", "capi/gradex.cc",
                          "sync/route/sparse.cc", "comm/collectives/allgatherv.cc"],
        "orchestration headers": ["sync/route/route.h"],
        "leaf libraries": ["comm/ucx/ucx_requests.cc", "compress/dgc/select.cc"],
        "leaf headers": ["base/half.h"],
    }
