"""Orpheus code layouts (codecd.families.orpheus): round trips, known examples, every error path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codecd.families.layout import LayoutError

BASE = 128266


def test_known_group_to_levels(layouts):
    """One group [c0, c1a, c2a, c2b, c1b, c2c, c2d] splits into levels [c0], [c1a, c1b], [c2a, c2b, c2c, c2d]."""
    l0, l1, l2 = layouts.orpheus_to_levels([0, 10, 20, 21, 11, 22, 23])
    assert l0.tolist() == [0] and l1.tolist() == [10, 11] and l2.tolist() == [20, 21, 22, 23]
    assert all(l.dtype == np.int32 for l in (l0, l1, l2))


def test_known_two_groups(layouts):
    """Two groups keep time order within each level."""
    codes = [1, 2, 3, 4, 5, 6, 7, 101, 102, 103, 104, 105, 106, 107]
    l0, l1, l2 = layouts.orpheus_to_levels(codes)
    assert l0.tolist() == [1, 101]
    assert l1.tolist() == [2, 5, 102, 105]
    assert l2.tolist() == [3, 4, 6, 7, 103, 104, 106, 107]
    assert layouts.levels_to_orpheus([l0, l1, l2]).tolist() == codes


def test_levels_round_trip_random(layouts):
    """levels_to_orpheus inverts orpheus_to_levels and back, for random codes of many lengths."""
    rng = np.random.default_rng(0)
    for k in (0, 1, 2, 7, 50):
        codes = rng.integers(0, 4096, size=7 * k)
        levels = layouts.orpheus_to_levels(codes)
        assert [l.size for l in levels] == [k, 2 * k, 4 * k]
        flat = layouts.levels_to_orpheus(levels)
        assert flat.dtype == np.int32 and np.array_equal(flat, codes)
        again = layouts.orpheus_to_levels(flat)
        assert all(np.array_equal(a, b) for a, b in zip(levels, again))


def test_known_ids(layouts):
    """Token ids map to codes by id - 128266 - (i % 7) * 4096, and back."""
    ids = [BASE + p * 4096 + c for p, c in enumerate([5, 6, 7, 8, 9, 10, 11])] + [BASE + 4095]
    ids += [BASE + (p + 1) * 4096 for p in range(6)]
    codes = layouts.orpheus_ids_to_codes(ids)
    assert codes.tolist() == [5, 6, 7, 8, 9, 10, 11, 4095, 0, 0, 0, 0, 0, 0]
    assert codes.dtype == np.int32
    assert layouts.codes_to_orpheus_ids(codes).tolist() == ids


def test_ids_round_trip_random(layouts):
    """codes_to_orpheus_ids and orpheus_ids_to_codes are inverses."""
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 4096, size=7 * 30)
    ids = layouts.codes_to_orpheus_ids(codes)
    assert ids.min() >= BASE and ids.max() < BASE + 7 * 4096
    assert np.array_equal(layouts.orpheus_ids_to_codes(ids), codes)


def test_ids_with_start_offset(layouts):
    """start= gives the position of ids[0] in the audio token stream (chunks that begin mid-group)."""
    codes = np.arange(14) * 100
    ids = layouts.codes_to_orpheus_ids(codes)
    assert np.array_equal(layouts.orpheus_ids_to_codes(ids[3:], start=3), codes[3:])
    assert np.array_equal(layouts.codes_to_orpheus_ids(codes[3:], start=3), ids[3:])


def test_id_out_of_range_for_its_position(layouts):
    """An id valid for another position (or outside all) raises LayoutRangeError with index and value."""
    ids = layouts.codes_to_orpheus_ids(np.zeros(7, dtype=int)).tolist()
    ids[2] = BASE + 5          # a position-0 id at position 2
    with pytest.raises(layouts.LayoutRangeError) as ei:
        layouts.orpheus_ids_to_codes(ids)
    assert ei.value.index == 2 and ei.value.value == BASE + 5
    assert "position 2" in str(ei.value) and str(BASE + 2 * 4096) in str(ei.value)
    for bad in (BASE - 1, BASE + 7 * 4096, 0, -5):
        ids2 = list(ids)
        ids2[2] = bad
        with pytest.raises(layouts.LayoutRangeError):
            layouts.orpheus_ids_to_codes(ids2)


def test_errors_are_value_errors(layouts):
    """Every layout error is a ValueError (like codecrt.InputError), so one except clause catches both."""
    assert issubclass(layouts.LayoutRangeError, layouts.LayoutError)
    assert issubclass(layouts.LayoutShapeError, layouts.LayoutError)
    assert issubclass(layouts.LayoutError, ValueError)


def test_code_out_of_range(layouts):
    """A code outside [0, 4096) raises LayoutRangeError in every direction."""
    with pytest.raises(layouts.LayoutRangeError) as ei:
        layouts.orpheus_to_levels([0, 0, 0, 4096, 0, 0, 0])
    assert ei.value.index == 3 and ei.value.value == 4096
    with pytest.raises(layouts.LayoutRangeError):
        layouts.orpheus_to_levels([0, -1, 0, 0, 0, 0, 0])
    with pytest.raises(layouts.LayoutRangeError):
        layouts.levels_to_orpheus([[0], [0, 4096], [0, 0, 0, 0]])
    with pytest.raises(layouts.LayoutRangeError):
        layouts.codes_to_orpheus_ids([0, 5000])


def test_incomplete_trailing_group(layouts):
    """A trailing partial group is an error naming the count, unless drop_incomplete drops it."""
    codes = list(range(7)) + [1, 2, 3]
    with pytest.raises(layouts.LayoutShapeError, match="3 trailing"):
        layouts.orpheus_to_levels(codes)
    l0, l1, l2 = layouts.orpheus_to_levels(codes, drop_incomplete=True)
    assert l0.tolist() == [0] and l2.size == 4
    ids = layouts.codes_to_orpheus_ids(codes)
    with pytest.raises(layouts.LayoutShapeError, match="drop_incomplete"):
        layouts.orpheus_ids_to_codes(ids)
    assert layouts.orpheus_ids_to_codes(ids, drop_incomplete=True).tolist() == list(range(7))
    # a bad id inside the dropped tail does not matter once dropped
    ids[-1] = 0
    assert layouts.orpheus_ids_to_codes(ids, drop_incomplete=True).size == 7


def test_levels_of_inconsistent_length(layouts):
    """levels_to_orpheus rejects a wrong number of levels and lengths that break the 1:2:4 ratio."""
    with pytest.raises(layouts.LayoutShapeError, match="3 levels"):
        layouts.levels_to_orpheus([[0], [0, 0]])
    with pytest.raises(layouts.LayoutShapeError, match="level 2"):
        layouts.levels_to_orpheus([[0], [0, 0], [0, 0, 0]])
    with pytest.raises(layouts.LayoutShapeError, match="1-D"):
        layouts.levels_to_orpheus([[[0]], [0, 0], [0, 0, 0, 0]])


def test_non_integer_input(layouts):
    """Non-integral floats and non-numeric arrays raise LayoutError; integral floats are accepted."""
    with pytest.raises(layouts.LayoutError, match="integers"):
        layouts.orpheus_to_levels(np.full(7, 0.5))
    with pytest.raises(layouts.LayoutError):
        layouts.orpheus_to_levels(np.array(["a"] * 7))
    assert layouts.orpheus_to_levels(np.zeros(7, dtype=np.float32))[0].tolist() == [0]


def test_parse_integers_and_custom_tokens(layouts):
    """parse_tokens reads whitespace/comma separated integers and <custom_token_N> (as id N + 128256)."""
    vals, custom = layouts.parse_tokens("1, 2\n3\t4,5 ,6")
    assert vals.tolist() == [1, 2, 3, 4, 5, 6] and not custom
    vals, custom = layouts.parse_tokens("<custom_token_10><custom_token_4106> 128300")
    assert vals.tolist() == [BASE, BASE + 4096, 128300] and custom


def test_parse_orpheus_text_kinds(layouts):
    """parse_orpheus_text detects ids vs codes, and custom tokens decode to codes by position."""
    codes = np.array([1, 2, 3, 4, 5, 6, 7])
    ids = layouts.codes_to_orpheus_ids(codes)
    tokens = "".join(layouts.ids_to_custom_tokens(ids))
    assert tokens.startswith("<custom_token_11>")       # code 1 at position 0: N = 10 + 1
    assert layouts.parse_orpheus_text(tokens).tolist() == codes.tolist()
    assert layouts.parse_orpheus_text(" ".join(map(str, ids))).tolist() == codes.tolist()
    assert layouts.parse_orpheus_text("1 2 3 4 5 6 7").tolist() == codes.tolist()
    assert layouts.parse_orpheus_text(" ".join(map(str, ids)), kind="ids").tolist() == codes.tolist()
    with pytest.raises(layouts.LayoutRangeError):
        layouts.parse_orpheus_text("1 2 3 4 5 6 7", kind="ids")
    with pytest.raises(layouts.LayoutRangeError):
        layouts.parse_orpheus_text(" ".join(map(str, ids)), kind="codes")


def test_parse_errors(layouts):
    """Words, malformed tags, empty text, mixed ids/codes and partial groups are LayoutErrors."""
    with pytest.raises(layouts.LayoutError, match="'hello'"):
        layouts.parse_tokens("1 2 hello")
    with pytest.raises(layouts.LayoutError, match="custom_token_x"):
        layouts.parse_tokens("<custom_token_x>")
    with pytest.raises(layouts.LayoutShapeError, match="no tokens"):
        layouts.parse_orpheus_text("  \n ,")
    ids = layouts.codes_to_orpheus_ids(np.zeros(7, dtype=int))
    mixed = " ".join(map(str, ids[:6])) + " 3"
    with pytest.raises(layouts.LayoutRangeError):
        layouts.parse_orpheus_text(mixed)
    with pytest.raises(layouts.LayoutError, match="token ids"):
        layouts.parse_orpheus_text("<custom_token_10>", kind="codes")
    with pytest.raises(layouts.LayoutShapeError):
        layouts.parse_orpheus_text("1 2 3")
    assert layouts.parse_orpheus_text("1 2 3 4 5 6 7 8", drop_incomplete=True).size == 7
    with pytest.raises(ValueError):
        layouts.parse_orpheus_text("1", kind="tokens")


@pytest.mark.parametrize("module", ["layout", "orpheus", "chatterbox"])
def test_layouts_module_is_pure_numpy(module):
    """The layout modules import neither torch nor the native codecrt module: only the standard
    library's basics, numpy and each other."""
    import ast
    from pathlib import Path

    src = (Path(__file__).resolve().parents[2] / "daemon" / "codecd" / "families"
           / f"{module}.py").read_text()
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0] if node.level == 0 else "." + (node.module or ""))
    assert names <= {"__future__", "re", "typing", "numpy", "abc", "collections", "functools",
                     ".layout"}, names


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_orpheus_fast_path_equals_the_general_one(data):
    """The assembler's table path (a few tokens a message) and its general path give the
    same levels, partial group and errors for any message sizes, offsets and bad tokens."""
    from codecd.families import orpheus as O

    ids = data.draw(st.booleans())
    sizes = data.draw(st.sampled_from([[4096] * 3, [4000, 4096, 3000]]))
    fast, general = O._OrpheusAssembler(ids, sizes), O._OrpheusAssembler(ids, sizes)
    for _ in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.sampled_from([0, 1, 3, 6, 7, 8, 14, 60, 448, 449, 600]))
        pos = (fast.n_tokens + np.arange(n)) % 7
        codes = np.asarray(data.draw(st.lists(st.integers(0, 4095), min_size=n, max_size=n)),
                           dtype=np.int64)
        if n and data.draw(st.booleans()) and data.draw(st.booleans()):
            codes[data.draw(st.integers(0, n - 1))] = data.draw(
                st.sampled_from([-1, 3000, 3999, 4096, -(1 << 40)]))
        tokens = codes + (O._ID_OFFSET[pos] if ids else 0)
        outs = []
        for feed in (fast.feed, general._feed_general):
            try:
                outs.append(("ok", feed(tokens.copy())))
            except LayoutError as e:
                outs.append(("error", str(e)))
        (ka, ra), (kb, rb) = outs
        assert ka == kb
        if ka == "error":
            assert ra == rb
            return
        assert (ra is None) == (rb is None)
        if ra is not None:
            for x, y in zip(ra, rb):
                assert x.dtype == np.int32 and x.flags.c_contiguous and np.array_equal(x, y)
        assert np.array_equal(fast.partial, general.partial)
        assert fast.n_tokens == general.n_tokens
