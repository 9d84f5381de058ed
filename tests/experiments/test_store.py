"""A results file's records as types: read and written back in the file's own order, refused in one line where a
record has the wrong shape."""

import json

import pytest

from attnlab.errors import UserError
from attnlab.lab.store import Record, Results, RunKey
from attnlab.lab.sweeps import SharedRate


def test_a_record_splits_into_its_parts_and_writes_back_in_its_own_order():
    flat = {"params": 10, "steps": 4, "stopped_early": False, "best_step": None, "val_loss": 1.5, "val_ppl": 4.5,
            "val_tokens": 99, "ablated_ppl": 5.0, "tokens to 2.0": None, "seconds": 1.0, "trained": True,
            "run": "runs/a", "config": "f", "measured": ["val_ppl", [1], []]}
    record = Record.from_json(flat)
    assert record.values == {"val_ppl": 4.5, "ablated_ppl": 5.0, "tokens to 2.0": None}
    assert record.details == {"val_loss": 1.5, "val_tokens": 99}  # the val_ppl metric's, as it declares them
    assert record.extent == {"steps": 4, "stopped_early": False, "best_step": None}
    assert (record.fingerprint, record.params, record.run, record.ablated()) == ("f", 10, "runs/a", True)
    assert list(record.to_json().items()) == list(flat.items())
    shuffled = dict(reversed(flat.items()))  # a file written by hand, in another order, keeps its order
    assert list(Record.from_json(shuffled).to_json()) == list(shuffled)
    moved = record.replace(run="../b/runs/a", seconds=0.0)  # a field changed keeps its place
    assert list(moved.to_json()) == list(flat) and moved.to_json()["run"] == "../b/runs/a"


@pytest.mark.parametrize("record, said", [
    ({"val_ppl": "abc"}, "'val_ppl' is 'abc', not a number"),
    (5, "is not an object of named values (int)"),
    ([1, 2], "is not an object of named values (list)"),
])
def test_a_record_of_the_wrong_shape_is_refused_naming_the_file_and_the_run(tmp_path, record, said):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"suite": "toy", "runs": {"lm/gla/0": record}}))
    with pytest.raises(UserError) as refused:
        Results.load(path)
    assert str(refused.value).startswith(f"{path}: the record lm/gla/0") and said in str(refused.value)


def test_results_keep_their_records_typed_by_key():
    results = Results({"suite": "toy", "runs": {"lm/gla/0": {"val_ppl": 5.0}, "lm/gla/lr=0.001": {"val_ppl": 6.0}}})
    assert results.by_seed("lm", "gla", "val_ppl") == {0: 5.0}  # seeds only: a sweep's point is not a seed
    assert results.get(RunKey("lm", "gla", lr=1e-3)).values == {"val_ppl": 6.0}


def decision(lr: float) -> SharedRate:
    return SharedRate({"gla": lr}, {"gla": 0.1}, {"gla": {f"{lr:g}": 2.0}})


def test_a_decision_another_process_saved_meanwhile_survives_this_ones_save(tmp_path):
    """Two processes of one suite (other --only experiments) share its results.json: each saves what it decides
    under the file's lock, keeping what the other saved since it loaded the file, and its own copy of an older
    decision does not replace the other's newer one."""
    path = tmp_path / "results.json"
    Results({"suite": "toy", "runs": {}, "shared_rates": {"a": decision(1e-3).to_json()}}).write(path)
    mine, theirs = Results.load(path), Results.load(path)
    theirs.save_record(path, RunKey("b", "gla", seed=0), Record.from_json({"val_ppl": 6.0}))
    theirs.save_shared_rates(path, {"a": decision(2e-3), "b": decision(4e-3)})  # a: its sweep trained again
    mine.save_shared_rates(path, {"c": decision(8e-3)})
    expected = {"a": decision(2e-3), "b": decision(4e-3), "c": decision(8e-3)}
    assert Results.load(path).shared_rates == mine.shared_rates == expected
    assert RunKey("b", "gla", seed=0) in Results.load(path) and RunKey("b", "gla", seed=0) in mine
