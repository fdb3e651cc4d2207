"""The batch state machine (wal/states.py, FORMAT.md "States"), exhaustively: every pair of
(current, wanted) states, absent included, is either an edge or an IllegalTransition.
"""

from __future__ import annotations

import itertools
import pickle

import pytest

from wal.errors import IllegalTransition, WalError
from wal.states import ABSENT, TRANSITIONS, WHY_ILLEGAL, BatchState, check_transition

pytestmark = pytest.mark.unit

S = BatchState
FROM = [ABSENT, *BatchState]
TO = list(BatchState)

# The machine as FORMAT.md draws it, written out independently of wal/states.py.
EXPECTED_EDGES = {
    (ABSENT, S.STAGED), (ABSENT, S.SEALED), (ABSENT, S.DISCARDED),
    (S.STAGED, S.SEALED), (S.STAGED, S.DISCARDED),
    (S.SEALED, S.FLUSHING),
    (S.FLUSHING, S.FLUSHING), (S.FLUSHING, S.FLUSHED),
    (S.DISCARDED, S.STAGED), (S.DISCARDED, S.SEALED), (S.DISCARDED, S.DISCARDED),
}
ALL_PAIRS = list(itertools.product(FROM, TO))
NON_EDGES = [p for p in ALL_PAIRS if p not in EXPECTED_EDGES]


def _name(pair) -> str:
    cur, want = pair
    return f"{cur.value if cur else 'absent'}->{want.value}"


def test_transitions_table_has_a_row_for_absent_and_every_state():
    assert set(TRANSITIONS) == set(FROM)


def test_transitions_table_is_exactly_the_documented_machine():
    table = {(cur, want) for cur, wants in TRANSITIONS.items() for want in wants}
    assert table == EXPECTED_EDGES


@pytest.mark.parametrize("pair", sorted(EXPECTED_EDGES, key=_name), ids=_name)
def test_every_edge_is_allowed(pair):
    cur, want = pair
    assert check_transition(42, cur, want) is None


@pytest.mark.parametrize("pair", NON_EDGES, ids=_name)
def test_every_non_edge_raises_illegal_transition_naming_batch_and_states(pair):
    cur, want = pair
    with pytest.raises(IllegalTransition) as exc:
        check_transition(42, cur, want)
    err = exc.value
    assert isinstance(err, WalError)
    assert err.batch == 42
    assert err.current == (cur.value if cur else None)
    assert err.wanted == want.value
    text = str(err)
    assert "batch 42" in text
    assert f"{cur.value if cur else 'absent'} -> {want.value}" in text


def test_there_are_thirty_pairs_and_eleven_edges():
    assert len(ALL_PAIRS) == 6 * 5
    assert len(NON_EDGES) == 30 - 11


def test_flushed_is_terminal():
    assert TRANSITIONS[S.FLUSHED] == frozenset()


@pytest.mark.parametrize("cur", [S.SEALED, S.FLUSHING, S.FLUSHED], ids=str)
def test_committed_batch_is_never_discarded_and_says_why(cur):
    with pytest.raises(IllegalTransition, match="committed") as exc:
        check_transition(7, cur, S.DISCARDED)
    assert exc.value.why == WHY_ILLEGAL[(cur, S.DISCARDED)]


@pytest.mark.parametrize("cur", [S.SEALED, S.FLUSHING, S.FLUSHED], ids=str)
def test_sealed_batch_cannot_be_sealed_again_and_says_why(cur):
    with pytest.raises(IllegalTransition, match="final"):
        check_transition(7, cur, S.SEALED)


def test_flush_cannot_end_before_it_begins():
    with pytest.raises(IllegalTransition, match="flush must begin"):
        check_transition(7, S.SEALED, S.FLUSHED)


def test_reasons_are_given_only_for_non_edges():
    assert not set(WHY_ILLEGAL) & EXPECTED_EDGES


def test_illegal_transition_from_absent_says_absent():
    with pytest.raises(IllegalTransition) as exc:
        check_transition(3, ABSENT, S.FLUSHING)
    assert exc.value.current is None
    assert str(exc.value) == "batch 3: illegal transition absent -> flushing"


def test_illegal_transition_survives_pickling():
    with pytest.raises(IllegalTransition) as exc:
        check_transition(9, S.FLUSHED, S.DISCARDED)
    back = pickle.loads(pickle.dumps(exc.value))
    assert type(back) is IllegalTransition
    assert (back.batch, back.current, back.wanted, back.why) == \
        (9, "flushed", "discarded", exc.value.why)
    assert str(back) == str(exc.value)


def test_state_values_are_the_strings_stored_in_the_log():
    assert [s.value for s in BatchState] == ["staged", "sealed", "flushing", "flushed",
                                             "discarded"]
    assert str(S.FLUSHING) == "flushing"
    assert BatchState("sealed") is S.SEALED
