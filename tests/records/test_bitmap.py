from hypothesis import given
from hypothesis import strategies as st

import pytest

from forge.records import IndexBitmap


@given(st.sets(st.integers(0, 5000)))
def test_bitmap_behaves_like_a_set(values):
    bm = IndexBitmap()
    for v in values:
        assert bm.add(v)
        assert not bm.add(v)
    assert len(bm) == len(values)
    assert list(bm) == sorted(values)
    assert bm.max() == max(values, default=-1)
    assert all(v in bm for v in values) and 5001 not in bm and -1 not in bm
    assert list(bm.missing_below(50)) == [i for i in range(50) if i not in values]


def test_negative_index_is_refused():
    with pytest.raises(ValueError):
        IndexBitmap().add(-1)


def test_ten_million_indices_fit_in_about_a_megabyte():
    bm = IndexBitmap()
    bm.add(9_999_999)
    assert len(bm._bits) <= 1_250_000 * 2


@given(st.sets(st.integers(0, 3000)), st.sets(st.integers(0, 3000)))
def test_difference_matches_set_difference(a, b):
    d = IndexBitmap(a).difference(IndexBitmap(b))
    assert list(d) == sorted(a - b) and len(d) == len(a - b)
