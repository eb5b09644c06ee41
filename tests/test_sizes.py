"""as_sizes: every accepted form, and every refusal naming the value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fitbatch
from fitbatch import as_sizes


@pytest.mark.parametrize("raw", [
    [3, 1, 2], (3, 1, 2), np.array([3, 1, 2], dtype=np.int32), np.array([3.0, 1.0, 2.0]),
    torch.tensor([3, 1, 2]), {2: 2, 0: 3, 1: 1}, {np.int64(0): 3, np.int64(1): 1, np.int64(2): 2},
])
def test_one_dimensional_forms(raw):
    s = as_sizes(raw)
    assert s.values.dtype == np.float64 and s.values.tolist() == [3.0, 1.0, 2.0]
    assert len(s) == 3 and s.ndim == 1 and s.integral
    assert s.real_units().tolist() == [3.0, 1.0, 2.0]


def test_callable_with_n():
    s = as_sizes(lambda i: 10 * i, n=3)
    assert s.values.tolist() == [0.0, 10.0, 20.0]
    assert len(as_sizes(lambda i: 1, n=0)) == 0


def test_integral_flag():
    assert not as_sizes([1.5, 2.0]).integral
    assert as_sizes([1.0, 2.0]).integral
    assert as_sizes(np.array([1, 2], dtype=np.uint8)).integral


def test_two_dimensional():
    s = as_sizes([[2, 3], [4, 5]])
    assert s.ndim == 2 and len(s) == 2
    assert s.real_units().tolist() == [6.0, 20.0]
    assert as_sizes(torch.ones(4, 3)).ndim == 3


def test_sizes_pass_through():
    s = as_sizes([1, 2])
    assert as_sizes(s) is s


def test_values_are_contiguous_copies():
    raw = np.arange(10.0)[::2]
    s = as_sizes(raw)
    assert s.values.flags.c_contiguous
    assert s.values.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("raw, shown", [
    ([1, -2], "index 1 (size -2.0)"), ([np.nan, 1], "index 0 (size nan)"), ([1, 2, np.inf], "index 2 (size inf)"),
    ([[1, 2], [3, -1]], "index 1"), ([[1, np.nan]], "index 0"),
])
def test_bad_values_are_listed(raw, shown):
    with pytest.raises(ValueError, match="non-negative and finite") as err:
        as_sizes(raw)
    assert shown in str(err.value)


def test_many_bad_values_are_counted():
    with pytest.raises(ValueError, match="8 bad values") as err:
        as_sizes([-1] * 8)
    assert "and 3 more" in str(err.value)


@pytest.mark.parametrize("raw", [np.ones((2, 2, 2)), np.float64(3.0), 5, np.zeros((3, 0))])
def test_bad_shapes(raw):
    with pytest.raises(ValueError, match="shape"):
        as_sizes(raw)


@pytest.mark.parametrize("raw, match", [
    ("123", "numbers"), (b"12", "numbers"), ([True, False], "booleans"), ([1 + 2j], "complex"),
    (["a", "b"], "numeric"), ([[1, 2], [3]], "numeric"), ({"a": 1}, "int keys"), ({True: 1}, "int keys"),
])
def test_wrong_types(raw, match):
    with pytest.raises(TypeError, match=match):
        as_sizes(raw)


BIG = 2**53 + 1  # the smallest integer float64 cannot hold


@pytest.mark.parametrize("raw, index, value", [
    ([BIG, 1], 0, BIG),                                            # Python ints (int64 array)
    (np.array([1, BIG], dtype=np.int64), 1, BIG),
    (np.array([1, 2**63 + 5], dtype=np.uint64), 1, 2**63 + 5),    # uint64 above 2**63, as ...
    ([1, 2**63 + 5], 1, 2**63 + 5),                                 # ... Python ints that large
    ([1, 2**64], 1, 2**64),                                         # beyond any integer dtype
    ([0.5, BIG], 1, BIG),                                           # an int rounded among floats
    ([[1, 2], [3, BIG]], 1, BIG),                                   # (N, D): the row
    ({0: 1, 1: BIG}, 1, BIG),
    (torch.tensor([1, BIG]), 1, BIG),
])
def test_integer_sizes_above_2_53_are_refused_naming_index_and_value(raw, index, value):
    with pytest.raises(ValueError, match=rf"integer sizes must be at most 2\*\*53 = 9007199254740992 .* "
                                         rf"1 bad value: index {index} \(size {value}\)\. Count in a coarser unit"):
        as_sizes(raw)


def test_integers_up_to_2_53_and_large_floats_are_kept():
    assert as_sizes([2**53, 1]).values.tolist() == [2.0**53, 1.0]
    assert as_sizes(np.array([2**53], dtype=np.uint64)).integral
    assert as_sizes([2.0**60, 0.5]).values[0] == 2.0**60  # a float is what it is: nothing rounded
    with pytest.raises(ValueError, match=r"index 0 \(size 9007199254740993\)"):  # was: one batch of [2**53+1, 1]
        fitbatch.plan_batches([BIG, 1], BIG, cost="sum")


def test_mapping_keys_must_be_zero_to_n():
    with pytest.raises(ValueError, match=r"missing \[1\]"):
        as_sizes({0: 1, 2: 3})
    with pytest.raises(ValueError, match=r"exactly 0\.\.2; missing \[0\]"):
        as_sizes({1: 2, 2: 3, 3: 4})


def test_callable_needs_n():
    with pytest.raises(TypeError, match="pass n"):
        as_sizes(lambda i: i)
    with pytest.raises(ValueError, match="n"):
        as_sizes(lambda i: i, n=-1)
    with pytest.raises(TypeError, match="n"):
        as_sizes(lambda i: i, n=2.0)


def test_n_must_match():
    with pytest.raises(ValueError, match="n=3 but sizes hold 2"):
        as_sizes([1, 2], n=3)
    assert len(as_sizes([1, 2], n=2)) == 2


def test_public_sizes_type():
    assert isinstance(as_sizes([1]), fitbatch.Sizes)


def test_a_list_column_is_named_as_such():
    """A column of token lists: the message said numpy's "truth value of an array is ambiguous"."""
    pa = pytest.importorskip("pyarrow")
    from fitbatch.sizes import from_array

    with pytest.raises(ValueError, match=r"column 'input_ids' row 0: a list .*take the lengths"):
        from_array(pa.array([[1, 2, 3], [4, 5]]), name="input_ids")
